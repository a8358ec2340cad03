"""Fixtures of the Spark tests: one session at a time for the run (local, or on the one
standalone cluster a run starts when a test asks for it), one broker per test module.

A process holds one SparkContext: `spark` gives the local session and `cluster_spark` the
cluster's, each stopping the other's when it is asked for (a few seconds). Cluster tests
live in modules of their own (test_on_cluster.py), so a run switches at most twice."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install '.[spark]')")

from pyspark.sql import SparkSession

from pygazette.client import SyncJournalClient
from tests.support.broker_process import BrokerProcess
from tests.support.spark_cluster import SparkCluster, cluster_conf
from tests.support.spark_session import new_session

_names = itertools.count()


@pytest.fixture(scope="session")
def faults_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark-faults")


class Sessions:
    """The process's one Spark session, on the master asked for last."""

    def __init__(self, faults_dir: Path, tmp: pytest.TempPathFactory) -> None:
        self.faults_dir, self.tmp = faults_dir, tmp
        self.current: SparkSession | None = None
        self.master = ""

    def get(self, conf: dict[str, str] | None = None) -> SparkSession:
        master = (conf or {}).get("spark.master", "local")
        if self.current is None or self.master != master:
            self.stop()
            self.current = new_session(self.faults_dir, self.tmp.mktemp("spark"), conf)
            self.master = master
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


@pytest.fixture(scope="session")
def spark_sessions(
    faults_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sessions]:
    sessions = Sessions(faults_dir, tmp_path_factory)
    try:
        yield sessions
    finally:
        sessions.stop()


@pytest.fixture
def spark(spark_sessions: Sessions) -> SparkSession:
    return spark_sessions.get()


@pytest.fixture(scope="session")
def spark_cluster(
    faults_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkCluster]:
    """A standalone master and two one-core workers, shared by the whole run."""
    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), faults_dir=faults_dir)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_spark(spark_sessions: Sessions, spark_cluster: SparkCluster) -> SparkSession:
    return spark_sessions.get(cluster_conf(spark_cluster, "pygazette-tests-cluster"))


@pytest.fixture(scope="module")
def spark_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("spark-broker") / "data")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def gz(spark_broker: BrokerProcess) -> Iterator[SyncJournalClient]:
    with SyncJournalClient(spark_broker.url) as client:
        yield client


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    """A journal name prefix of this test's own."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:40]
    return f"spark/{name}-{next(_names)}/"
