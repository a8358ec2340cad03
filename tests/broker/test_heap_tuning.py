"""Heap and GC tuning: applies on glibc, and is harmless to repeat; GC settings take."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from pygazette.broker.heap_tuning import tune_heap_for_large_messages


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_tuning_applies_on_glibc() -> None:
    assert tune_heap_for_large_messages() is True
    assert tune_heap_for_large_messages() is True
    blocks = [bytes(1 << 20) for _ in range(8)]  # Large allocations still work.
    assert sum(map(len, blocks)) == 8 << 20


def test_gc_tuning_freezes_startup_and_raises_the_young_threshold() -> None:
    # In a child process: the settings are process-wide.
    code = (
        "import gc\n"
        "from pygazette.broker.heap_tuning import GC_YOUNG_THRESHOLD, tune_gc\n"
        "before = gc.get_threshold()\n"
        "tune_gc()\n"
        "after = gc.get_threshold()\n"
        "assert after == (GC_YOUNG_THRESHOLD, before[1], before[2]), (before, after)\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
        "cycle = []\n"
        "cycle.append(cycle)\n"
        "del cycle\n"
        "assert gc.collect() >= 1  # Collection still works for what comes after.\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr

