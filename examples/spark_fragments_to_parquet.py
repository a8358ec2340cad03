"""Batch job: a journal's fragments into Parquet.

Plans Spark partitions from the fragment listing of every journal labelled
topic=spark-clicks, reads persisted fragment files straight from their store (`file://`
stores under --file-root, the broker's file root; through the broker only what is not yet
persisted, or not reachable), and writes the click events with their journal and offset to
Parquet, partitioned by journal.

    python examples/spark_fragments_to_parquet.py --broker http://localhost:8080 \\
        --file-root data/fragments --out /tmp/clicks.parquet
"""

from __future__ import annotations

import argparse
import os

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

CLICKS = "topic=spark-clicks"


def clicks(spark: SparkSession, broker: str, file_root: str | None = None) -> DataFrame:
    reader = (
        spark.read.format("gazette")
        .schema("journal STRING, offset LONG, user STRING, page STRING, ts TIMESTAMP")
        .option("broker", broker)
        .option("selector", CLICKS)
        .option("framing", "json")
    )
    if file_root is not None:
        reader = reader.option("fileRoot", os.path.abspath(file_root))
    return reader.load()


def export(spark: SparkSession, broker: str, out: str, file_root: str | None = None) -> int:
    df = clicks(spark, broker, file_root)
    df.write.mode("overwrite").partitionBy("journal").parquet(out)
    try:
        return spark.read.parquet(out).count()
    except AnalysisException as exc:
        if exc.getCondition() != "UNABLE_TO_INFER_SCHEMA":
            raise
        return 0  # No rows were written: no partition, no file to read a schema from.


def check_journals(broker: str) -> None:
    """Exit with a one-line error, before Spark starts, when no journal holds clicks."""
    from pygazette.client import SyncJournalClient

    with SyncJournalClient(broker) as client:
        if not client.list_journals(CLICKS):
            raise SystemExit(
                f"error: no journal at {broker} matches {CLICKS}: create them with "
                "`pygazette journals apply --specs examples/spark/journalspace.yaml` and append "
                "clicks (`python examples/spark_demo.py --broker URL` does both)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="http://localhost:8080")
    parser.add_argument("--file-root", help="the broker's file root, to read file:// fragments")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    check_journals(args.broker)
    spark = SparkSession.builder.appName("fragments-to-parquet").getOrCreate()
    rows = export(spark, args.broker, args.out, args.file_root)
    print(f"wrote {rows} rows to {args.out}")


if __name__ == "__main__":
    main()
