"""`pygazette serve` raises its open-file soft limit to the hard limit (as Go's runtime does
for Gazette's broker): a broker serving thousands of journals holds more files than the
usual soft limit of 1,024."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

from tests.support.ports import free_port


def open_files_limits(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError("no open-file limit in /proc/PID/limits")


def test_serve_raises_the_soft_open_file_limit(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard)

    # util-linux's prlimit sets the limit and execs serve (same pid). Not preexec_fn: it
    # makes CPython fork a worker that may have gRPC threads running, and such a child
    # can crash before it execs.
    limit = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    proc = subprocess.Popen(
        [
            "prlimit",
            f"--nofile={low}:{limit}",
            "--",
            sys.executable,
            "-m",
            "pygazette.cli.main",
            "serve",
            "--port",
            str(free_port()),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # An unlimited hard limit is left alone (the kernel caps open files anyway).
        wanted = str(low) if hard == resource.RLIM_INFINITY else str(hard)
        deadline = time.monotonic() + 30
        while open_files_limits(proc.pid)[0] != wanted:
            assert proc.poll() is None, "serve exited"
            assert time.monotonic() < deadline, open_files_limits(proc.pid)
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(15)
