"""tests/support/ports.py: ports outside the ephemeral range, and starts retried on a new port
when theirs was taken (with real server processes holding, or finding, the port)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import ports
from tests.support.broker_process import BrokerProcess
from tests.support.etcd_process import EtcdProcess, etcd_binary
from tests.support.ports import (
    PortInUse,
    ServerPort,
    free_port,
    log_size,
    output_since,
    says_port_taken,
    start_on_free_port,
    start_retrying,
)


@contextmanager
def occupied(port: int) -> Iterator[None]:
    """Something listens on 127.0.0.1:`port` meanwhile."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield


def test_ports_are_outside_the_ephemeral_range_and_free() -> None:
    low, high = ports.ephemeral_range()
    chosen = [free_port() for _ in range(200)]
    assert len(set(chosen)) == len(chosen), "a port handed out twice"
    for port in chosen:
        assert not low <= port <= high, port
        assert ports.LOWEST <= port <= ports.HIGHEST
    for port in chosen[:20]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # Free: nothing holds it.


def test_the_range_is_read_from_the_kernel_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("12000\t64000\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", range_file)
    assert ports.ephemeral_range() == (12000, 64000)
    assert ports.candidate_ranges() == [range(10000, 12000), range(64001, 65536)]
    for _ in range(100):
        port = free_port()
        assert not 12000 <= port <= 64000, port


@pytest.mark.parametrize("content", [None, "", "garbage", "70000 80000", "500 100"])
def test_an_unreadable_range_falls_back_to_linux_default(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "range"
    if content is not None:
        path.write_text(content)
    assert ports.ephemeral_range(path) == ports.DEFAULT_EPHEMERAL


def test_a_range_covering_every_port_still_gives_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("1024 65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", range_file)
    assert ports.candidate_ranges() == []
    assert free_port() != free_port()


@pytest.mark.parametrize(
    "output",
    [
        '{"level":"fatal","msg":"listen tcp 127.0.0.1:2379: bind: address already in use"}',
        "RuntimeError: Failed to bind to address 127.0.0.1:23456; set GRPC_VERBOSITY=debug",
        "OSError: [Errno 98] Address already in use",
        'LOG:  could not bind IPv4 address "127.0.0.1": Address already in use',
        "java.net.BindException: Address already in use",
    ],
)
def test_bind_failures_are_recognized(output: str) -> None:
    assert says_port_taken(output)


def test_other_failures_are_not_port_failures() -> None:
    assert not says_port_taken("panic: open /data/member: permission denied")
    assert not ports.port_was_taken(RuntimeError("etcd exited early"))
    assert ports.port_was_taken(PortInUse("taken"))


def start_http_server(port: int, log: Path) -> subprocess.Popen[bytes]:
    """`python -m http.server` on `port`, waited for; PortInUse if the port was taken."""
    offset = log_size(log)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            output = output_since(log, offset)
            if says_port_taken(output):
                raise PortInUse(f"port {port} was taken:\n{output}")
            raise RuntimeError(f"http.server exited early:\n{output}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError(output_since(log, offset))


def test_a_start_whose_port_is_taken_is_retried_on_another(tmp_path: Path) -> None:
    port = ServerPort()
    taken = port.peek()
    tried: list[int] = []

    def start() -> subprocess.Popen[bytes]:
        tried.append(port.peek())
        return start_http_server(port.peek(), tmp_path / "http.log")

    with occupied(taken):
        proc = start_retrying(start, [port])
    try:
        assert tried[0] == taken
        assert len(tried) == 2, tried
        assert port.number == tried[1] != taken
        assert port.pinned  # Started: a restart keeps it.
        assert says_port_taken((tmp_path / "http.log").read_text())  # The first try's.
        with urllib.request.urlopen(f"http://127.0.0.1:{port.number}/", timeout=5) as resp:
            assert resp.status == 200
    finally:
        proc.kill()
        proc.wait(10)


def test_start_on_free_port_passes_the_new_port(tmp_path: Path) -> None:
    tried: list[int] = []
    blocker = socket.socket()

    def start(port: int) -> subprocess.Popen[bytes]:
        tried.append(port)
        if len(tried) == 1:  # Someone else grabs the first port just before the server.
            blocker.bind(("127.0.0.1", port))
            blocker.listen()
        return start_http_server(port, tmp_path / "http.log")

    try:
        proc = start_on_free_port(start)
    finally:
        blocker.close()
    try:
        assert len(tried) == 2 and tried[0] != tried[1]
    finally:
        proc.kill()
        proc.wait(10)


def test_a_given_or_read_port_is_not_moved(tmp_path: Path) -> None:
    port = ServerPort()
    number = port.number  # Passed on to someone: the server must be found there.
    with occupied(number), pytest.raises(PortInUse):
        start_retrying(lambda: start_http_server(port.peek(), tmp_path / "http.log"), [port])
    assert port.peek() == number
    assert not ServerPort(number).move()


def test_attempts_are_bounded() -> None:
    port = ServerPort()
    calls: list[int] = []

    def start() -> None:
        calls.append(port.peek())
        raise PortInUse("always taken")

    with pytest.raises(PortInUse):
        start_retrying(start, [port], attempts=3)
    assert len(calls) == 3 and len(set(calls)) == 3


def test_etcd_whose_port_is_taken_starts_on_another(tmp_path: Path) -> None:
    if etcd_binary() is None:
        pytest.fail("etcd is not installed; run .ci/install-system-deps")
    etcd = EtcdProcess(tmp_path / "etcd")
    taken = etcd._client_port.peek()  # Not read through `url`: it may still move.
    try:
        with occupied(taken):
            etcd.start()
        assert etcd.client_port != taken
        with urllib.request.urlopen(etcd.url + "/health", timeout=5) as resp:
            assert b'"true"' in resp.read()
        assert says_port_taken(etcd.log())  # Its first try met the taken port.
    finally:
        etcd.stop()


def test_broker_whose_port_is_taken_starts_on_another(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    taken = broker._port.peek()
    try:
        with occupied(taken):
            broker.start()
        assert broker.port != taken
        with socket.create_connection(("127.0.0.1", broker.port), timeout=5):
            pass
    finally:
        broker.kill()


def test_broker_whose_port_was_read_fails_instead_of_moving(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    port = broker.port  # E.g. in another process's flags already.
    try:
        with occupied(port), pytest.raises(PortInUse):
            broker.start()
        assert broker.port == port
    finally:
        broker.kill()


def test_listens_on_tells_whose_listener_it_is(tmp_path: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server, port = start_on_free_port(
        lambda port: (start_http_server(port, tmp_path / "http.log"), port)
    )
    try:
        assert ports.listens_on(server.pid, port)
        assert ports.listens_on(os.getpid(), port)  # Its parent's tree holds it too.
        assert not ports.listens_on(bystander.pid, port)  # It answers, but isn't theirs.
        assert not ports.listens_on(server.pid, free_port())
    finally:
        for proc in (server, bystander):
            proc.kill()
            proc.wait(10)
