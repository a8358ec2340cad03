"""A real single-member etcd server on loopback, for cluster tests."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.support.ports import free_port


def etcd_binary() -> str | None:
    return shutil.which("etcd")


class EtcdProcess:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"etcd-{self.client_port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

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
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
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
