"""The source and sink on a standalone Spark cluster (a master and two one-core workers,
tests/support/spark_cluster.py), where tasks run in executor JVMs and Python workers of
their own, not in the driver's process: a representative subset of the local tests, run as
written with `spark` on `spark://`. A batch read split over both workers, a streaming read
restarted from its checkpoint, and the exactly-once stream sink under a task that fails
between its appends (the fault armed in the driver's process fires in an executor's)."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from tests.spark.test_batch_read import test_lines_and_raw
from tests.spark.test_sink import (
    test_stream_write_is_exactly_once_when_a_task_fails_between_appends,
)
from tests.spark.test_stream_read import test_restart_from_checkpoint_without_gaps_or_duplicates

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
