"""`zlayout serve` lets in only the holder of its token, only from its own page, and needs no internet.

A real server (`python -m zlayout serve`) on a free port; real HTTP and websocket clients (aiohttp).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import aiohttp
import pytest

from zlayout.cli import main
from zlayout.webserver import is_loopback


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "zlayout", "serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        first = proc.stdout.readline()  # printed once the port is bound
        match = re.search(r"(http://127\.0\.0\.1:\d+)/\?token=([A-Za-z0-9_-]+)", first)
        assert match, f"no URL with a token in {first!r}"
        yield {"base": match.group(1), "token": match.group(2), "port": port}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=20)


def get(url: str, headers: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def test_the_token_is_long_and_random(server):
    assert len(server["token"]) >= 40  # secrets.token_urlsafe(32)


@pytest.mark.parametrize("query", ["", "?token=", "?token=wrong", "?token=AAAA%0A"])
def test_page_without_the_right_token_is_refused(server, query):
    status, body = get(server["base"] + "/" + query)
    assert status == 403
    assert "ends in ?token=" in body and "ws://" not in body  # says what to open, shows nothing of the app


def test_page_with_the_token_is_served_and_needs_no_internet(server):
    status, page = get(f"{server['base']}/?token={server['token']}")
    assert status == 200
    assert f"ws://127.0.0.1:{server['port']}/ws/{server['token']}" in page
    # every URL the page loads is this server's (the svg namespace is a name, not a fetch)
    urls = set(re.findall(r"https?://[^\"'\s)]+", page)) - {"http://www.w3.org/2000/svg"}
    assert urls and all(u.startswith(server["base"] + "/") for u in urls), urls
    assert "googleapis" not in page
    for asset in re.findall(r"(/static/[^\"')]+)", page):  # and they are there
        status, _ = get(server["base"] + asset)
        assert status == 200, asset


def test_a_foreign_origin_is_refused_even_with_the_token(server):
    status, _ = get(f"{server['base']}/?token={server['token']}", headers={"Origin": "http://evil.example"})
    assert status == 403


async def _ws(server, path: str, origin: str | None) -> tuple[str, bytes | str | None]:
    headers = {"Origin": origin} if origin else {}
    # a bounded wait: a served app that never answers must fail the test, not hang the suite
    async with asyncio.timeout(90), aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(server["base"].replace("http", "ws") + path + "?width=80&height=24",
                                          headers=headers, timeout=aiohttp.ClientWSTimeout(ws_close=20)) as ws:
                message = await ws.receive(timeout=60)
                return "open", message.data
        except aiohttp.WSServerHandshakeError as exc:
            return f"refused {exc.status}", None


@pytest.mark.parametrize("path, origin", [
    ("/ws", None),  # textual-serve's own route: gone
    ("/ws/", None),
    ("/ws/wrong-token", None),
    ("/ws/TOKEN", "http://evil.example"),
    ("/ws/TOKEN", "http://127.0.0.1:1"),  # same host, another port: another origin
])
def test_websocket_is_refused_without_token_or_from_another_origin(server, path, origin):
    state, _ = asyncio.run(_ws(server, path.replace("TOKEN", server["token"]), origin))
    assert state.startswith("refused")


def test_websocket_with_the_token_from_its_own_page_drives_the_app(server):
    state, data = asyncio.run(_ws(server, f"/ws/{server['token']}", server["base"]))
    assert state == "open" and data  # the app's first output arrives


def test_port_in_use_is_one_line(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"port {port} is already in use" in err and "--port" in err
    assert "token=" not in err  # nothing served, no URL printed


def test_another_host_only_when_asked_and_with_a_warning(capsys):
    with socket.socket() as sock:  # busy port: nothing gets exposed while testing the warning
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert main(["serve", "--host", "0.0.0.0", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert "warning: listening on 0.0.0.0" in err and "token" in err


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                            ("127.0.0.2", True), ("0.0.0.0", False), ("10.0.0.5", False),
                                            ("login1.cluster", False)])
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("flag", [["--public-url", "javascript:alert(1)"], ["--host", "a b"],
                                  ["--public-url", "http://x/\nSet-Cookie: a"]])
def test_bad_host_or_url_is_one_line(flag, capsys):
    assert main(["serve", *flag]) == 2
    assert capsys.readouterr().err.count("\n") == 1
