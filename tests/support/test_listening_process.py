"""tests/support/listening_process.py: a real server process started on a free port, and
again on another when something took its port first."""

from __future__ import annotations

import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.listening_process import start_listening
from tests.support.ports import PortInUse, free_port


def http_server(port: int) -> list[str]:
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]


def test_a_taken_port_is_retried_on_another(tmp_path: Path) -> None:
    tried: list[int] = []
    blocker = socket.socket()

    def command(port: int) -> list[str]:
        tried.append(port)
        if len(tried) == 1:  # Another process takes the port just before the server.
            blocker.bind(("127.0.0.1", port))
            blocker.listen()
        return http_server(port)

    try:
        proc, port = start_listening(command, tmp_path / "http.log", what="http.server")
    finally:
        blocker.close()
    try:
        assert tried == [tried[0], port] and port != tried[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
            assert resp.status == 200
    finally:
        proc.kill()
        proc.wait(10)


def test_a_given_port_is_kept(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        with pytest.raises(PortInUse):
            start_listening(http_server, tmp_path / "http.log", port=port)


def test_a_server_failing_otherwise_is_not_retried(tmp_path: Path) -> None:
    calls: list[int] = []

    def command(port: int) -> list[str]:
        calls.append(port)
        return [sys.executable, "-c", "raise SystemExit('no config')"]

    with pytest.raises(RuntimeError, match="no config"):
        start_listening(command, tmp_path / "x.log")
    assert len(calls) == 1
