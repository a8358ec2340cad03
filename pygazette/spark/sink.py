"""`df.write.format("gazette")` and `writeStream.format("gazette")`: rows into journals.

Each row goes to the journal named by option `journal`, else by its `journal` column, else
(options `journals` or `selector` with `keyColumn`) to the journal its key maps to
(`routing`). Its bytes are the `value` column (binary or string) under framing `raw`
(verbatim), `lines` (newline-terminated, the default with a value column) or
`protobuf-fixed` (Gazette's fixed frame), or the whole row (less a routing `journal`
column) under `json` (the default without a value column) or `csv`.

A task encodes its rows per journal into a spooled temporary file, then writes each
journal's rows in one atomic append fenced by the task's register label
(`exactly_once`): every row lands in its journal exactly once across task retries,
speculative attempts and restarts of a stream from its checkpoint.
"""

from __future__ import annotations

import base64
import csv
import datetime
import decimal
import functools
import io
import logging
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructType,
)

from pygazette.client.journal_client import JournalClient
from pygazette.message.fixed_framing import encode_fixed_frame
from pygazette.message.framing import FramingError
from pygazette.protocol.errors import GazetteError, JournalNotFound
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import journal_spec_flags_allow_write
from pygazette.spark import faults, runtime
from pygazette.spark import journals as jn
from pygazette.spark.exactly_once import AppendOutcome, Fence, RowsDigest, fenced_append
from pygazette.spark.framing import Framing
from pygazette.spark.options import OptionError, WriteOptions
from pygazette.spark.routing import route
from pygazette.spark.schema import JOURNAL, VALUE

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

# Rows of a task are held in memory up to this size in all (whatever the number of journals
# they go to), then on local disk.
SPOOL_MEMORY_BYTES = 16 << 20

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class SinkError(GazetteError, ValueError):
    """Rows that cannot be written as asked (a bad value, an unknown journal...)."""


@dataclass(frozen=True)
class SinkPlan:
    """What every task of one write needs; made on the driver."""

    opts: WriteOptions
    framing: Framing
    columns: tuple[str, ...]  # Columns of the input, in order.
    targets: tuple[str, ...]  # Journals to map keys over (sorted), when mapping.
    route_by_column: bool  # Rows name their journal in a `journal` column.
    body_columns: tuple[str, ...]  # Columns written by json/csv framing.
    identity: str  # Writer identity for register labels.
    run: str = ""  # This write's run (batch writes): tells its own attempts from re-runs.


@dataclass
class SinkCommit(WriterCommitMessage):  # type: ignore[misc]
    partition: int
    attempt: int
    outcomes: list[AppendOutcome] = field(default_factory=list)
    rows: int = 0


def make_plan(opts: WriteOptions, schema: StructType, *, streaming: bool) -> SinkPlan:
    """Check the input schema against the options, and resolve the journals to map over."""
    names = tuple(f.name for f in schema.fields)
    types = {f.name: f.dataType for f in schema.fields}
    framing = opts.framing
    if framing is None:
        framing = Framing.LINES if VALUE in types else Framing.JSON
    if framing in (Framing.RAW, Framing.LINES, Framing.PROTOBUF_FIXED):
        if VALUE not in types:
            raise OptionError(f"framing {framing.value} writes the value column, which is missing")
        if not isinstance(types[VALUE], (BinaryType, StringType)):
            raise OptionError(
                f"column value must be binary or string, not {types[VALUE].simpleString()}"
            )
    route_by_column = opts.journal is None and not (opts.journals or opts.selector)
    if route_by_column:
        if JOURNAL not in types:
            raise OptionError(
                "name the journal to write: option journal, a journal column, or options "
                "journals/selector with keyColumn"
            )
        if not isinstance(types[JOURNAL], StringType):
            raise OptionError("column journal must be a string")
    if opts.key_column is not None and opts.key_column not in types:
        raise OptionError(f"keyColumn {opts.key_column!r} is not a column of the rows")
    body = tuple(n for n in names if not (route_by_column and n == JOURNAL))
    if framing is Framing.CSV:
        for name in body:
            if isinstance(types[name], (ArrayType, MapType, StructType)):
                raise OptionError(
                    f"framing csv cannot write column {name} of type "
                    f"{types[name].simpleString()} (a CSV field is text); write it with framing "
                    "json, or turn it into a string first (to_json)"
                )
    elif framing is Framing.JSON:
        for name in body:
            key = _complex_map_key(types[name])
            if key is not None:
                raise OptionError(
                    f"framing json cannot write column {name}: its map keys are of type "
                    f"{key.simpleString()}, and JSON object keys are text"
                )

    targets: tuple[str, ...] = ()
    if opts.journals or opts.selector:
        found = runtime.call(
            opts.target,
            lambda c: jn.resolve_journals(c, opts.journals, opts.selector),
        )
        if not found:
            raise OptionError(
                f"no journals to write: {opts.selector or ','.join(opts.journals)} matches none"
            )
        targets = tuple(found)
    named = list(targets) or ([opts.journal] if opts.journal is not None else [])
    if named:
        runtime.call(opts.target, functools.partial(_writable, journals=named, error=OptionError))

    if opts.writer_id is not None:
        identity = opts.writer_id
    elif streaming:
        identity = ""  # The query id, known in tasks (see _identity).
    else:
        identity = f"write-{uuid.uuid4()}"
    run = "" if streaming else uuid.uuid4().hex[:16]
    return SinkPlan(opts, framing, names, targets, route_by_column, body, identity, run)


