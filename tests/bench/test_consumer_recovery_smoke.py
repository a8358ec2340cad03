"""Smoke run of bench/consumer.py --recovery (make bench-smoke): at a small scale the SQLite
store compacts its recovery log, and playback from hints stays within 3x the store while
the history grows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.etcd_process import etcd_binary

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.bench_smoke,
    pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed"),
    pytest.mark.timeout(300),
]


def test_bench_consumer_recovery_quick() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "consumer.py"),
            "--recovery",
            "--history-txns",
            "600",
            "--history-db-mb",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    points = json.loads(proc.stdout)["sqlite"]["points"]
    assert [p["transactions"] for p in points] == [6, 60, 180, 600]
    last = points[-1]
    assert last["compactions"] >= 1 and last["history_to_store"] > 3
    assert all(p["rebuilt_matches"] and p["playback_to_store"] <= 3 for p in points)
    assert all(p["baseline_plain_read_of_history_seconds"] > 0 for p in points)
    # The RocksDB store's rows: its database rebuilt from hints at every point.
    rocks = json.loads(proc.stdout)["rocksdb"]["points"]
    assert [p["transactions"] for p in rocks] == [6, 60, 180, 600]
    assert all(p["rebuilt_matches"] and p["playback_to_store"] <= 3 for p in rocks)
