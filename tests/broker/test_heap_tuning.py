"""Heap tuning: applies on glibc, and is harmless to repeat."""

from __future__ import annotations

import platform

import pytest

from pygazette.broker.heap_tuning import tune_heap_for_large_messages


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_tuning_applies_on_glibc() -> None:
    assert tune_heap_for_large_messages() is True
    assert tune_heap_for_large_messages() is True
    blocks = [bytes(1 << 20) for _ in range(8)]  # Large allocations still work.
    assert sum(map(len, blocks)) == 8 << 20
