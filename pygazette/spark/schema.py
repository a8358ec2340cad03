"""The columns the connector reads, for each framing, and checks of user-given schemas.

Metadata columns: `journal` (string), `offset` (long, the record's begin offset) and
`fragment_mod_time` (timestamp of the fragment's persistence, null for content still in a
broker's spool). The record itself is `value` (binary; for `lines` also string) for raw,
lines and protobuf-fixed, and the parsed columns for json and csv.

A user schema (`spark.read.schema(...)`) is the output schema: columns named like the
metadata columns are filled with metadata, every other column comes from the record.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.types import (
    BinaryType,
    DataType,
    LongType,
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pygazette.spark.framing import Framing
from pygazette.spark.options import OptionError

JOURNAL = "journal"
OFFSET = "offset"
VALUE = "value"
FRAGMENT_MOD_TIME = "fragment_mod_time"

METADATA_TYPES: dict[str, DataType] = {
    JOURNAL: StringType(),
    OFFSET: LongType(),
    FRAGMENT_MOD_TIME: TimestampType(),
}


class SchemaError(OptionError):
    """A user schema the framing cannot fill."""


def default_schema(framing: Framing, data: StructType | None = None) -> StructType:
    """journal, offset, the record's columns, fragment_mod_time."""
    fields = [StructField(JOURNAL, StringType(), False), StructField(OFFSET, LongType(), False)]
    if framing in (Framing.JSON, Framing.CSV):
        assert data is not None
        for f in data.fields:
            if f.name in METADATA_TYPES:
                raise SchemaError(
                    f"{framing.value} records have a field {f.name!r}, which is also a "
                    "metadata column: pass a schema (spark.read.schema) to choose"
                )
            fields.append(f)
    else:
        fields.append(StructField(VALUE, BinaryType(), True))
    fields.append(StructField(FRAGMENT_MOD_TIME, TimestampType(), True))
    return StructType(fields)


def to_spark_data_type(dt: DataType) -> DataType:
    """Inferred types as Spark's JSON inference would have them (null-only is string)."""
    if isinstance(dt, NullType):
        return StringType()
    return dt


@dataclass(frozen=True)
class Layout:
    """How a schema's columns are filled: metadata by name, the rest from the record."""

    schema: StructType
    framing: Framing
    data: StructType  # The record's columns (json/csv), in schema order.
    value_type: str | None  # "binary" | "string" for raw/lines/protobuf-fixed with a value.

    @property
    def has_data(self) -> bool:
        return len(self.data.fields) > 0


def layout(schema: StructType, framing: Framing) -> Layout:
    """Check `schema` against the framing, and say how to fill each of its columns."""
    data_fields: list[StructField] = []
    value_type: str | None = None
    for f in schema.fields:
        expected = METADATA_TYPES.get(f.name)
        if expected is not None:
            if f.dataType != expected:
                raise SchemaError(
                    f"column {f.name} must be {expected.simpleString()}, "
                    f"not {f.dataType.simpleString()}"
                )
            continue
        if framing in (Framing.JSON, Framing.CSV):
            data_fields.append(f)
            continue
        if f.name != VALUE:
            raise SchemaError(
                f"column {f.name!r} cannot be read with framing {framing.value}: its columns "
                f"are {JOURNAL}, {OFFSET}, {VALUE} and {FRAGMENT_MOD_TIME}"
            )
        if isinstance(f.dataType, BinaryType):
            value_type = "binary"
        elif isinstance(f.dataType, StringType) and framing is Framing.LINES:
            value_type = "string"
        else:
            allowed = "binary or string" if framing is Framing.LINES else "binary"
            raise SchemaError(
                f"column value must be {allowed} with framing {framing.value}, "
                f"not {f.dataType.simpleString()}"
            )
    return Layout(schema, framing, StructType(data_fields), value_type)
