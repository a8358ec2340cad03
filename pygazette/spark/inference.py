"""Schema inference of JSON and CSV journals, from a sample of their records.

JSON types are inferred by Arrow's JSON reader over up to `SAMPLE_BYTES` of whole records
per journal (at most `SAMPLE_JOURNALS` journals), unified across journals, and mapped to
Spark types as Spark's own JSON inference would: strings stay strings (Arrow would turn
ISO-8601 strings into timestamps), all-null fields are strings, fields are sorted by name.
CSV columns are `_c0`, `_c1`, ... strings, as Spark's CSV reader names them without a
header.

Streams should pass an explicit schema: an inferred one can change between restarts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from pygazette.client.errors import OffsetJump
from pygazette.client.journal_client import JournalClient
from pygazette.client.retry_reader import RetryReader
from pygazette.message.csv_framing import CSVFraming
from pygazette.message.csv_framing import record_end as csv_record_end
from pygazette.message.framing import MessageDecodeError
from pygazette.protocol.errors import OffsetNotYetAvailable
from pygazette.spark import framing as fr
from pygazette.spark.framing import Framing, RecordError
from pygazette.spark.schema import SchemaError

if TYPE_CHECKING:
    import pyarrow as pa

SAMPLE_BYTES = 1 << 20
SAMPLE_JOURNALS = 8


async def sample(client: JournalClient, journal: str, begin: int, end: int) -> bytes:
    """Up to SAMPLE_BYTES of whole records of [begin, end), begin being a record boundary."""
    stop = min(end, begin + SAMPLE_BYTES)
    if stop <= begin:
        return b""
    rr = RetryReader(client, journal, offset=begin, end_offset=stop, block=False)
    parts: list[bytes] = []
    try:
        while True:
            try:
                chunk = await rr.read()
            except OffsetJump:
                parts = []  # Content resumes at a fragment (and record) boundary.
                continue
            except OffsetNotYetAvailable:
                break
            if not chunk:
                break
            parts.append(chunk)
    finally:
        await rr.aclose()
    data = b"".join(parts)
    if stop < end:
        cut = data.rfind(b"\n")
        data = data[: cut + 1] if cut >= 0 else b""
    return data


def infer_json(samples: list[bytes]) -> StructType:
    import pyarrow as pa

    schemas = []
    for data in samples:
        if not data.strip():
            continue
        spans = fr.scan(Framing.JSON, data, final=True)
        spans = spans.mask(~fr.blank_records(Framing.JSON, data, spans))
        if not len(spans):
            continue
        try:
            table = fr.parse_json(data, spans, None, describe=lambda _s: "sampled records")
        except RecordError as exc:
            raise SchemaError(f"cannot infer a JSON schema: {exc}") from None
        schemas.append(table.schema)
    if not schemas:
        raise SchemaError(
            "cannot infer a JSON schema: the journals hold no records to sample; "
            "pass a schema (spark.read.schema / readStream.schema)"
        )
    try:
        unified = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise SchemaError(f"JSON records of the journals disagree on types: {exc}") from None
    fields = sorted(unified, key=lambda f: f.name)  # Sorted, as Spark's JSON inference does.
    return StructType([StructField(f.name, arrow_to_spark(f.type), True) for f in fields])


def arrow_to_spark(t: pa.DataType) -> DataType:
    """Spark's type for an inferred Arrow type."""
    import pyarrow as pa
    import pyarrow.types as pt

    if pt.is_boolean(t):
        return BooleanType()
    if pt.is_integer(t):
        return LongType()
    if pt.is_floating(t):
        return DoubleType()
    if pt.is_struct(t):
        return StructType(
            [
                StructField(f.name, arrow_to_spark(f.type), True)
                for f in sorted((t.field(i) for i in range(t.num_fields)), key=lambda f: f.name)
            ]
        )
    if pt.is_list(t) or pt.is_large_list(t):
        return ArrayType(arrow_to_spark(t.value_type), True)
    if pt.is_map(t):
        return MapType(arrow_to_spark(t.key_type), arrow_to_spark(t.item_type), True)
    if pt.is_binary(t) or pt.is_large_binary(t):
        return BinaryType()
    if isinstance(t, pa.DataType):
        return StringType()  # Strings, timestamps parsed from strings, nulls.
    raise TypeError(f"not an Arrow type: {t!r}")


def infer_csv(samples: list[bytes]) -> StructType:
    """As many columns as the first CSV record of the samples has fields, read as the CSV
    framing reads records (Go's rules: quoted fields across lines, fields of any size)."""
    framing = CSVFraming()
    for data in samples:
        pos = 0
        while pos < len(data):
            end = csv_record_end(data, pos)
            record = data[pos:] if end < 0 else data[pos:end]  # Without its LF.
            pos = len(data) if end < 0 else end + 1
            if framing.is_blank(record):
                continue
            try:
                fields = framing.unmarshal(record)
            except MessageDecodeError:
                continue  # Not a record a reader would take: the next one.
            return StructType(
                [StructField(f"_c{i}", StringType(), True) for i in range(len(fields))]
            )
    raise SchemaError(
        "cannot infer CSV columns: the journals hold no records to sample; "
        "pass a schema (spark.read.schema / readStream.schema)"
    )
