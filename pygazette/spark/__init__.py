"""PySpark integration: journals as a batch and streaming source and an exactly-once sink.

`GazetteDataSource` is the Python data source behind ``spark.read.format("gazette")``,
``readStream``, ``df.write`` and ``writeStream``; see `source` for the entry point and the
README for options, columns and the exactly-once mechanism. Requires the `spark` extra.
The names below are imported on first use, so the package's other modules load without
PySpark until they need it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pygazette.spark.source import FORMAT, GazetteDataSource

__all__ = ["FORMAT", "GazetteDataSource", "register"]

# Where each exported name is defined. A name's module is imported when the name is first
# used (PEP 562), so importing one module of the package imports no other.
_EXPORTS: dict[str, str] = {
    "FORMAT": "pygazette.spark.source",
    "GazetteDataSource": "pygazette.spark.source",
}

if not TYPE_CHECKING:  # Type checkers see the imports above instead.

    def __getattr__(name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})


def register(spark: object) -> None:
    """Register the `gazette` format with a SparkSession (Spark also finds it by itself
    through the `pyspark_gazette` module)."""
    from pygazette.spark.source import GazetteDataSource

    spark.dataSource.register(GazetteDataSource)  # type: ignore[attr-defined]
