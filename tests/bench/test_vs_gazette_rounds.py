"""bench/vs_gazette.py (the Python-client comparison): the systems alternate which goes first
from round to round, so that load that comes and goes does not fall on one of them only
(pygazette always ran first); figures are medians over the rounds, ratios pygazette/Gazette
of the medians, and each system's broker CPU per workload is compared too."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from vs_gazette import compare_rounds, round_orders


def run(mb: float, per_s: float, p50: float, cpu_4k: float) -> dict[str, Any]:
    return {
        "big": {"mb_per_s": mb},
        "small": {"appends_per_s": per_s, "p50_ms": p50, "p99_ms": p50 * 2},
        "tail_read": 500.0,
        "persisted_read": 400.0,
        "broker_cpu_ms_per_append_1mib": 4.0,
        "broker_cpu_ms_per_append_4kib": cpu_4k,
        "broker_cpu_s_per_gb_tail_read": 1.0,
        "broker_cpu_s_per_gb_persisted_read": 2.0,
    }


def test_rounds_alternate_which_system_goes_first() -> None:
    assert round_orders(3) == [
        ("pygazette", "gazette"),
        ("gazette", "pygazette"),
        ("pygazette", "gazette"),
    ]


def test_figures_are_medians_and_ratios_are_pygazette_over_gazette() -> None:
    py = [run(100, 800, 1.2, 0.9), run(120, 900, 1.0, 0.8), run(90, 700, 1.4, 1.0)]
    go = [run(110, 1000, 0.8, 0.1), run(130, 1100, 0.7, 0.12), run(150, 1200, 0.6, 0.11)]
    figures = compare_rounds(py, go)
    assert figures["append_1mib_mb_per_s"]["pygazette"] == 100
    assert figures["append_1mib_mb_per_s"]["gazette"] == 130
    assert figures["append_1mib_mb_per_s"]["ratio"] == pytest.approx(100 / 130, abs=1e-3)
    assert figures["commit_latency_4kib_p50_ms"]["ratio"] == pytest.approx(1.2 / 0.7, abs=1e-3)
    assert figures["broker_cpu_ms_per_append_4kib"]["ratio"] == pytest.approx(0.9 / 0.11, abs=1e-3)
    assert figures["append_4kib_per_s"]["rounds"] == {
        "pygazette": [800, 900, 700],
        "gazette": [1000, 1100, 1200],
    }
