"""`bench/scale.py`'s first-append floor: the gRPC calls a first append makes, priced."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.scale import first_append_floor, spool_file_costs  # noqa: E402

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


def test_the_spool_files_of_a_first_append_are_priced_per_replica() -> None:
    files = {"pygazette_first_spool_us": 300.0, "gazette_spool_file_us": 50.0, "where": {}}
    got = first_append_floor(
        COSTS, 6, 2, run(500.0, 2.5, 0.4), run(3000.0, 0.4, 0.3), cpus=2, files=files
    )
    # Floor: 280 + 250 + 300 us; files: two replicas' first spools.
    assert got["spool_files_ms_per_first_append"] == {"pygazette": 0.6, "gazette": 0.1}
    assert got["pygazette_above_floor_and_files_ms"] == pytest.approx(2.5 - 0.83 - 0.6)
    assert got["gazette_without_files_ms"] == pytest.approx(0.3)


def test_spool_file_costs_measure_both_and_leave_nothing(tmp_path: Path) -> None:
    root, gazette_tmp = tmp_path / "spools", tmp_path / "tmp"
    root.mkdir()
    gazette_tmp.mkdir()
    got = spool_file_costs(root, gazette_tmp, n=20)
    assert got["pygazette_first_spool_us"] > 0
    assert got["gazette_spool_file_us"] > 0
    assert list(root.iterdir()) == [] and list(gazette_tmp.iterdir()) == []
