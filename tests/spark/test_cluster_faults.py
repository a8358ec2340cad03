"""Exactly once on a standalone cluster when the driver is killed -9 in the middle of a
batch: the query restarts from its checkpoint and the sink's journals hold every record once.
(An executor killed mid-stream is in test_on_cluster.py, part of make test.)

Heavy (a second driver JVM, killed and started again): outside make test, behind the
`spark_cluster_faults` marker (`make test-spark-cluster`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pygazette.client import SyncJournalClient
from tests.spark.conftest import Sessions
from tests.spark.test_sink import kill_driver_mid_batch_and_restart
from tests.support.broker_process import BrokerProcess
from tests.support.spark_cluster import SparkCluster, cluster_conf

pytestmark = [pytest.mark.spark_cluster_faults, pytest.mark.timeout(900)]


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
