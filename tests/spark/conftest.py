"""Fixtures of the Spark tests: one session for the run, one broker per test module."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install '.[spark]')")

from pyspark.sql import SparkSession

from pygazette.client import SyncJournalClient
from tests.support.broker_process import BrokerProcess
from tests.support.spark_session import new_session

_names = itertools.count()


@pytest.fixture(scope="session")
def faults_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark-faults")


@pytest.fixture(scope="session")
def spark(faults_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    session = new_session(faults_dir, tmp_path_factory.mktemp("spark"))
    try:
        yield session
    finally:
        session.stop()


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
