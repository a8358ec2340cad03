"""Schema inference of JSON and CSV journals, from a sample of their records.

JSON types are inferred from the values of up to `SAMPLE_BYTES` of whole records per journal
(at most `SAMPLE_JOURNALS` journals) and merged across records and journals by Spark's own
rules (`json_inference`): strings stay strings, a field of several types has their common
type (string when there is none), all-null fields are strings, fields are sorted by name.
CSV columns are `_c0`, `_c1`, ... strings, as Spark's CSV reader names them without a
header.

Streams should pass an explicit schema: an inferred one can change between restarts.
"""

from __future__ import annotations

from pyspark.sql.types import DataType, StringType, StructField, StructType

from pygazette.client.errors import OffsetJump
from pygazette.client.journal_client import JournalClient
from pygazette.client.retry_reader import RetryReader
from pygazette.message.csv_framing import CSVFraming
from pygazette.message.csv_framing import record_end as csv_record_end
from pygazette.message.framing import MessageDecodeError
from pygazette.protocol.errors import OffsetNotYetAvailable
from pygazette.spark import framing as fr
from pygazette.spark.framing import Framing, RecordError
from pygazette.spark.json_inference import arrow_type, finish, merge, value_type
from pygazette.spark.schema import SchemaError

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
    """The schema of the samples' JSON records, merged as Spark's JSON inference merges the
    types of a field (`json_inference`): a field of several types within a journal, or
    across journals, has their common type (string when there is none). Arrow's reader
    types a sample whose fields each have one type; the others are typed from their
    values."""
    schema: DataType = StructType([])
    found = False
    for data in samples:
        if not data.strip():
            continue
        spans = fr.scan(Framing.JSON, data, final=True)
        spans = spans.mask(~fr.blank_records(Framing.JSON, data, spans))
        if not len(spans):
            continue
        try:
            table = fr.parse_json(data, spans, None, describe=lambda _s: "sampled records")
            sample_type = arrow_type(table.schema)
        except RecordError:  # Invalid JSON, or a field of several types.
            sample_type = _values_type(data, spans)
        schema = merge(schema, sample_type)
        found = True
    if not found:
        raise SchemaError(
            "cannot infer a JSON schema: the journals hold no records to sample; "
            "pass a schema (spark.read.schema / readStream.schema)"
        )
    out = finish(schema)
    assert isinstance(out, StructType)
    return out


def _values_type(data: bytes, spans: fr.RecordSpans) -> DataType:
    import orjson

    out: DataType = StructType([])
    for lo, hi in zip(spans.value_starts.tolist(), spans.value_ends.tolist(), strict=True):
        try:
            record = orjson.loads(data[lo:hi])
        except orjson.JSONDecodeError as exc:
            raise SchemaError(
                f"cannot infer a JSON schema: invalid JSON record: {exc}: {data[lo:hi][:80]!r}"
            ) from None
        if not isinstance(record, dict):
            raise SchemaError(
                f"cannot infer a JSON schema: a record is not an object: {data[lo:hi][:80]!r}"
            )
        out = merge(out, value_type(record))
    return out


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
