"""PySpark integration: journals as a batch and streaming source and an exactly-once sink.

`GazetteDataSource` is the Python data source behind ``spark.read.format("gazette")``,
``readStream``, ``df.write`` and ``writeStream``; see `source` for the entry point and the
README for options, columns and the exactly-once mechanism. Requires the `spark` extra.
"""

from pygazette.spark.source import FORMAT, GazetteDataSource

__all__ = ["FORMAT", "GazetteDataSource", "register"]


def register(spark: object) -> None:
    """Register the `gazette` format with a SparkSession (Spark also finds it by itself
    through the `pyspark_gazette` module)."""
    spark.dataSource.register(GazetteDataSource)  # type: ignore[attr-defined]
