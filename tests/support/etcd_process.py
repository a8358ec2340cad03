"""A real single-member etcd server on loopback, for cluster tests; optionally over TLS with
client certificates required (`tls=`: the material of `tests.support.tls_material`).

Its client and peer ports are `ServerPort`s: a first start that finds one taken moves to
new free ports (unless read before the start), see tests/support/ports.py. Restarts keep
them: the data directory records the peer URL."""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from pygazette.auth.tls import ClientTLS, client_ssl_context
from tests.support.ports import (
    PortInUse,
    ServerPort,
    listens_on,
    log_size,
    output_since,
    says_port_taken,
    start_retrying,
)
from tests.support.tls_material import TLSMaterial


def etcd_binary() -> str | None:
    return shutil.which("etcd")


class EtcdProcess:
    def __init__(
        self, data_dir: Path, *, tls: TLSMaterial | None = None, extra_args: Sequence[str] = ()
    ) -> None:
        self.data_dir = data_dir
        self.tls = tls
        self.extra_args = list(extra_args)  # More etcd flags, e.g. --max-txn-ops=512.
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
        return self._url(self.client_port)

    def _url(self, port: int) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{port}"

    @property
    def client_tls(self) -> ClientTLS | None:
        """What a client presents to and trusts of this etcd (None: plaintext)."""
        if self.tls is None:
            return None
        return ClientTLS(self.tls.ca, self.tls.client_cert, self.tls.client_key)

    @property
    def client_flags(self) -> list[str]:
        """`pygazette` flags reaching this etcd: --etcd URL and its TLS files."""
        flags = ["--etcd", self.url]
        if self.tls is not None:
            flags += [
                "--etcd-cert-file",
                str(self.tls.client_cert),
                "--etcd-cert-key-file",
                str(self.tls.client_key),
                "--etcd-trusted-ca-file",
                str(self.tls.ca),
            ]
        return flags

    def start(self, timeout: float = 60.0) -> None:
        """Start etcd and wait until it is healthy; retried on other ports if a port was
        taken (see the module's docstring)."""
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not installed (.ci/install-system-deps installs it)")
        start_retrying(
            lambda: self._start_once(binary, timeout), [self._client_port, self._peer_port]
        )

    def _start_once(self, binary: str, timeout: float) -> None:
        url = self._url(self._client_port.peek())
        peer = f"http://127.0.0.1:{self._peer_port.peek()}"
        cmd = [
            binary,
            "--name=test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            "--log-level=warn",
            # Small, busy test clusters: don't let a slow fsync elect a new term.
            "--heartbeat-interval=200",
            "--election-timeout=2000",
            *self.extra_args,
        ]
        context: ssl.SSLContext | None = None
        if self.tls is not None:
            cmd += [
                f"--cert-file={self.tls.server_cert}",
                f"--key-file={self.tls.server_key}",
                f"--trusted-ca-file={self.tls.ca}",
                "--client-cert-auth",
            ]
            context = client_ssl_context(self.client_tls)
        offset = log_size(self.log_path)  # This start's output begins here.
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                output = output_since(self.log_path, offset)
                if says_port_taken(output):
                    raise PortInUse(f"etcd's port ({url} or {peer}) was taken:\n{output[-2000:]}")
                raise RuntimeError(f"etcd exited early:\n{self.log()}")
            # Ours listening, not another process that took the port (it would answer).
            if not listens_on(self.proc.pid, self._client_port.peek()):
                time.sleep(0.05)
                continue
            try:
                with urllib.request.urlopen(url + "/health", timeout=1, context=context) as resp:
                    if b'"true"' in resp.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        if says_port_taken(output_since(self.log_path, offset)):
            self.kill()
            raise PortInUse(f"etcd's port ({url} or {peer}) was taken:\n{self.log()}")
        raise TimeoutError(f"etcd did not become healthy:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
