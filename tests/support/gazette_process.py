"""The released Gazette broker (Go) and the etcd it coordinates through, as real processes.

The binaries come from `interop/build-binaries` (built once from the Go module proxy into
interop/bin/). `GazetteBroker` has the `url`/`address` interface of `BrokerProcess`, so tests
written against a pygazette broker run against Gazette's unchanged. A first start that finds
its port taken moves to another free port, as the pygazette harnesses do
(tests/support/ports.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import (
    PortInUse,
    ServerPort,
    listens_on,
    log_size,
    output_since,
    says_port_taken,
    start_retrying,
)

REPO = Path(__file__).resolve().parents[2]
INTEROP_DIR = REPO / "interop"
BUILD_SCRIPT = INTEROP_DIR / "build-binaries"


@dataclass(frozen=True)
class GazetteBinaries:
    gazette: Path
    gazctl: Path
    etcd: Path


def gazette_binaries() -> GazetteBinaries:
    """Build (once; later calls return at once) and locate gazette, gazctl and etcd."""
    bin_dir = Path(os.environ.get("INTEROP_BIN") or INTEROP_DIR / "bin")
    proc = subprocess.run(
        [str(BUILD_SCRIPT)],
        env=dict(os.environ, INTEROP_BIN=str(bin_dir)),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"interop/build-binaries failed:\n{proc.stderr[-4000:]}")
    return GazetteBinaries(bin_dir / "gazette", bin_dir / "gazctl", bin_dir / "etcd")


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-4000:]
    except FileNotFoundError:
        return ""


def _port_taken(path: Path, offset: int, what: str) -> PortInUse | None:
    """PortInUse if the log's output since `offset` says a port was taken."""
    output = output_since(path, offset)
    if says_port_taken(output):
        return PortInUse(f"{what}'s port was taken:\n{output[-2000:]}")
    return None


def _terminate(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class EtcdServer:
    """A single-member etcd (3.5 or newer, as Gazette's client requires) on loopback."""

    def __init__(self, binary: Path, data_dir: Path) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self._client_port = ServerPort()
        self._peer_port = ServerPort()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"etcd-{self._client_port.peek()}.log"

    @property
    def client_port(self) -> int:
        return self._client_port.number

    @property
    def peer_port(self) -> int:
        return self._peer_port.number

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 60.0) -> None:
        start_retrying(lambda: self._start_once(timeout), [self._client_port, self._peer_port])

    def _start_once(self, timeout: float) -> None:
        url = f"http://127.0.0.1:{self._client_port.peek()}"
        peer = f"http://127.0.0.1:{self._peer_port.peek()}"
        cmd = [
            str(self.binary),
            "--name=interop",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=interop={peer}",
            "--log-level=warn",
            "--heartbeat-interval=200",
            "--election-timeout=2000",
        ]
        offset = log_size(self.log_path)  # This start's output begins here.
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                taken = _port_taken(self.log_path, offset, "etcd")
                if taken is not None:
                    raise taken
                raise RuntimeError(f"etcd exited early:\n{_tail(self.log_path)}")
            # Ours listening, not another process that took the port (it would answer).
            if not listens_on(self.proc.pid, self._client_port.peek()):
                time.sleep(0.05)
                continue
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                    if b'"true"' in resp.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        taken = _port_taken(self.log_path, offset, "etcd")
        if taken is not None:
            _terminate(self.proc, 10)
            raise taken
        raise TimeoutError(f"etcd did not become healthy:\n{_tail(self.log_path)}")

    def stop(self) -> None:
        _terminate(self.proc, 10)


class GazetteBroker:
    """One `gazette serve` process on loopback, in its own etcd prefix.

    Each broker gets a fresh prefix, so brokers of different tests share one etcd without
    seeing each other's journals. `file:///` stores are rooted at `file_root`.
    """

    def __init__(
        self,
        binary: Path,
        etcd: EtcdServer,
        work_dir: Path,
        *,
        file_root: Path | None = None,
        port: int | None = None,
        prefix: str | None = None,
        broker_id: str = "gazette-broker",
        extra_args: list[str] | None = None,
        auth_keys: str = "",
    ) -> None:
        self.binary = binary
        # Serve with --broker.auth-keys (the readiness check then signs its List).
        self.auth_keys = auth_keys
        self.etcd = etcd
        self.work_dir = work_dir
        self.file_root = file_root or work_dir / "fragments"
        self._port = ServerPort(port)
        self.prefix = prefix or f"/gazette/interop-{uuid.uuid4().hex[:12]}"
        self.broker_id = broker_id
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = work_dir / f"gazette-{self._port.peek()}.log"

    @property
    def port(self) -> int:
        return self._port.number

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        """As `BrokerProcess.data_dir`: `data_dir / "fragments"` roots file:// stores."""
        return self.file_root.parent

    def command(self, port: int | None = None) -> list[str]:
        """The command line, serving on `port` (default: the broker's)."""
        return [
            str(self.binary),
            "serve",
            "--broker.host=127.0.0.1",
            f"--broker.port={port or self.port}",
            f"--broker.id={self.broker_id}",
            "--broker.zone=local",
            f"--broker.file-root={self.file_root}",
            f"--etcd.address={self.etcd.url}",
            f"--etcd.prefix={self.prefix}",
            "--broker.watch-delay=0s",
            "--log.level=warn",
            *([f"--broker.auth-keys={self.auth_keys}"] if self.auth_keys else []),
            *self.extra_args,
        ]

    def start(self, timeout: float = 60.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.file_root.mkdir(parents=True, exist_ok=True)
        start_retrying(lambda: self._start_once(timeout), [self._port])

    def _start_once(self, timeout: float) -> None:
        port = self._port.peek()
        offset = log_size(self.log_path)  # This start's output begins here.
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(port), stdout=log, stderr=subprocess.STDOUT)
        self._wait_serving(f"127.0.0.1:{port}", timeout, offset)

    def _wait_serving(self, address: str, timeout: float, offset: int) -> None:
        """Wait until the broker answers List: it then has joined etcd and is the allocator."""
        import grpc

        from pygazette.protocol.pb import protocol_pb2 as pb
        from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc

        metadata: tuple[tuple[str, str], ...] = ()
        if self.auth_keys:
            from pygazette.auth.capability import Capability
            from pygazette.auth.claims import Claims
            from pygazette.auth.keyed_auth import KeyedAuth

            metadata = KeyedAuth(self.auth_keys).metadata(Claims(Capability.LIST))
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                taken = _port_taken(self.log_path, offset, "gazette")
                if taken is not None:
                    raise taken
                raise RuntimeError(f"gazette exited early:\n{self.log()}")
            # Ours listening, not another process that took the port (it would answer).
            if not listens_on(self.proc.pid, int(address.rsplit(":", 1)[1])):
                time.sleep(0.05)
                continue
            try:
                with grpc.insecure_channel(address) as channel:
                    stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
                    for resp in stub.List(pb.ListRequest(), timeout=2, metadata=metadata):
                        if resp.status == pb.OK and resp.header.process_id.suffix:
                            return
                        last = pb.Status.Name(resp.status)
            except grpc.RpcError as exc:
                last = str(exc)
            time.sleep(0.05)
        taken = _port_taken(self.log_path, offset, "gazette")
        if taken is not None:
            self.kill()
            raise taken
        raise TimeoutError(f"gazette did not serve ({last}):\n{self.log()}")

    def log(self) -> str:
        return _tail(self.log_path)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: the broker hands off its journals, persists its spools and exits."""
        _terminate(self.proc, timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
