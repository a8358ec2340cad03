"""`make chaos` in small: the whole chaos suite on a short schedule, in `make test`.

The same cluster, workload, checks and report as `python -m tests.chaos.run`, with faults
every 4-6 s for 30 s (kills, freezes, etcd restarts, partitions, store outages, dealt from a
seeded deck) and short leases, so it fits in about a minute and a half.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chaos.run import ChaosConfig, run_chaos
from tests.support.etcd_process import etcd_binary

pytestmark = [
    pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed"),
    pytest.mark.timeout(420),
    pytest.mark.chaos_smoke,
]


async def test_stream_sum_stays_exactly_once_under_a_short_fault_schedule(
    tmp_path: Path,
) -> None:
    report = await run_chaos(ChaosConfig.smoke(seed=7), tmp_path)
    text = json.dumps(report, indent=1, default=str)
    print(text)
    assert report["faults_total"] >= 5, text
    assert report["mismatches"] == 0, text
    assert report["lost_appends"] == 0, text
    assert report["duplicate_sums"] == 0, text
    assert report["head_regressions"] == report["heads_behind_acks"] == 0, text
    assert report["appends_acknowledged"] > 0 and report["appends_audited"] > 0, text
    assert report["streams_verified"] == report["streams"] > 0, text
    assert report["ok"], text
