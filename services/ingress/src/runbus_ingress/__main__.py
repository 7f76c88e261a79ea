"""`python -m runbus_ingress [--host H] [--port P]`: the HTTP ingress process."""

import argparse
import sys

import uvloop

from runbus.logs import configure_logging
from runbus.settings import SettingsError, load_settings

from .observe import log_to_file
from .server import serve


def main() -> None:
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"runbus http: bad setting {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    parser = argparse.ArgumentParser(prog="runbus http", description="the HTTP/SSE ingress")
    parser.add_argument("--host", default=settings.http_host)
    parser.add_argument("--port", type=int, default=settings.http_port)
    args = parser.parse_args()
    json_logs = {"auto": None, "json": True, "console": False}[settings.log_format]
    configure_logging(settings.log_level, json=json_logs)
    log_to_file(settings.data_path / "logs")
    uvloop.run(serve(settings, args.host, args.port))


main()
