"""`zlayout serve`: the same app in a browser (textual-serve), for a shared screen on a call.

Each browser tab that connects gets its own `zlayout` process; nothing is shared between them.
Every request needs the secret token printed once in the URL, requests from other sites are
refused, and the page loads nothing from the internet (zlayout.webserver). textual-serve is a
base dependency (sharing the screen on a call is a main use), imported only here.
"""

from __future__ import annotations

import argparse
import errno
import re
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
                    "(ssh -L 8000:localhost:8000 login-node) and open the URL it prints: it carries a secret "
                    "token, without which the server answers nothing.")
    parser.add_argument("--host", default=None,
                        help="address to listen on (default 127.0.0.1: only this machine, or an SSH tunnel); "
                             "another address is used only when given here, with a warning")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument("--public-url", default=None,
                        help="the URL browsers use, when it differs from http://HOST:PORT "
                             "(behind a proxy or a tunnel to another port)")
    parser.set_defaults(func=run)


ALL_INTERFACES = ("0.0.0.0", "::", "[::]")


def network_name() -> str:
    """A name other machines can open for this one: its FQDN or host name where that resolves
    to an address that is not loopback, else the address it reaches the network from (a UDP
    socket's own address after connect, which sends nothing). Many hosts map their own name
    to 127.0.0.1 in /etc/hosts, and getfqdn() is then `localhost`: useless to a colleague."""
    import socket

    for name in (socket.getfqdn(), socket.gethostname()):
        try:
            if name and not is_loopback_name(name) and not is_loopback_name(socket.gethostbyname(name)):
                return name
        except OSError:
            continue
    for family, target in ((socket.AF_INET, ("192.0.2.1", 9)), (socket.AF_INET6, ("2001:db8::1", 9))):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(target)
                address = probe.getsockname()[0]
        except OSError:
            continue
        if not is_loopback_name(address):
            return f"[{address}]" if ":" in address else address
    return socket.gethostname()


def url_host(host: str) -> str:
    """A host as a URL names it: an IPv6 address in brackets ([::1]), anything else as is."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def is_loopback_name(host: str) -> bool:
    from zlayout.webserver import is_loopback

    return is_loopback(host)


def app_command() -> str:
    """The shell command each browser session runs: this Python's `python -P -m zlayout`.

    -P: the current directory is not put first on sys.path, so a `zlayout/` folder where the
    server was started cannot run in place of zlayout (PYTHONPATH still counts)."""
    from zlayout.install import zlayout_argv

    return " ".join(shlex.quote(part) for part in zlayout_argv())


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port: use 1-65535, e.g. --port 8000")
    try:
        import textual_serve.server  # noqa: F401  (textual-serve itself, even if webserver is loaded)

        from zlayout.webserver import TokenServer, is_loopback
    except ImportError:
        raise UsageError(install_hint()) from None
    host = args.host or "127.0.0.1"
    public_url = args.public_url.rstrip("/") if args.public_url else None
    if public_url is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", public_url):
        raise UsageError(f"--public-url {args.public_url!r} is not an http(s) URL: e.g. --public-url http://localhost:9000")
    if not host.strip() or any(not c.isprintable() or c.isspace() for c in host):
        raise UsageError(f"--host {host!r} is not an address: e.g. --host 127.0.0.1")
    if public_url is None and host in ALL_INTERFACES:
        public_url = f"http://{url_host(network_name())}:{args.port}"  # a browser cannot open 0.0.0.0
    elif public_url is None:
        public_url = f"http://{url_host(host)}:{args.port}"  # `--host ::1` printed http://::1:8000
    if not is_loopback(host):
        print(f"zlayout: warning: listening on {host}: every machine that can reach it can ask for the "
              "page; only the token keeps them out. Prefer the default (127.0.0.1) and an SSH tunnel.",
              file=sys.stderr)

    def ready(server: TokenServer) -> None:  # printed once the port is bound, and only then
        print(f"zlayout: serving the app on {server.url}", file=sys.stderr)
        print("zlayout: open that URL (it carries the secret token; anyone with it can use the app as you); "
              "ctrl+c stops the server", file=sys.stderr)
        print(f"zlayout: each browser tab runs its own app: {server.command}", file=sys.stderr)
        if not is_loopback(host):
            where = "every network interface of this machine" if host in ALL_INTERFACES else host
            bound = f"[{host.strip('[]')}]" if ":" in host else host
            print(f"zlayout: listening on {bound}:{args.port} ({where}): reachable by other machines "
                  "on the network, not only this one", file=sys.stderr)
        if is_loopback(host):
            print(f"zlayout: from your laptop: ssh -L {args.port}:localhost:{args.port} THIS_HOST, "
                  "then open the URL above", file=sys.stderr)
        sys.stderr.flush()

    server = TokenServer(app_command(), host=host, port=args.port, title="zlayout",
                         public_url=public_url, on_ready=ready)
    try:
        server.serve()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"port {args.port} is already in use on {host}: "
                             f"pick another, e.g. --port {args.port + 1 if args.port < 65535 else 8000}") from None
        if exc.errno == errno.EACCES:
            raise UsageError(f"not allowed to listen on port {args.port}: use a port above 1023, "
                             "e.g. --port 8000") from None
        raise UsageError(f"cannot listen on {host}:{args.port}: {exc.strerror or exc}: "
                         "check --host (e.g. --host 127.0.0.1)") from None
    return 0
