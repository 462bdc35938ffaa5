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
