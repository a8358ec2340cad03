"""A command that serves on a loopback port, for benchmarks and tests that need no more of a
harness: started with its output in a log, waited for until it listens (itself, not another
process on its port), and started again on a new free port when its port turned out taken
(tests/support/ports.py)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tests.support.ports import (
    PortInUse,
    listens_on,
    log_size,
    output_since,
    says_port_taken,
    start_on_free_port,
)


def start_listening(
    command: Callable[[int], Sequence[str]],
    log: Path,
    *,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    what: str = "server",
) -> tuple[subprocess.Popen[bytes], int]:
    """Run `command(port)` (stdout and stderr appended to `log`) and wait until something
    listens on 127.0.0.1:port; the process and its port. `port` None: a free one, and
    another while the process says its port was taken; a given `port` is kept."""

    def attempt(p: int) -> tuple[subprocess.Popen[bytes], int]:
        offset = log_size(log)  # This start's output begins here.
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                list(command(p)),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                output = output_since(log, offset)
                if says_port_taken(output):
                    raise PortInUse(f"{what}: port {p} was taken:\n{output[-2000:]}")
                raise RuntimeError(f"{what} exited early ({proc.returncode}):\n{output[-4000:]}")
            if listens_on(proc.pid, p):  # Itself, not whatever else may hold the port.
                return proc, p
            time.sleep(0.05)
        proc.kill()
        proc.wait(10)
        output = output_since(log, offset)
        if says_port_taken(output):
            raise PortInUse(f"{what}: port {p} was taken:\n{output[-2000:]}")
        raise TimeoutError(f"{what} did not listen on {p}:\n{output[-4000:]}")

    return start_on_free_port(attempt, port=port)
