"""A real `pygazette serve` subprocess on loopback, for integration and fault tests.

Its port is a `ServerPort`: a first start that finds it taken moves to another free port
(unless the port was given, or read before the start), see tests/support/ports.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from pygazette.auth.tls import ClientTLS, channel_credentials
from tests.support.ports import (
    PortInUse,
    ServerPort,
    listens_on,
    log_size,
    output_since,
    says_port_taken,
    start_retrying,
)


class BrokerProcess:
    """Starts, kills and restarts one broker process on a fixed data dir and port."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        tls: ClientTLS | None = None,
    ) -> None:
        self.data_dir = data_dir
        # Given, the process serves TLS (its flags are in `extra_args`): this is what the
        # readiness check trusts and presents (a client certificate, for mTLS).
        self.tls = tls
        self._port = ServerPort(port)
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"broker-{self._port.peek()}.log"

    @property
    def port(self) -> int:
        """The port it serves on (reading it keeps it from moving on a first start)."""
        return self._port.number

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def file_root(self) -> Path:
        """Where the broker roots `file://` stores (`--file-root`, else DATA_DIR/fragments)."""
        args = self.extra_args
        for i, arg in enumerate(args):
            if arg == "--file-root" and i + 1 < len(args):
                return Path(args[i + 1])
            if arg.startswith("--file-root="):
                return Path(arg.split("=", 1)[1])
        return self.data_dir / "fragments"

    def start(self, timeout: float = 30.0) -> None:
        """Start the process and wait until it serves; retried on another port if its port
        was taken (see the module's docstring)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        start_retrying(lambda: self._start_once(timeout), [self._port])

    def command(self, port: int) -> list[str]:
        """The process's command line, serving on `port`."""
        return [
            sys.executable,
            "-m",
            "pygazette.cli.main",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(self.data_dir),
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def _start_once(self, timeout: float) -> None:
        offset = log_size(self.log_path)  # This start's output begins here.
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command(self._port.peek()),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
        )
        log.close()
        self._wait_listening(timeout, offset)

    def _wait_listening(self, timeout: float, offset: int) -> None:
        port = self._port.peek()
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                output = output_since(self.log_path, offset)
                if says_port_taken(output):
                    raise PortInUse(f"{address} was taken:\n{output[-2000:]}")
                raise RuntimeError(f"broker exited early ({self.proc.returncode}):\n{self.log()}")
            if not listens_on(self.proc.pid, port):  # Not (yet) ours, whatever else may.
                time.sleep(0.02)
                continue
            # It listens; make sure it speaks HTTP/2 and answers.
            with self._ready_channel(address) as channel:
                try:
                    grpc.channel_ready_future(channel).result(max(0.1, deadline - time.monotonic()))
                    return
                except grpc.FutureTimeoutError:
                    break
        if says_port_taken(output_since(self.log_path, offset)):
            self.kill()
            raise PortInUse(f"{address} was taken:\n{self.log()}")
        raise TimeoutError(f"broker did not serve on {address}:\n{self.log()}")

    def _ready_channel(self, address: str) -> grpc.Channel:
        """A channel as the process serves: TLS (with the test's material) or plaintext."""
        if self.tls is None:
            return grpc.insecure_channel(address)
        return grpc.secure_channel(address, channel_credentials(self.tls))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def freeze(self) -> None:
        """SIGSTOP: the process stops dead (cut off from etcd and peers) until thawed."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to exit on its own; its exit status."""
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks run, like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM and wait for a clean exit (SIGKILL if it hangs)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # In case it is frozen.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGUSR1)  # Its stacks go to the log.
                time.sleep(1)
                self.kill()

    def restart(self) -> None:
        self.stop()
        self.start()
