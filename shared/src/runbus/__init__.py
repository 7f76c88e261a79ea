"""runbus: an AI-agent runtime built as separate services on a NATS bus.

This package is the code every service and every client shares: wire messages, subjects,
headers, bus helpers, telemetry, logging, settings, the client SDK and the CLI.
"""

__version__ = "0.1.0"