def _complex_map_key(dt: DataType) -> DataType | None:
    """The key type of a map within `dt` whose keys are not atomic values (None if none)."""
    if isinstance(dt, MapType):
        if isinstance(dt.keyType, (ArrayType, MapType, StructType)):
            return dt.keyType
        return _complex_map_key(dt.valueType)
    if isinstance(dt, ArrayType):
        return _complex_map_key(dt.elementType)
    if isinstance(dt, StructType):
        for f in dt.fields:
            found = _complex_map_key(f.dataType)
            if found is not None:
                return found
    return None


# Encoding -------------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    import orjson

    if isinstance(value, decimal.Decimal):
        return orjson.Fragment(str(value).encode())
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def encode(
    plan: SinkPlan,
    batch: pa.RecordBatch,
    rows: list[int] | None,
    digest: RowsDigest | None = None,
) -> bytes:
    """The bytes of `rows` of `batch` (all rows if None) under the plan's framing; each row's
    record is added to `digest`, if given."""
    if rows is not None:
        import pyarrow as pa

        batch = batch.take(pa.array(rows, type=pa.int64()))
    framing = plan.framing
    if framing in (Framing.RAW, Framing.LINES, Framing.PROTOBUF_FIXED):
        values = batch.column(VALUE).to_pylist()
        encoded = []
        for v in values:
            if v is None:
                raise SinkError("column value is null; a record needs bytes")
            encoded.append(v.encode() if isinstance(v, str) else bytes(v))
        if digest is not None:
            digest.add(encoded)
        if framing is Framing.RAW:
            return b"".join(encoded)
        if framing is Framing.PROTOBUF_FIXED:
            try:
                return b"".join(encode_fixed_frame(v) for v in encoded)
            except FramingError as exc:
                raise SinkError(str(exc)) from None
        lines = [v[:-1] if v.endswith(b"\n") else v for v in encoded]
        data = b"\n".join(lines) + b"\n"
        if data.count(b"\n") != len(lines):
            bad = next(v for v in lines if b"\n" in v)
            raise SinkError(
                f"a value holds a newline inside it ({bad[:60]!r}...): framing lines writes one "
                "line per row; use framing raw to write values verbatim"
            )
        return data
    body = batch.select(list(plan.body_columns))
    if framing is Framing.JSON:
        import orjson

        for name, column in zip(body.schema.names, body.columns, strict=True):
            if _has_non_finite(column):
                raise SinkError(
                    f"column {name} holds NaN or an infinity, which JSON cannot encode (it "
                    "would be written as null); replace them, or write with framing csv"
                )
        opt = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS
        try:
            # Maps as JSON objects, as Spark's JSON writer writes them (not as lists of pairs).
            records = [
                orjson.dumps(r, default=_json_default, option=opt)
                for r in body.to_pylist(maps_as_pydicts="strict")
            ]
        except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError.
            raise SinkError(f"a row cannot be written as JSON: {exc}") from None
        if digest is not None:
            digest.add(records)
        return b"".join(records)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    ends = []
    for row in body.to_pylist():
        writer.writerow(["" if v is None else _csv_text(v) for v in row.values()])
        ends.append(out.tell())
    text = out.getvalue()
    if digest is not None:
        digest.add([text[b:e].encode() for b, e in zip([0, *ends], ends, strict=False)])
    return text.encode()


