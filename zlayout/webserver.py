"""textual-serve with a lock on the door: what `zlayout serve` runs.

A login node is shared: anyone on it can reach 127.0.0.1, and any web page the user opens can
aim a websocket at it. So every request needs the secret token printed once in the URL (as
Jupyter does; compared in constant time), a request whose Origin is another site is refused,
and the page loads nothing from the internet (textual-serve's page pulls its font from Google
Fonts; here it comes from the copy textual-serve ships). Imports textual-serve and aiohttp:
only `zlayout serve` imports this module.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import re
import secrets
import signal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp_jinja2
import jinja2
from aiohttp import web
from textual_serve.server import Server

TOKEN_PARAM = "token"
COOKIE = "zlayout_serve_token"
TEMPLATE = "app_index.html"
_REMOTE_LINK = re.compile(r"<link\b[^>]*href=\"https?://[^\"]*\"[^>]*/?>", re.IGNORECASE | re.DOTALL)
_LOCAL_FONT = """<style>
      @font-face { font-family: "Roboto Mono"; font-style: normal;
        src: url("{{ config.static.url }}fonts/RobotoMono-VariableFont_wght.ttf") format("truetype"); }
      @font-face { font-family: "Roboto Mono"; font-style: italic;
        src: url("{{ config.static.url }}fonts/RobotoMono-Italic-VariableFont_wght.ttf") format("truetype"); }
    </style>"""


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def local_page_template(original: Path) -> str:
    """textual-serve's page with every stylesheet from the internet replaced by the fonts it ships."""
    text = (original / TEMPLATE).read_text(encoding="utf-8")
    text = _REMOTE_LINK.sub(lambda _: _LOCAL_FONT, text, count=1)
    return _REMOTE_LINK.sub("", text)


def _origin(url: str) -> str | None:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else None


def _loopback_host(host_and_port: str) -> bool:
    """'localhost:8000', '127.0.0.1:8000', '[::1]:8000': a loopback name, with or without a port."""
    host = host_and_port.rsplit(":", 1)[0] if not host_and_port.endswith("]") else host_and_port
    if host_and_port.count(":") > 1 and not host_and_port.startswith("["):
        host = host_and_port  # a bare IPv6 address has no port
    return is_loopback(host)


def _port_of(host_and_port: str) -> int | None:
    tail = host_and_port.rsplit(":", 1)[-1] if not host_and_port.endswith("]") else ""
    return int(tail) if tail.isdigit() else None


class TokenServer(Server):
    """textual_serve.Server whose page, websocket and downloads need the token."""

    def __init__(self, command: str, *, token: str | None = None, on_ready=None, **kwargs: Any) -> None:
        super().__init__(command, **kwargs)
        self.token = token or secrets.token_urlsafe(32)
        self.page_template = local_page_template(self.templates_path)
        self.on_ready = on_ready

    @property
    def url(self) -> str:
        """The one URL to open: the page with the token (printed once at startup)."""
        return f"{self.public_url}/?{TOKEN_PARAM}={self.token}"

    def initialize_logging(self) -> None:
        """No rich tracebacks with locals on the console: errors are handled where they happen."""

    def _token_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())

    def _origin_ok(self, request: web.Request) -> bool:
        """A browser sends Origin on websockets and cross-site requests: it must be this server."""
        origin = request.headers.get("Origin")
        if origin is None:
            return True  # not a browser's cross-site request; the token still decides
        allowed = {f"{request.scheme}://{request.host}".lower(), _origin(self.public_url)}
        if origin.lower() in allowed:
            return True
        # the loopback names the server prints (localhost, 127.0.0.1, [::1]) are one machine:
        # a page opened as localhost:8000 whose websocket reaches 127.0.0.1:8000 is this page
        parts = urlsplit(origin)
        return (_loopback_host(request.host) and parts.hostname is not None and is_loopback(parts.hostname)
                and parts.port == _port_of(request.host))

    def _refuse(self, request: web.Request) -> web.Response | None:
        if not self._origin_ok(request):
            return web.Response(status=403, text="zlayout serve: requests from another site are refused\n")
        given = request.match_info.get(TOKEN_PARAM) or request.query.get(TOKEN_PARAM) or request.cookies.get(COOKIE)
        if not self._token_ok(given):
            return web.Response(status=403, text="zlayout serve: open the URL printed when the server "
                                                 "started (it ends in ?token=...)\n")
        return None

    async def _make_app(self) -> web.Application:
        app = web.Application()
        aiohttp_jinja2.setup(app, loader=jinja2.DictLoader({TEMPLATE: self.page_template}),
                             autoescape=True)
        app.add_routes([
            web.get("/", self.handle_index, name="index"),
            # the token is in the path: textual.js appends "?width=..&height=.." to this URL
            web.get("/ws/{token}", self.handle_websocket, name="websocket"),
            web.get("/download/{key}", self.handle_download, name="download"),
            web.static("/static", self.statics_path, show_index=False, name="static"),
        ])
        app.on_shutdown.append(self.on_shutdown)
        return app

    def serve(self, debug: bool = False) -> None:
        """Serve until SIGINT/SIGTERM. Binding comes first: a port in use raises OSError before
        anything is printed, and the URL (with the token) is printed once, when it works."""
        self.debug = debug
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        runner = web.AppRunner(await self._make_app(), handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
            if self.on_ready is not None:
                self.on_ready(self)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await runner.cleanup()

    async def handle_index(self, request: web.Request) -> web.StreamResponse:  # type: ignore[override]
        refused = self._refuse(request)
        if refused is not None:
            return refused
        # a page opened through a loopback name reaches its websocket by that same name (it was
        # refused, 403, when the page said localhost and the websocket 127.0.0.1); behind a
        # proxy or a tunnel --public-url is what the browser uses
        base = (f"{request.scheme}://{request.host}" if _loopback_host(request.host)
                and _loopback_host(urlsplit(self.public_url).netloc) else self.public_url)
        static_url = base + str(request.app.router["static"].url_for(filename="/")).rstrip("/") + "/"
        ws_path = str(request.app.router["websocket"].url_for(token=self.token))
        ws_url = ("wss:" if base.startswith("https") else "ws:") + (base + ws_path).split(":", 1)[1]
        font_size = request.query.get("fontsize", "16")
        context = {"font_size": int(font_size) if font_size.isdigit() and len(font_size) < 4 else 16,
                   "app_websocket_url": ws_url, "config": {"static": {"url": static_url}},
                   "application": {"name": self.title}}
        response = aiohttp_jinja2.render_template(TEMPLATE, request, context)
        response.headers["Referrer-Policy"] = "no-referrer"  # the token is in this page's URL
        response.headers["Cache-Control"] = "no-store"
        response.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict", path="/")
        return response

    async def handle_websocket(self, request: web.Request) -> web.StreamResponse:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        return await super().handle_websocket(request)

    async def handle_download(self, request: web.Request) -> web.StreamResponse:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        return await super().handle_download(request)
