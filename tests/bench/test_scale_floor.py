"""`bench/scale.py`'s first-append floor: the gRPC calls a first append makes, priced."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.scale import first_append_floor  # noqa: E402

COSTS = {
    "message": {"client_cpu_us": 60.0, "server_cpu_us": 40.0, "per_s": 1.0},
    "new_stream": {"client_cpu_us": 300.0, "server_cpu_us": 200.0, "per_s": 1.0},
    "append_call": {"client_cpu_us": 330.0, "server_cpu_us": 280.0, "per_s": 1.0},
    "unary_call": {"client_cpu_us": 100.0, "server_cpu_us": 200.0, "per_s": 1.0},
}


def run(per_s: float, broker_ms: float, client_ms: float) -> dict[str, float]:
    return {
        "first_append": {
            "per_s": per_s,
            "broker_cpu_ms_per_append": broker_ms,
            "client_cpu_ms_per_append": client_ms,
        }
    }


def test_the_floor_prices_each_call_of_a_first_append() -> None:
    got = first_append_floor(COSTS, 6, 3, run(500.0, 2.5, 0.4), run(3000.0, 0.4, 0.3), cpus=2)
    # Served Append 280; 5/6 of a unary call both sides (300); a unary call to each of the
    # two peers.
    assert got["floor_parts_us"] == {
        "client_append_call_served_us": 280.0,
        "proxy_unary_call_us": 250.0,
        "replicate_calls_us": 600.0,
    }
    assert got["broker_cpu_floor_ms_per_append"] == pytest.approx(1.13)
    assert got["pygazette_above_floor_ms"] == pytest.approx(1.37)
    # The kinder of the two client costs: 2 cores / (1.13 + 0.3) ms.
    assert got["client_cpu_ms_per_append"] == 0.3
    assert got["rate_ceiling_per_s"] == pytest.approx(1398.6, abs=0.1)
    assert got["rate_ceiling_vs_gazette"] == pytest.approx(0.47)


def test_a_journal_on_one_broker_pays_no_replication() -> None:
    got = first_append_floor(COSTS, 1, 1, run(1.0, 1.0, 0.1), run(1.0, 1.0, 0.1), cpus=1)
    assert got["floor_parts_us"]["proxy_unary_call_us"] == 0.0
    assert got["floor_parts_us"]["replicate_calls_us"] == 0.0
