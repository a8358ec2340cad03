"""A real single-member etcd server on loopback, for cluster tests; optionally over TLS with
client certificates required (`tls=`: the material of `tests.support.tls_material`)."""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

from pygazette.auth.tls import ClientTLS, client_ssl_context
from tests.support.ports import free_port
from tests.support.tls_material import TLSMaterial


def etcd_binary() -> str | None:
    return shutil.which("etcd")


class EtcdProcess:
    def __init__(self, data_dir: Path, *, tls: TLSMaterial | None = None) -> None:
        self.data_dir = data_dir
        self.tls = tls
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"etcd-{self.client_port}.log"

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

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
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not installed (.ci/install-system-deps installs it)")
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [
            binary,
            "--name=test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            "--log-level=warn",
            # Small, busy test clusters: don't let a slow fsync elect a new term.
            "--heartbeat-interval=200",
            "--election-timeout=2000",
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
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(
                    self.url + "/health", timeout=1, context=context
                ) as resp:
                    if b'"true"' in resp.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"etcd did not become healthy:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
