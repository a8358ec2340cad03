"""The source and sink on a standalone Spark cluster (a master and two one-core workers,
tests/support/spark_cluster.py), where tasks run in executor JVMs and Python workers of
their own, not in the driver's process: a representative subset of the local tests, run as
written with `spark` on `spark://`. A batch read split over both workers, a streaming read
restarted from its checkpoint, the exactly-once stream sink under a task that fails
between its appends (the fault armed in the driver's process fires in an executor's), and
under kill -9 of an executor JVM in the middle of a micro-batch (the task is retried on an
executor that is still alive; every record is written once)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pygazette.client import SyncJournalClient
from pygazette.spark.faults import token_name
from tests.spark.test_batch_read import test_lines_and_raw
from tests.spark.test_sink import (
    arm,
    jsons_of,
    stream_journals,
    test_stream_write_is_exactly_once_when_a_task_fails_between_appends,
)
from tests.spark.test_stream_read import test_restart_from_checkpoint_without_gaps_or_duplicates
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import wait_for
from tests.support.spark_cluster import SparkCluster
from tests.support.spark_stream_job import run_query

# The first test's setup starts the cluster's three JVMs, then the driver's session and two
# executors: minutes on a loaded two-core machine, seconds on an idle one.
pytestmark = pytest.mark.timeout(600)

__all__ = [
    "test_lines_and_raw",
    "test_restart_from_checkpoint_without_gaps_or_duplicates",
    "test_stream_write_is_exactly_once_when_a_task_fails_between_appends",
]


@pytest.fixture
def spark(cluster_spark: SparkSession) -> SparkSession:
    """These tests' session: the cluster's."""
    assert cluster_spark.sparkContext.master.startswith("spark://")
    return cluster_spark


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def executor_of(cluster: SparkCluster, pid: int) -> int:
    """The executor JVM that `pid` (a Python worker) runs under."""
    executors = set(cluster.executor_pids())
    p = pid
    while p > 1:
        if p in executors:
            return p
        p = parent_of(p)
    raise LookupError(f"process {pid} runs under no executor of {sorted(executors)}")


def test_executor_killed_mid_stream_writes_each_row_once(
    cluster_spark: SparkSession,
    spark_cluster: SparkCluster,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    faults_dir: Path,
    tmp_path: Path,
) -> None:
    source, topic, outs = stream_journals(gz, prefix, 250, 50)
    arm(faults_dir, "hang-after-append", outs[0])
    failure: list[BaseException] = []

    def query() -> None:
        try:
            run_query(
                cluster_spark, spark_broker.url, source, f"topic={topic}", str(tmp_path / "ck")
            )
        except BaseException as exc:  # Reported by the test's thread below.
            failure.append(exc)

    thread = threading.Thread(target=query, daemon=True)
    thread.start()
    hung = faults_dir / token_name("hung", outs[0])
    wait_for(
        lambda: hung.exists() or not thread.is_alive(),
        timeout=300,
        what="a task to hang after its append, mid-batch",
    )
    if failure:
        raise failure[0]
    task_pid = int(hung.read_text())
    executor = executor_of(spark_cluster, task_pid)
    os.kill(executor, signal.SIGKILL)
    try:
        thread.join(600)
        assert not thread.is_alive(), "the query did not finish after its executor died"
        if failure:
            raise failure[0]
    finally:
        with contextlib.suppress(ProcessLookupError):  # Its daemon ends it with the JVM.
            os.kill(task_pid, signal.SIGKILL)
    written = Counter(d["n"] for j in outs for d in jsons_of(gz, j))
    assert written == Counter(range(250))
    assert executor not in spark_cluster.executor_pids()
