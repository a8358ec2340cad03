"""Smoke test of bench/consumer.py --quick: it runs end to end (etcd, a broker, two
consumer processes) and reports every figure beside its baseline, with every sum verified."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.etcd_process import etcd_binary

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed"),
    pytest.mark.timeout(300),
]


def test_bench_consumer_quick() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "consumer.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    tp = result["throughput"]
    assert tp["sums_verified"] == tp["streams"] and tp["mismatches"] == tp["duplicates"] == 0
    assert tp["per_shard_chunks_per_s"] > 0
    assert tp["baseline_read_committed_decode"]["per_journal_chunks_per_s"] > 0
    assert tp["ratio_per_shard_to_baseline"] > 0
    lat = result["latency"]
    assert lat["chunker_ok"] and lat["verified"] == lat["streams"]
    assert 0 < lat["sum_p50_ms"] <= lat["sum_p99_ms"]
    assert lat["baseline_journal_round_trip"]["p50_ms"] > 0
    rec = result["recovery"]
    assert rec["rebuilt_db_matches"]
    assert rec["player_mb_per_s"] > 0 and rec["baseline_plain_read_mb_per_s"] > 0
    takeover = result["takeover"]
    assert 0 < takeover["kill_to_primary_s"] <= takeover["kill_to_first_commit_s"]
