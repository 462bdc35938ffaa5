"""`zlayout serve`: the app over HTTP through textual-serve."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request

from zlayout.cli import main


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_answers_http_with_the_app_page():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "zlayout", "serve", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        first = server.stdout.readline()  # the URL with its token, printed once the port is bound
        url = first.split(" on ", 1)[1].strip()
        with urllib.request.urlopen(url, timeout=10) as response:
            page = response.read().decode()
        assert "zlayout" in page and f"ws://127.0.0.1:{port}/ws/" in page
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        output = first + server.stdout.read()  # through the same buffer readline filled
        server.wait(timeout=10)
    assert "ssh -L" in output  # it says how to reach it from a laptop
    assert "-m zlayout" in output  # each browser session runs the zlayout app


def test_serve_without_textual_serve_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "textual_serve", None)  # import now fails
    monkeypatch.setitem(sys.modules, "textual_serve.server", None)
    assert main(["serve"]) == 2
    assert " -m pip install " in capsys.readouterr().err  # the exact command: tests/packaging


def test_serve_rejects_a_port_out_of_range(capsys):
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port 8000" in capsys.readouterr().err


def test_serve_on_all_interfaces_prints_an_address_others_can_open():
    """--host 0.0.0.0 printed http://localhost:PORT (getfqdn() where the host name maps to
    127.0.0.1): a URL no colleague can open. It now prints a name or address that is not
    loopback, says what it binds and that the network can reach it; the URL it prints works."""
    from urllib.parse import urlsplit

    from zlayout.webserver import is_loopback

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "zlayout", "serve", "--host", "0.0.0.0",
                               "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    lines = []
    try:
        for line in server.stdout:
            lines.append(line)
            if "each browser tab" in line:  # the rest of the banner follows, flushed together
                break
        url = next(x for x in lines if "serving the app on" in x).split(" on ", 1)[1].strip()
        host = urlsplit(url).hostname
        assert host != "localhost" and not is_loopback(host), url
        assert urlsplit(url).port == port
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        lines.append(server.stdout.read())
        server.wait(timeout=10)
    output = "".join(lines)
    assert f"listening on 0.0.0.0:{port} (every network interface of this machine): reachable by " \
           "other machines on the network" in output
    assert "ssh -L" not in output  # no tunnel needed, and none suggested


def test_the_network_name_is_not_loopback_when_the_host_name_maps_to_127(monkeypatch):
    import socket

    from zlayout.commands import serve
    from zlayout.webserver import is_loopback

    monkeypatch.setattr(socket, "getfqdn", lambda: "localhost")
    monkeypatch.setattr(socket, "gethostname", lambda: "vm")
    real = socket.gethostbyname
    monkeypatch.setattr(socket, "gethostbyname",
                        lambda name: "127.0.0.1" if name in ("localhost", "vm") else real(name))
    name = serve.network_name()
    assert name != "localhost" and not is_loopback(name)
