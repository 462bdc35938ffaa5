"""`zlayout serve`: the same app in a browser (textual-serve), for a shared screen on a call.

Each browser tab that connects gets its own `zlayout` process; nothing is shared between them.
textual-serve is a base dependency (sharing the screen on a call is a main use), imported only here.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from zlayout.cli import UsageError

def install_hint() -> str:
    """What to run when textual-serve is missing (an install made before it joined the base)."""
    from zlayout.install import pip_install_command

    return f"textual-serve is missing from this Python; reinstall zlayout: {pip_install_command()}"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="open the app in a browser (textual-serve)",
        description="Serve the zlayout app over HTTP: every browser tab runs its own app. "
                    "It listens on 127.0.0.1 by default; from a laptop, forward the port over SSH "
                    "(ssh -L 8000:localhost:8000 login-node) and open http://localhost:8000.")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: only this machine, or an SSH tunnel)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument("--public-url", default=None,
                        help="the URL browsers use, when it differs from http://HOST:PORT "
                             "(behind a proxy or a tunnel to another port)")
    parser.set_defaults(func=run)


def app_command() -> str:
    """The shell command each browser session runs: this Python's `python -m zlayout`."""
    return f"{shlex.quote(sys.executable)} -m zlayout"


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port: use 1-65535, e.g. --port 8000")
    try:
        from textual_serve.server import Server
    except ImportError:
        raise UsageError(install_hint()) from None
    server = Server(app_command(), host=args.host, port=args.port, title="zlayout",
                    public_url=args.public_url)
    print(f"zlayout: serving the app on http://{args.host}:{args.port} (ctrl+c stops it)",
          file=sys.stderr)
    if args.host in ("127.0.0.1", "localhost"):
        print(f"zlayout: from your laptop: ssh -L {args.port}:localhost:{args.port} THIS_HOST, "
              f"then open http://localhost:{args.port}", file=sys.stderr)
    server.serve()
    return 0
