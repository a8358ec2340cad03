"""`bench/spark_read.py --vs-kafka` end to end on tiny data: a real broker and a real Kafka
broker (KRaft) hold the same records, Spark local[2] reads them through the gazette source
and through Spark's Kafka source (`spark-sql-kafka-0-10` jars from the Maven cache), batch
and Trigger.AvailableNow, raw and JSON-decoded, and the JSON has every figure with its
ratio. It skips only when Maven cannot fill the jar cache."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 20_000
WORKLOADS = ["batch_raw", "batch_json", "stream_raw", "stream_json"]
SOURCES = ["kafka", "gazette", "gazette_direct"]
UNAVAILABLE = 3  # bench/spark_read.py's exit status when the comparison cannot run.


def run(tmp_path: Path) -> tuple[int, dict[str, Any], str]:
    err_path = tmp_path / "stderr.txt"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    with open(err_path, "wb") as err:
        # Its own process group: whatever happens, no broker or JVM it started outlives us.
        proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "spark_read.py"),
                "--vs-kafka",
                "--records",
                str(RECORDS),
                "--runs",
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=840)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    stderr = err_path.read_text(errors="replace")
    try:
        doc = json.loads(out)
    except json.JSONDecodeError:
        pytest.fail(f"spark_read.py --vs-kafka printed no JSON (exit {proc.returncode}):\n"
                    f"{stderr[-5000:]}")  # fmt: skip
    return proc.returncode, doc, stderr


@pytest.mark.slow
@pytest.mark.bench_smoke
@pytest.mark.timeout(900)
def test_vs_kafka_reads_the_same_rows_through_both_sources(tmp_path: Path) -> None:
    code, doc, stderr = run(tmp_path)
    assert doc["benchmark"] == "spark_vs_kafka"
    if code == UNAVAILABLE:
        reason = str(doc.get("unavailable", ""))
        if "mvn" in reason:
            pytest.skip(f"Maven cannot fill the jar cache here: {reason}")
        pytest.fail(f"the Kafka comparison could not run: {reason}")
    assert code == 0, stderr[-5000:]

    assert doc["data"]["records"] == RECORDS
    assert doc["spark"]["kafka_connector"].startswith("org.apache.spark:spark-sql-kafka-0-10_2.13:")
    assert any(
        j.startswith("spark-sql-kafka-0-10_2.13-") for j in doc["spark"]["kafka_connector_jars"]
    )
    assert doc["kafka"]["version"].startswith("4.")
    reads = doc["reads"]
    assert sorted(reads) == sorted(WORKLOADS)
    for workload in WORKLOADS:
        figures = reads[workload]
        for source in SOURCES:
            assert figures[f"{source}_rows_per_s"] > 0, (workload, source)
            assert len(figures["seconds"][source]) == 1
        assert figures["ratio"] == pytest.approx(
            figures["gazette_rows_per_s"] / figures["kafka_rows_per_s"], rel=0.01
        )
        assert figures["ratio_direct"] == pytest.approx(
            figures["gazette_direct_rows_per_s"] / figures["kafka_rows_per_s"], rel=0.01
        )
        if workload.startswith("stream"):
            assert sorted(figures["seconds_outside_batches"]) == sorted(SOURCES)
