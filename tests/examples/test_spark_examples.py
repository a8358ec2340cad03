"""The Spark examples run on their own against a broker (README: Spark on a cluster): what
they say when that broker lacks their journals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.broker_process import BrokerProcess

REPO = Path(__file__).resolve().parents[2]


def test_fragments_to_parquet_without_the_clicks_journals(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Against a broker without the journals of examples/spark/journalspace.yaml (the
    quickstart's), the batch job says so in one line before Spark starts, and how to make
    them. It used to write an empty output and fail reading it back with Spark's
    '[UNABLE_TO_INFER_SCHEMA] Unable to infer schema for Parquet'."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    script = "examples/spark_fragments_to_parquet.py"
    out = str(tmp_path / "clicks.parquet")
    proc = subprocess.run(
        [sys.executable, script, "--broker", broker.url, "--out", out],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: no journal at {broker.url} matches topic=spark-clicks: create them with "
        "`pygazette journals apply --specs examples/spark/journalspace.yaml` and append clicks "
        "(`python examples/spark_demo.py --broker URL` does both)"
    ]
    assert not (tmp_path / "clicks.parquet").exists()
