"""Spark's hook for the `gazette` data source.

PySpark registers the `DefaultSource` of every importable top-level module named
``pyspark_*`` when a session first looks a Python data source up, so
``spark.read.format("gazette")`` works without calling `spark.dataSource.register`.
"""

from pygazette.spark.source import GazetteDataSource as DefaultSource

__all__ = ["DefaultSource"]
