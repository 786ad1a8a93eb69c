"""`pybatch dashboard`: serve the read-only web dashboard (the `dashboard` extra, Flask).

A non-loopback address needs `--allow-remote`: the dashboard has no authentication of its own
and belongs behind a reverse proxy that has (docs/operators.md, Dashboard).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

from pybatch._cli._connection import Commands, add_command, open_explorer
from pybatch.errors import CommandArgumentInvalid

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8150


def _port(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise CommandArgumentInvalid(argument="--port", expected="a TCP port from 1 to 65535")
    return int(text)


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only: localhost, 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # any other name may resolve anywhere
        return False


def register(commands: Commands) -> None:
    help_text = "serve the read-only web dashboard (needs the dashboard extra: Flask)"
    parser = add_command(commands, "dashboard", _dashboard, help=help_text, description=help_text)
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to bind ({DEFAULT_HOST}: this machine only)"
    )
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"TCP port ({DEFAULT_PORT})"
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host other than loopback; put authentication in front (reverse proxy)",
    )


def _dashboard(args: argparse.Namespace) -> int:
    if not is_loopback(args.host) and not args.allow_remote:
        raise CommandArgumentInvalid(
            argument="--host", expected="a loopback address unless --allow-remote is given"
        )
    try:
        from werkzeug.serving import make_server

        from pybatch._dashboard import create_app
    except ImportError:
        raise SystemExit(
            "pybatch dashboard: Flask is not installed; pip install 'pybatch[dashboard]'"
        ) from None
    with open_explorer(args) as explorer:  # an unreachable server is reported now, not per page
        server = make_server(args.host, args.port, create_app(explorer), threaded=True)
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"pybatch dashboard: serving on http://{host}:{server.server_port}/", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            print("pybatch dashboard: stopped", file=sys.stderr)
        finally:
            server.server_close()
    return 0
