"""The pipeline's streaming job: page-view events in, running (user, page) totals out.

Reads the JSON events of every journal labelled topic=pipeline-events, drops malformed ones
(no user, no page, a negative duration), normalizes the page, counts views and sums their
durations per (user, page), and writes each micro-batch's totals (the `complete` output
mode: every key's, the last line per key being the current one) to the journals labelled
topic=pipeline-page-counts, mapped by user, exactly once (the gazette sink fences
each micro-batch's appends with journal registers, so a retried task or a query restarted
from its checkpoint writes nothing twice). Trigger.AvailableNow: it stops once it has read
what was there when it started; run it again and it goes on from its checkpoint.

    spark-submit --master spark://HOST:7077 examples/pipeline/stream_job.py \\
        --broker http://BROKER:8080 --checkpoint /shared/checkpoints/pipeline
"""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

EVENTS = "topic=pipeline-events"
PAGE_COUNTS = "topic=pipeline-page-counts"
EVENT_SCHEMA = "journal STRING, offset LONG, user STRING, page STRING, ms LONG"


def clean(events: DataFrame) -> DataFrame:
    """Events with a user, a page and a duration >= 0; pages lowercased, trimmed."""
    return events.where(
        F.col("user").isNotNull() & F.col("page").isNotNull() & (F.col("ms") >= 0)
    ).withColumn("page", F.lower(F.trim(F.col("page"))))


def page_counts(events: DataFrame) -> DataFrame:
    return (
        clean(events)
        .groupBy("user", "page")
        .agg(F.count("*").alias("views"), F.sum("ms").alias("ms"))
    )


def start(spark: SparkSession, broker: str, checkpoint: str) -> StreamingQuery:
    events = (
        spark.readStream.format("gazette")
        .schema(EVENT_SCHEMA)
        .option("broker", broker)
        .option("selector", EVENTS)
        .option("framing", "json")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "4000")
        .option("minPartitions", "2")  # Both workers read.
        .load()
    )
    return (
        page_counts(events)
        .writeStream.format("gazette")
        .outputMode("complete")
        .option("broker", broker)
        .option("selector", PAGE_COUNTS)
        .option("keyColumn", "user")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="http://localhost:8080")
    parser.add_argument("--checkpoint", required=True, help="a directory every node can reach")
    args = parser.parse_args()
    spark = SparkSession.builder.appName("pipeline-page-counts").getOrCreate()
    start(spark, args.broker, args.checkpoint).awaitTermination()


if __name__ == "__main__":
    main()
