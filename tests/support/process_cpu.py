"""The CPU time a process on this machine has used, read from /proc (benchmarks and harnesses
charge a workload the CPU its server processes spent on it)."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds process `pid` has used so far (OSError: it is gone)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
