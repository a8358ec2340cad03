"""Batch job: a journal's fragments into Parquet.

Plans Spark partitions from the fragment listing of every journal labelled
topic=spark-clicks, reads persisted fragment files straight from their store (through the
broker only what is not yet persisted, or not reachable), and writes the click events with
their journal and offset to Parquet, partitioned by journal.

    python examples/spark_fragments_to_parquet.py --broker http://localhost:8080 \\
        --out /tmp/clicks.parquet
"""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession

CLICKS = "topic=spark-clicks"


def clicks(spark: SparkSession, broker: str) -> DataFrame:
    return (
        spark.read.format("gazette")
        .schema("journal STRING, offset LONG, user STRING, page STRING, ts TIMESTAMP")
        .option("broker", broker)
        .option("selector", CLICKS)
        .option("framing", "json")
        .load()
    )


def export(spark: SparkSession, broker: str, out: str) -> int:
    df = clicks(spark, broker)
    df.write.mode("overwrite").partitionBy("journal").parquet(out)
    return spark.read.parquet(out).count()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="http://localhost:8080")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spark = SparkSession.builder.appName("fragments-to-parquet").getOrCreate()
    print(f"wrote {export(spark, args.broker, args.out)} rows to {args.out}")


if __name__ == "__main__":
    main()
