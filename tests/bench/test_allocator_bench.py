"""bench/allocator.py: Gazette's CPU is its b.N = n run's alone. Go runs a benchmark at
b.N = 1 before b.N = n, so the process's CPU for n > 1 holds a whole N = 1 deploy too; the
CPU of a separate b.N = 1 run is taken out of it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from allocator import measured_run_cpu


def test_a_run_at_n_1_is_all_measured() -> None:
    assert measured_run_cpu(7.2, None, 1) == 7.2


def test_the_warm_up_run_is_taken_out_at_larger_n() -> None:
    assert measured_run_cpu(19.7, 6.5, 2) == pytest.approx(13.2)


def test_noise_never_makes_it_negative() -> None:
    assert measured_run_cpu(6.0, 6.5, 2) == 0.0


def test_larger_n_needs_the_warm_up_cpu() -> None:
    with pytest.raises(ValueError):
        measured_run_cpu(19.7, None, 2)
