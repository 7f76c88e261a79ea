"""`runbus` subcommands, one module each. A module exposes `register(subparsers)`, which adds
its parser(s) and sets `handler` (an async function of settings and args returning an exit
code) as a default. `runbus.cli` registers every module in `MODULES`."""

MODULES = (
    "up",
    "serve",
    "http",
    "run",
    "chat",
    "demo",
    "status",
    "logs",
    "sessions",
    "runs",
    "usage",
    "approvals",
    "memory",
    "secrets",
)
