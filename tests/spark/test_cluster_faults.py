"""Exactly once on a standalone cluster under kill -9: of an executor JVM in the middle of a
streaming micro-batch (the task is retried on an executor that is still alive), and of the
driver in the middle of a batch (the query restarts from its checkpoint). Either way the
sink's journals hold every record once.

Heavy (executor and driver JVMs killed and started again): outside make test, behind the
`spark_cluster_faults` marker (`make test-spark-cluster`)."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pygazette.client import SyncJournalClient
from pygazette.spark.faults import token_name
from tests.spark.conftest import Sessions
from tests.spark.test_sink import arm, jsons_of, kill_driver_mid_batch_and_restart, out_journals
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import append_each, json_records, wait_for
from tests.support.spark_cluster import SparkCluster, cluster_conf
from tests.support.spark_session import create_journals, journal_spec
from tests.support.spark_stream_job import run_query

pytestmark = [pytest.mark.spark_cluster_faults, pytest.mark.timeout(900)]


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
    source = prefix + "in"
    create_journals(gz, journal_spec(source))
    append_each(gz, source, [b"".join(json_records(i, 50)) for i in range(0, 250, 50)])
    topic = prefix.strip("/").replace("/", ".")
    outs = out_journals(gz, prefix, 2, topic)
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
        try:
            os.kill(task_pid, signal.SIGKILL)  # Its daemon normally ends it with the JVM.
        except ProcessLookupError:
            pass
    written = Counter(d["n"] for j in outs for d in jsons_of(gz, j))
    assert written == Counter(range(250))
    assert executor not in spark_cluster.executor_pids()


def test_driver_killed_mid_batch_and_restarted_writes_each_row_once(
    spark_sessions: Sessions,
    spark_cluster: SparkCluster,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    tmp_path: Path,
) -> None:
    conf = cluster_conf(spark_cluster, "pygazette-tests-cluster")
    spark_sessions.stop()  # The job's driver gets the cluster's cores.
    kill_driver_mid_batch_and_restart(
        lambda: spark_sessions.get(conf),
        spark_broker,
        gz,
        prefix,
        tmp_path,
        job_conf={**conf, "spark.app.name": "pygazette-tests-killed-driver"},
    )
