"""Server processes for the peer benchmark: start one with its output in a log file, wait
until it listens, stop it (SIGTERM, then SIGKILL). Ports come from tests/support/ports.py
(outside the kernel's ephemeral range); a server whose port was taken says so
(`PortInUse`), and `start_server` starts it again on a new port."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.support.ports import (
    PortInUse,
    ServerPort,
    free_port,
    listens_on,
    log_size,
    output_since,
    says_port_taken,
    start_on_free_port,
    start_retrying,
)

__all__ = [
    "PortInUse",
    "ServerPort",
    "ServerProcess",
    "free_port",
    "listens_on",
    "start_retrying",
]


class ServerProcess:
    """One server process; its stdout and stderr go to `log`."""

    def __init__(
        self, name: str, cmd: list[str], log: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name, self.cmd, self.log = name, cmd, log
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self._offset = 0  # Where the latest start's output begins in the log.

    def start(self) -> None:
        self._offset = log_size(self.log)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def check_running(self) -> None:
        """Raise if the process has exited: PortInUse if its output says a port was taken."""
        assert self.proc is not None
        if self.proc.poll() is None:
            return
        output = output_since(self.log, self._offset)
        if says_port_taken(output):
            raise PortInUse(f"{self.name}: a port was taken:\n{output[-2000:]}")
        raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")

    def not_ready(self, what: str) -> Exception:
        """The error of a start that timed out: PortInUse (the process stopped) if its output
        says a port was taken."""
        output = output_since(self.log, self._offset)
        if says_port_taken(output):
            self.stop(5.0)
            return PortInUse(f"{self.name}: a port was taken:\n{output[-2000:]}")
        return TimeoutError(f"{self.name} {what}:\n{self.log_tail()}")

    def wait_listening(self, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_running()
            assert self.proc is not None
            if listens_on(self.proc.pid, port):  # Itself, not another process on the port.
                return
            time.sleep(0.05)
        raise self.not_ready(f"did not listen on {port}")

    def terminate(self) -> None:
        """SIGTERM, without waiting."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM and wait for the exit; SIGKILL after `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def start_server(
    make: Callable[[int], ServerProcess], timeout: float = 60.0
) -> tuple[ServerProcess, int]:
    """`make(port)`'s process for a free port, started and listening; made and started
    again on a new port while its port turns out taken."""

    def attempt(port: int) -> tuple[ServerProcess, int]:
        proc = make(port)
        proc.start()
        try:
            proc.wait_listening(port, timeout)
        except BaseException:
            proc.stop(5.0)
            raise
        return proc, port

    return start_on_free_port(attempt)
