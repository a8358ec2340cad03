"""The pipeline's batch report: fragment files into Parquet.

Reads the consumer's results (examples/pipeline/user-totals) and the streaming job's
(user, page) totals (topic=pipeline-page-counts) straight from their fragment files in the
broker's file store (`fileRoot`; only what is not yet persisted goes through the broker),
keeps the latest record of each user (and of each user and page), writes the users' totals
to Parquet, and returns the counts a person checks.

    spark-submit --master spark://HOST:7077 examples/pipeline/report.py \\
        --broker http://BROKER:8080 --file-root /shared/fragments --out /shared/report.parquet
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from examples.pipeline.stream_job import PAGE_COUNTS
from examples.pipeline.totals import USER_TOTALS


def _read(spark: SparkSession, broker: str, file_root: str, schema: str, **where: str) -> DataFrame:
    reader = (
        spark.read.format("gazette")
        .schema(schema)
        .option("broker", broker)
        .option("framing", "json")
        .option("fileRoot", os.path.abspath(file_root))
    )
    for key, value in where.items():
        reader = reader.option(key, value)
    return reader.load()


def latest(df: DataFrame, *keys: str) -> DataFrame:
    """Each key's record of the highest (journal, offset): its latest."""
    order = Window.partitionBy(*keys).orderBy(F.col("journal").desc(), F.col("offset").desc())
    return df.withColumn("_n", F.row_number().over(order)).where("_n = 1").drop("_n")


def report(spark: SparkSession, broker: str, file_root: str, out: str) -> dict[str, Any]:
    totals = _read(
        spark,
        broker,
        file_root,
        "journal STRING, offset LONG, user STRING, pages LONG, views LONG, ms LONG",
        journals=USER_TOTALS,
    ).where(F.col("user").isNotNull())  # Not the consumer's ACKs (a UUID alone).
    users = latest(totals, "user").select("user", "pages", "views", "ms")
    users.write.mode("overwrite").parquet(out)
    written = spark.read.parquet(out)
    pages = latest(
        _read(
            spark,
            broker,
            file_root,
            "journal STRING, offset LONG, user STRING, page STRING, views LONG, ms LONG",
            selector=PAGE_COUNTS,
        ),
        "user",
        "page",
    )
    stream_sum = pages.agg(F.sum("views"), F.sum("ms"), F.count("*")).first()
    consumer_sum = written.agg(F.sum("views"), F.sum("ms"), F.count("*")).first()
    assert stream_sum is not None and consumer_sum is not None
    top = written.orderBy(F.col("views").desc(), "user").limit(8).collect()
    return {
        "stream_views": int(stream_sum[0] or 0),
        "stream_ms": int(stream_sum[1] or 0),
        "stream_user_pages": int(stream_sum[2]),
        "consumer_views": int(consumer_sum[0] or 0),
        "consumer_ms": int(consumer_sum[1] or 0),
        "report_users": int(consumer_sum[2]),
        "top": [r.asDict() for r in top],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="http://localhost:8080")
    parser.add_argument("--file-root", required=True, help="the broker's file store root")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spark = SparkSession.builder.appName("pipeline-report").getOrCreate()
    print(json.dumps(report(spark, args.broker, args.file_root, args.out), indent=2))


if __name__ == "__main__":
    main()
