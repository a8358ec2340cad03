"""`bench/scale.py --smoke` end to end, pygazette alone: etcd, 3 broker processes, a few
hundred journals at replication 2 applied in transactions of 100, 2 consumer processes and
a few hundred shards. Correctness only, not timing: every journal converges with 2 members
and a primary, every first append is acknowledged, a broker killed and restarted serves its
journals again, and every shard gets a primary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)


def test_scale_smoke() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "scale.py"),
            "--smoke",
            "--systems",
            "pygazette",
            "-K",
            "3",
            "-N",
            "300",
            "-R",
            "2",
            "--shards",
            "200",
            "--consumers",
            "2",
            "--idle",
            "1",
            "--no-moves",
            "--timeout",
            "90",
        ],
        capture_output=True,
        text=True,
        timeout=230,
        cwd=ROOT,
    )
    assert proc.stdout, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    result = report["systems"]["pygazette"]
    assert report["failures"] == {"pygazette": []}, json.dumps(result, indent=1)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert result["converged_journals"] == 300
    assert result["first_append"]["appends"] == 300
    assert result["first_append"]["errors"] == 0
    assert result["restart"]["member_of_sampled"] > 0
    assert result["restart"]["appends_through_it_s"] is not None
    assert result["shards"]["primaries"] == 200