def _has_non_finite(column: pa.Array) -> bool:
    """Whether a float of `column`, at any depth (structs, lists, maps), is NaN or infinite."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = column.type
    if pa.types.is_floating(t):
        return bool(pc.any(pc.invert(pc.is_finite(column))).as_py())
    if pa.types.is_struct(t):
        return any(_has_non_finite(child) for child in column.flatten())
    if pa.types.is_map(t):
        begin, end = column.offsets[0].as_py(), column.offsets[-1].as_py()
        items = column.items.slice(begin, end - begin)
        keys = column.keys.slice(begin, end - begin)
        return _has_non_finite(keys) or _has_non_finite(items)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_non_finite(column.flatten())
    return False


def _csv_text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return str(value)


# Tasks ----------------------------------------------------------------------------------------


def _task_context() -> tuple[int, int, Any]:
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        raise SinkError("the gazette sink runs in Spark tasks only")
    return tc.partitionId(), tc.attemptNumber(), tc


def write_task(plan: SinkPlan, batches: Iterator[pa.RecordBatch], fence_of: Any) -> SinkCommit:
    """Encode this task's rows per journal, then append each journal's rows, fenced."""
    partition, attempt, _tc = _task_context()
    spools: dict[str, tempfile.SpooledTemporaryFile[bytes]] = {}
    digests: dict[str, RowsDigest] = {}
    rows = 0
    in_memory = 0  # Bytes of the spools not yet rolled over to disk.
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            rows += batch.num_rows
            for journal, idx in _route(plan, batch):
                digest = digests.get(journal) if plan.run else None
                if plan.run and digest is None:
                    digest = digests[journal] = RowsDigest()
                data = encode(plan, batch, idx, digest)
                if not data:
                    continue
                spool = spools.get(journal)
                if spool is None:
                    spool = spools[journal] = tempfile.SpooledTemporaryFile(
                        max_size=SPOOL_MEMORY_BYTES
                    )
                spool.write(data)
                in_memory += len(data)
                if in_memory > SPOOL_MEMORY_BYTES:
                    for s in spools.values():
                        s.rollover()  # Those already on disk stay as they are.
                    in_memory = 0
        commit = SinkCommit(partition, attempt, rows=rows)
        if plan.route_by_column and spools:
            # Journals named by rows are first known here: all of them must take the task's
            # appends before the first one is made.
            runtime.call(
                plan.opts.target,
                jn.patiently(functools.partial(_writable, journals=list(spools))),
            )
        fence: Fence = fence_of(partition)
        for journal in sorted(spools):
            digest = digests.get(journal)
            fenced = fence.with_rows(digest.hexdigest()) if digest is not None else fence
            # A broker restarting under the task is waited for (`journals.patiently`).
            outcome = runtime.call(
                plan.opts.target,
                jn.patiently(
                    functools.partial(_append, journal=journal, spool=spools[journal], fence=fenced)
                ),
            )
            commit.outcomes.append(outcome)
        return commit
    finally:
        for spool in spools.values():
            spool.close()


async def _writable(
    client: JournalClient, *, journals: list[str], error: type[GazetteError] = SinkError
) -> None:
    """Fail with `error` unless every journal exists and takes appends. Unchecked when the
    broker refuses to list them: a writer's token may allow appends only."""
    import grpc

    selector = pb.LabelSelector(
        include=pb.LabelSet(labels=[pb.Label(name="name", value=j) for j in sorted(journals)])
    )
    try:
        listed = await jn.list_specs(client, selector)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
            raise
        log.info("journals %s not checked before appending: %s", journals, exc.details())
        return
    specs = {j.spec.name: j.spec for j in listed}
    for journal in sorted(journals):
        spec = specs.get(journal)
        if spec is None:
            raise error(f"journal {journal} does not exist")
        if not journal_spec_flags_allow_write(spec):
            raise error(f"journal {journal} is read-only (its flags refuse appends)")


