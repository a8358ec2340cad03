"""A streaming job for tests that kill Spark mid-query: journal -> journals, exactly once.

Reads JSON records {"n", "user"} from an input journal and writes them, keyed by user, over
the journals of a selector, with Trigger.AvailableNow. Run it as

    python -m tests.support.spark_stream_job BROKER INPUT SELECTOR CHECKPOINT FAULTS SCRATCH [CONF]

CONF, a JSON object of Spark settings, puts the job on a cluster (`spark.master`; see
tests/support/spark_cluster.py's `cluster_conf`); without it the job runs `local[2,4]`.

The test kills its whole process group (driver, JVM and Python workers) and restarts the
query from the same checkpoint (`run_query`, in-process or here).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession


def run_query(
    spark: SparkSession, broker: str, journal: str, selector: str, checkpoint: str
) -> None:
    # Spark's JVM looks Python data sources up through the calling thread's active session;
    # a query started on a thread other than the session's (as the fault tests do) finds no
    # `gazette` sink without it (DATA_SOURCE_NOT_FOUND at start()).
    jvm = spark._jvm
    assert jvm is not None
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    source = (
        spark.readStream.format("gazette")
        .schema("journal STRING, offset LONG, n LONG, user STRING")
        .option("broker", broker)
        .option("journals", journal)
        .option("framing", "json")
        .option("startingOffsets", "earliest")
        .option("minPartitions", "2")
        .option("maxRecordsPerTrigger", "60")
        .load()
    )
    query = (
        source.writeStream.format("gazette")
        .option("broker", broker)
        .option("selector", selector)
        .option("keyColumn", "user")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def main(argv: list[str]) -> None:
    from tests.support.spark_session import new_session

    broker, journal, selector, checkpoint, faults, scratch, *conf = argv
    spark = new_session(Path(faults), Path(scratch), json.loads(conf[0]) if conf else None)
    try:
        run_query(spark, broker, journal, selector, checkpoint)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
