"""Where a replica runs, as it tells `$SRV` discovery in its metadata: probes and
`runbus status` use it to speak of *this* pod or process rather than of any replica."""

import os
import socket
from typing import Final

HOST_METADATA: Final = "host"
"""Metadata key: the host (container, pod) a replica runs on."""
PID_METADATA: Final = "pid"
"""Metadata key: the replica's process id on that host."""


def instance_metadata() -> dict[str, str]:
    """This process's host and pid, as `$SRV` metadata."""
    return {HOST_METADATA: socket.gethostname(), PID_METADATA: str(os.getpid())}