async def _append(
    client: JournalClient, *, journal: str, spool: Any, fence: Fence
) -> AppendOutcome:
    try:
        return await fenced_append(client, journal, spool, fence, on_commit=faults.after_append)
    except JournalNotFound:
        raise SinkError(f"journal {journal} does not exist") from None


def _route(plan: SinkPlan, batch: pa.RecordBatch) -> Iterator[tuple[str, list[int] | None]]:
    """(journal, row indices) of the batch's rows (None: all of them)."""
    import numpy as np
    import pyarrow.compute as pc

    opts = plan.opts
    if opts.journal is not None:
        yield opts.journal, None
        return
    if plan.route_by_column:
        column = batch.column(JOURNAL)
        if column.null_count:
            raise SinkError("column journal is null for some rows; every row needs a journal")
        encoded = pc.dictionary_encode(column)
        names = encoded.dictionary.to_pylist()
        indices = np.asarray(encoded.indices)
        for i, name in enumerate(names):
            jn_valid = _check_journal(name)
            yield jn_valid, np.flatnonzero(indices == i).tolist()
        return
    assert opts.key_column is not None
    which = route(batch.column(opts.key_column), list(plan.targets), opts.partitioner)
    for i in np.unique(which).tolist():
        yield plan.targets[i], np.flatnonzero(which == i).tolist()


def _check_journal(name: str) -> str:
    from pygazette.protocol.errors import ValidationError
    from pygazette.protocol.validation import validate_journal_name

    try:
        validate_journal_name(name, allow_meta=False)
    except ValidationError as exc:
        raise SinkError(f"column journal holds an invalid journal name {name!r}: {exc}") from None
    return name


# Spark writers -------------------------------------------------------------------------------


class GazetteBatchWriter(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        identity, run = self.plan.identity, self.plan.run
        return write_task(self.plan, iterator, lambda p: Fence.for_batch(identity, p, run))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_outcomes("batch write", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        committed = [m for m in messages if isinstance(m, SinkCommit)]
        log.warning(
            "batch write %s failed after %d of its %d tasks committed their rows, and a failed "
            "task may have appended its rows to some of its journals (journals are append-only: "
            "nothing is rolled back). Re-run it with option writerId=%s to write the rest "
            "exactly once: each partition skips the journals already holding its rows.",
            self.plan.identity,
            len(committed),
            len(messages),
            self.plan.identity,
        )


class GazetteStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        plan = self.plan
        _p, _a, tc = _task_context()
        batch_id = tc.getLocalProperty(BATCH_ID_PROPERTY)
        if batch_id is None:
            raise SinkError("the gazette stream sink found no micro-batch id in its task")
        identity = plan.identity or _stream_identity(tc, plan)
        epoch = int(batch_id)
        query = tc.getLocalProperty(QUERY_ID_PROPERTY) or ""
        return write_task(plan, iterator, lambda p: Fence.for_stream(identity, p, epoch, query))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_outcomes(f"micro-batch {batchId}", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "micro-batch %d failed; it is retried from the checkpoint, and journals already "
            "holding its rows are skipped",
            batchId,
        )


def _stream_identity(tc: Any, plan: SinkPlan) -> str:
    query_id = tc.getLocalProperty(QUERY_ID_PROPERTY)
    if query_id:
        return f"query-{query_id}"
    if plan.opts.checkpoint_location:
        return f"checkpoint-{os.path.abspath(plan.opts.checkpoint_location)}"
    raise SinkError("the gazette stream sink cannot tell its query apart: set option writerId")


def _log_outcomes(what: str, messages: list[WriterCommitMessage | None]) -> None:
    appended = skipped = rows = 0
    for m in messages:
        if isinstance(m, SinkCommit):
            rows += m.rows
            for o in m.outcomes:
                if o.appended:
                    appended += 1
                else:
                    skipped += 1
    log.info("%s committed: %d rows, %d appends, %d already written", what, rows, appended, skipped)
