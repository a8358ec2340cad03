"""One local Spark session for the whole test run, and journals to point it at.

The session runs `local[2,4]`: two cores, and up to four attempts per task (Spark's local
mode otherwise never retries a task, and the sink tests need retries). Python workers run
this interpreter. The `gazette` format is not registered by hand: Spark finds it through
the `pyspark_gazette` module, which the tests thereby check.

Ports: the UI is off, and Spark binds its driver, block manager and Py4J ports itself at
port 0 (the kernel picks a free one as it binds, so nothing can take it first): unlike the
servers of tests/support/ports.py, nothing here needs a port chosen ahead or a retried start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pygazette.client import SyncJournalClient
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.spark.faults import FAULTS_ENV

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA_HOME_CANDIDATES = ["/usr/lib/jvm/java-17-openjdk-amd64", "/usr/lib/jvm/java-17-openjdk-arm64"]


def spark_env(faults_dir: Path) -> dict[str, str]:
    """Environment for a process that starts Spark (this one, or a job subprocess)."""
    env = {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        FAULTS_ENV: str(faults_dir),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    if "JAVA_HOME" not in os.environ:
        for candidate in JAVA_HOME_CANDIDATES:
            if Path(candidate).is_dir():
                env["JAVA_HOME"] = candidate
    return env


def new_session(
    faults_dir: Path, scratch: Path, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A session on `local[2,4]`, or on what `conf` says (`spark.master`, e.g. a standalone
    cluster's settings from tests/support/spark_cluster.py's `cluster_conf`)."""
    os.environ.update(spark_env(faults_dir))
    try:
        return _new_session(scratch, conf)
    except Exception as exc:
        # The JVM gateway exited before it told its port. Seen once in `make test` (a test
        # process with gRPC's threads running forks the JVM's launcher); launching it again
        # works. Anything else, or a second failure, fails the test.
        if getattr(exc, "getCondition", lambda: "")() != "JAVA_GATEWAY_EXITED":
            raise
        print(f"Spark's JVM gateway exited at launch ({exc}); launching it once more")
        return _new_session(scratch, conf)


def _new_session(scratch: Path, conf: Mapping[str, str] | None) -> SparkSession:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2,4]").appName("pygazette-tests")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        # A Python worker (the driver's source runner, or a task's) has this long to start
        # and connect back: 15 s by default, less than a start-up takes on a loaded machine.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .config("spark.sql.streaming.stateStore.providerClass", _state_store())
        .config("spark.local.dir", str(scratch / "spark-local"))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={scratch}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def _state_store() -> str:
    return "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def journal_spec(
    name: str,
    *,
    codec: int = pb.SNAPPY,
    fragment_length: int = 1 << 20,
    labels: dict[str, str] | None = None,
) -> pb.JournalSpec:
    spec = pb.JournalSpec(name=name, replication=1, labels=label_set(labels or {}))
    spec.fragment.length = fragment_length
    spec.fragment.compression_codec = codec  # type: ignore[assignment]
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 1
    return spec


def create_journals(client: SyncJournalClient, *specs: pb.JournalSpec) -> None:
    client.apply_journals([pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs])
