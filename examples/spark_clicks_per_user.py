"""Streaming aggregation, journal to journal: clicks per user, exactly once.

Reads JSON click events from every journal labelled topic=spark-clicks, counts clicks per
user, and writes each micro-batch's counts to the journal examples/spark/clicks-per-user as
JSON lines (complete output mode appends the whole, updated result each micro-batch: the
last line of a user is its current count).

    python examples/spark_clicks_per_user.py --broker http://localhost:8080 \\
        --checkpoint /tmp/clicks-per-user [--available-now]
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

CLICKS = "topic=spark-clicks"
COUNTS = "examples/spark/clicks-per-user"


def start(
    spark: SparkSession, broker: str, checkpoint: str, *, available_now: bool
) -> StreamingQuery:
    clicks = (
        spark.readStream.format("gazette")
        .schema("user STRING, page STRING, ts TIMESTAMP")
        .option("broker", broker)
        .option("selector", CLICKS)
        .option("framing", "json")
        .option("startingOffsets", "earliest")
        .option("maxBytesPerTrigger", str(4 << 20))
        .load()
    )
    counts = clicks.groupBy("user").agg(
        F.count("*").alias("clicks"), F.max("ts").alias("last_click")
    )
    writer = (
        counts.writeStream.format("gazette")
        .outputMode("complete")
        .option("broker", broker)
        .option("journal", COUNTS)
        .option("checkpointLocation", checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="http://localhost:8080")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--available-now", action="store_true", help="stop once caught up")
    args = parser.parse_args()
    spark = SparkSession.builder.appName("clicks-per-user").getOrCreate()
    start(spark, args.broker, args.checkpoint, available_now=args.available_now).awaitTermination()


if __name__ == "__main__":
    main()
