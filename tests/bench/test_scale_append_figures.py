"""`bench/scale.py`'s append figures: the rate counts acknowledged appends only. An append
answered with an error fails fast; counted in the rate, a run with errors read faster."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.scale import append_figures  # noqa: E402


def test_the_rate_counts_acknowledged_appends_only() -> None:
    errors = Counter({"UNAVAILABLE: no route": 400})
    figures = append_figures(1000, [0.002] * 600, errors, 2.0, 0.5)
    assert figures["per_s"] == 300.0
    assert figures["acknowledged"] == 600
    assert figures["appends"] == 1000
    assert figures["errors"] == 400


def test_without_errors_every_append_counts() -> None:
    latencies = [i / 1000 for i in range(1, 101)]
    figures = append_figures(100, latencies, Counter(), 0.5, 0.1)
    assert figures["per_s"] == 200.0
    assert figures["errors"] == 0
    assert figures["p50_ms"] == 51.0
    assert figures["p99_ms"] == 100.0


def test_no_acknowledged_append() -> None:
    figures = append_figures(10, [], Counter({"DEADLINE_EXCEEDED": 10}), 1.0, 0.0)
    assert figures["per_s"] == 0.0
    assert figures["p50_ms"] is None and figures["p99_ms"] is None
