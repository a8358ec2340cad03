"""`spark.readStream.format("gazette")`: framings, admission control, Trigger.AvailableNow,
restarts from checkpoints, journal discovery and data loss."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from pygazette.client import SyncJournalClient
from pygazette.message.fixed_framing import encode_fixed_frame
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import append_each, json_records, wait_for, wait_persisted
from tests.support.spark_session import create_journals, journal_spec


def stream(
    spark: SparkSession, broker: BrokerProcess, schema: str | None = None, **options: str
) -> DataFrame:
    r = spark.readStream.format("gazette").option("broker", broker.url)
    if schema is not None:
        r = r.schema(schema)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


class Batches:
    """A foreachBatch sink that keeps every micro-batch's rows (driver side)."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.batches.append(df.collect())

    @property
    def rows(self) -> list[Any]:
        return [r for b in self.batches for r in b]


def drain(df: DataFrame, checkpoint: Path, sink: Batches | None = None) -> Batches:
    """Run the query with Trigger.AvailableNow until it stops by itself."""
    sink = sink if sink is not None else Batches()
    query = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=180)
    assert not query.isActive, "Trigger.AvailableNow did not stop"
    if query.exception() is not None:
        raise query.exception()  # type: ignore[misc]
    return sink


def direct_reader(broker: BrokerProcess, framing: str = "lines", **options: str) -> Any:
    """The stream reader Spark makes of these options, to call without Spark."""
    from pygazette.spark.options import parse_read_options
    from pygazette.spark.schema import default_schema, layout
    from pygazette.spark.stream_reader import GazetteStreamReader

    opts = parse_read_options({"broker": broker.url, "framing": framing, **options}, streaming=True)
    return GazetteStreamReader(opts, layout(default_schema(opts.framing), opts.framing))


def offsets_of(records: list[bytes], base: int = 0) -> list[int]:
    out, offset = [], base
    for r in records:
        out.append(offset)
        offset += len(r)
    return out


def test_framings_and_admission_control(
    spark: SparkSession,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    tmp_path: Path,
) -> None:
    lines, fixed, table = prefix + "lines", prefix + "fixed", prefix + "csv"
    create_journals(
        gz, journal_spec(lines, fragment_length=2048), journal_spec(fixed), journal_spec(table)
    )
    records = json_records(0, 300, pad=8)
    append_each(gz, lines, [b"".join(records[i : i + 25]) for i in range(0, 300, 25)])
    wait_persisted(gz, lines, 2048)  # Some of it is read straight from fragment files.

    # Bytes per trigger: every batch within budget, ending on a record boundary.
    budget = 4000
    got = drain(
        stream(
            spark,
            spark_broker,
            journals=lines,
            framing="lines",
            startingOffsets="earliest",
            maxBytesPerTrigger=str(budget),
        ),
        tmp_path / "bytes",
    )
    assert [r.offset for r in sorted(got.rows, key=lambda r: r.offset)] == offsets_of(records)
    sizes = [sum(len(r.value) + 1 for r in b) for b in got.batches]
    assert all(size <= budget for size in sizes)
    assert len([s for s in sizes if s]) >= sum(map(len, records)) // budget

    # Records per trigger, JSON with a schema.
    got = drain(
        stream(
            spark,
            spark_broker,
            "offset LONG, n LONG",
            journals=lines,
            framing="json",
            startingOffsets="earliest",
            maxRecordsPerTrigger="70",
        ),
        tmp_path / "records",
    )
    assert [len(b) for b in got.batches if b] == [70, 70, 70, 70, 20]
    assert sorted(r.n for r in got.rows) == list(range(300))

    payloads = [b"p%d" % i * (i % 4 + 1) for i in range(120)]
    append_each(
        gz,
        fixed,
        [b"".join(encode_fixed_frame(p) for p in payloads[i : i + 30]) for i in range(0, 120, 30)],
    )
    got = drain(
        stream(
            spark,
            spark_broker,
            journals=fixed,
            framing="protobuf-fixed",
            startingOffsets="earliest",
            maxBytesPerTrigger="400",
        ),
        tmp_path / "fixed",
    )
    assert [r.value for r in sorted(got.rows, key=lambda r: r.offset)] == payloads
    assert max(len(b) for b in got.batches) < 120

    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([[i, f"a\nb{i}"] for i in range(40)])
    append_each(gz, table, [buf.getvalue().encode()])
    got = drain(
        stream(
            spark,
            spark_broker,
            "id INT, text STRING",
            journals=table,
            framing="csv",
            startingOffsets="earliest",
            maxRecordsPerTrigger="15",
        ),
        tmp_path / "csv",
    )
    assert sorted((r.id, r.text) for r in got.rows) == [(i, f"a\nb{i}") for i in range(40)]
    assert [len(b) for b in got.batches if b] == [15, 15, 10]


def test_restart_from_checkpoint_without_gaps_or_duplicates(
    spark: SparkSession,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    tmp_path: Path,
) -> None:
    j = prefix + "events"
    create_journals(gz, journal_spec(j, fragment_length=4096))
    first = json_records(0, 100)
    append_each(gz, j, [b"".join(first)])
    checkpoint = tmp_path / "checkpoint"
    out = tmp_path / "out"

    def run() -> None:
        df = stream(
            spark,
            spark_broker,
            "journal STRING, offset LONG, n LONG",
            journals=j,
            framing="json",
            startingOffsets="earliest",
            maxRecordsPerTrigger="30",
        )
        query = (
            df.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(timeout=180)
        assert query.exception() is None

    run()
    second = json_records(100, 150)
    append_each(gz, j, [b"".join(second[i : i + 50]) for i in range(0, 150, 50)])
    run()
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.n for r in rows) == list(range(250))
    assert sorted(r.offset for r in rows) == offsets_of(first + second)


def test_new_journals_are_discovered(
    spark: SparkSession,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    tmp_path: Path,
) -> None:
    topic = prefix.strip("/").replace("/", ".")
    a, b = prefix + "a", prefix + "b"
    create_journals(gz, journal_spec(a, labels={"topic": topic}))
    append_each(gz, a, [b"".join(json_records(0, 10))])
    sink = Batches()
    query = (
        stream(
            spark,
            spark_broker,
            "journal STRING, n LONG",
            selector=f"topic={topic}",
            framing="json",
            startingOffsets="earliest",
        )
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()
        assert sorted(r.n for r in sink.rows) == list(range(10))
        create_journals(gz, journal_spec(b, labels={"topic": topic}))
        append_each(gz, b, [b"".join(json_records(10, 5))])
        append_each(gz, a, [b"".join(json_records(15, 5))])
        query.processAllAvailable()
        wait_for(lambda: len(sink.rows) >= 20, what="rows of the new journal")
    finally:
        query.stop()
    assert sorted((r.journal, r.n) for r in sink.rows) == sorted(
        [(a, n) for n in [*range(10), *range(15, 20)]] + [(b, n) for n in range(10, 15)]
    )


def test_data_loss_fails_the_query_or_is_skipped(
    spark: SparkSession,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    tmp_path: Path,
) -> None:
    from tests.spark.test_batch_read import fragment_file

    j = prefix + "lossy"
    create_journals(gz, journal_spec(j, fragment_length=1024))
    append_each(gz, j, [b"".join(json_records(0, 20, pad=40))])
    checkpoint = tmp_path / "checkpoint"

    def query(fail: str) -> DataFrame:
        return stream(
            spark,
            spark_broker,
            "n LONG",
            journals=j,
            framing="json",
            startingOffsets="earliest",
            failOnDataLoss=fail,
            fileRoot=str(spark_broker.file_root),
        )

    first = drain(query("true"), checkpoint)
    assert sorted(r.n for r in first.rows) == list(range(20))
    # Two more fragments; the first of them is removed before the query reads it.
    append_each(
        gz, j, [b"".join(json_records(20, 20, pad=40)), b"".join(json_records(40, 20, pad=40))]
    )
    frags = wait_persisted(gz, j, gz.list_all_fragments(j)[-1].spec.end)
    lost = fragment_file(spark_broker, gz, j, 1)
    lost.unlink()
    wait_for(
        lambda: frags[1].begin not in {f.spec.begin for f in gz.list_all_fragments(j)},
        what="the broker to drop the removed fragment",
    )
    with pytest.raises(PySparkException, match=r"data loss in journal .*lossy: offsets \["):
        drain(query("true"), checkpoint)
    rest = drain(query("false"), checkpoint)
    assert sorted(r.n for r in rest.rows) == list(range(40, 60))

    # An offset to start from past the write head is an option error; a write head below
    # the offset a query has read up to (its checkpoint's journal lost data) is a data loss.
    beyond = stream(
        spark,
        spark_broker,
        "n LONG",
        journals=j,
        framing="json",
        startingOffsets=json.dumps({j: 10**9}),
    )
    with pytest.raises(PySparkException, match=r"startingOffsets of .* is past its write head"):
        drain(beyond, tmp_path / "beyond")
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from pygazette.spark.partition_reader import DataLossError

    reader = direct_reader(spark_broker, "raw", journals=j)
    rev = gz.list_journals(f"name={j}")[0].create_revision
    with pytest.raises(DataLossError, match=r"write head .* is below the offset"):
        reader.latestOffset({j: [10**9, rev]}, ReadAllAvailable())


def test_a_journal_deleted_under_a_planned_micro_batch_is_data_loss(
    spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    # No Spark session: the driver's and executors' calls of the stream reader, by hand.
    from pygazette.protocol.pb import protocol_pb2 as pb
    from pygazette.spark.framing import Framing
    from pygazette.spark.options import parse_read_options
    from pygazette.spark.partition_reader import DataLossError
    from pygazette.spark.schema import default_schema, layout
    from pygazette.spark.stream_reader import GazetteStreamReader

    kept, gone = prefix + "kept", prefix + "gone"
    create_journals(gz, journal_spec(kept), journal_spec(gone))
    for j in (kept, gone):
        append_each(gz, j, [b"".join(json_records(0, 10))])

    def reader(fail: str) -> GazetteStreamReader:
        opts = parse_read_options(
            {
                "broker": spark_broker.url,
                "journals": f"{kept},{gone}",
                "framing": "lines",
                "startingOffsets": "earliest",
                "minPartitions": "2",
                "failOnDataLoss": fail,
            },
            streaming=True,
        )
        return GazetteStreamReader(opts, layout(default_schema(Framing.LINES), Framing.LINES))

    def values(r: GazetteStreamReader, parts: list[Any]) -> list[tuple[str, bytes]]:
        return [
            (row["journal"], row["value"])
            for part in parts
            for batch in r.read(part)
            for row in batch.to_pylist()
        ]

    r = reader("false")
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    parts = r.partitions(start, end)  # Sent to executors, which read after the deletion.
    gz.apply_journals([pb.ApplyRequest.Change(delete=gone, expect_mod_revision=-1)])
    wait_for(lambda: not gz.list_journals(f"name={gone}"), what="the journal to be deleted")
    kept_rows = [(kept, r.rstrip(b"\n")) for r in json_records(0, 10)]
    assert values(r, parts) == kept_rows
    # The micro-batch replayed after a restart: planned again, with the same partitions.
    again = r.partitions(start, end)
    assert [len(p.pieces) for p in again] == [0, 1]  # (gone's chunk, lost; kept's)
    assert values(r, again) == kept_rows
    with pytest.raises(DataLossError, match=rf"data loss in journal {gone}: offsets \[0, "):
        reader("true").partitions(start, end)


def test_a_journal_deleted_while_a_trigger_looks_at_it_stays_where_it_was(
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The trigger lists the journals, then asks their heads: a journal deleted in between is
    # listed but has no head. It was an error (the query failed); it is left where it was.
    from pygazette.protocol.pb import protocol_pb2 as pb
    from pygazette.spark import journals as jn
    from pygazette.spark import stream_reader
    from pygazette.spark.framing import Framing
    from pygazette.spark.options import parse_read_options
    from pygazette.spark.schema import default_schema, layout

    topic = prefix.strip("/").replace("/", ".")
    kept, gone, fresh = prefix + "kept", prefix + "gone", prefix + "fresh"
    for j in (kept, gone):
        create_journals(gz, journal_spec(j, labels={"topic": topic}))
        append_each(gz, j, [b"".join(json_records(0, 10))])
    opts = parse_read_options(
        {
            "broker": spark_broker.url,
            "selector": f"topic={topic}",
            "framing": "lines",
            "startingOffsets": "earliest",
            "maxBytesPerTrigger": "100000",
        },
        streaming=True,
    )
    reader = stream_reader.GazetteStreamReader(
        opts, layout(default_schema(Framing.LINES), Framing.LINES)
    )
    start = reader.initialOffset()
    rev = {j: gz.list_journals(f"name={j}")[0].create_revision for j in (kept, gone)}
    assert start == {gone: [0, rev[gone]], kept: [0, rev[kept]]}
    listed_before = jn.journal_revisions

    async def listed_before_the_deletion(*args: Any, **kwargs: Any) -> dict[str, int]:
        return {**await listed_before(*args, **kwargs), gone: rev[gone], fresh: rev[gone] + 1}

    gz.apply_journals([pb.ApplyRequest.Change(delete=gone, expect_mod_revision=-1)])
    wait_for(lambda: not gz.list_journals(f"name={gone}"), what="the journal to be deleted")
    monkeypatch.setattr(stream_reader.jn, "journal_revisions", listed_before_the_deletion)
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    kept_end = sum(map(len, json_records(0, 10)))
    assert end == {gone: [0, rev[gone]], kept: [kept_end, rev[kept]]}


def test_a_journal_deleted_and_recreated_past_the_offsets_is_data_loss_and_read_anew(
    spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    # A journal deleted and created again, whose new write head is past the offset the query
    # read up to: its create revision, kept in the offsets, tells it from the old journal.
    from pygazette.protocol.pb import protocol_pb2 as pb
    from pygazette.spark.framing import Framing
    from pygazette.spark.options import parse_read_options
    from pygazette.spark.partition_reader import DataLossError
    from pygazette.spark.schema import default_schema, layout
    from pygazette.spark.stream_reader import GazetteStreamReader

    j = prefix + "reborn"
    create_journals(gz, journal_spec(j))
    old = json_records(0, 10)
    append_each(gz, j, [b"".join(old)])

    def reader(fail: str) -> GazetteStreamReader:
        opts = parse_read_options(
            {
                "broker": spark_broker.url,
                "journals": j,
                "framing": "lines",
                "startingOffsets": "earliest",
                "failOnDataLoss": fail,
            },
            streaming=True,
        )
        return GazetteStreamReader(opts, layout(default_schema(Framing.LINES), Framing.LINES))

    def values(r: GazetteStreamReader, start: Any, end: Any) -> list[bytes]:
        parts = r.partitions(start, end)
        return [row["value"] for p in parts for b in r.read(p) for row in b.to_pylist()]

    r = reader("true")
    start = r.initialOffset()
    read_to = r.latestOffset(start, r.getDefaultReadLimit())
    revision = gz.list_journals(f"name={j}")[0].create_revision
    assert read_to == {j: [len(b"".join(old)), revision]}
    assert values(r, start, read_to) == [x.rstrip(b"\n") for x in old]

    gz.apply_journals([pb.ApplyRequest.Change(delete=j, expect_mod_revision=-1)])
    wait_for(lambda: not gz.list_journals(f"name={j}"), what="the journal to be deleted")
    spec = journal_spec(j)
    spec.fragment.stores[:] = ["file:///recreated/"]  # Not the old journal's fragments.
    create_journals(gz, spec)
    new = json_records(1000, 30, pad=7)  # Offset read_to falls inside a record of these.
    append_each(gz, j, [b"".join(new)])
    assert gz.list_journals(f"name={j}")[0].create_revision != revision

    with pytest.raises(DataLossError, match=rf"journal {j}: it was deleted and created again"):
        reader("true").latestOffset(read_to, r.getDefaultReadLimit())
    r = reader("false")
    anew = r.latestOffset(read_to, r.getDefaultReadLimit())
    recreated = gz.list_journals(f"name={j}")[0].create_revision
    assert anew == {j: [0, recreated]}  # Enters at the new journal's beginning...
    assert values(r, read_to, anew) == []
    end = r.latestOffset(anew, r.getDefaultReadLimit())
    assert end == {j: [len(b"".join(new)), recreated]}
    assert values(r, anew, end) == [x.rstrip(b"\n") for x in new]  # ...and reads it whole.

    # An offset of a checkpoint older than revisions (a bare byte offset) is read as it is.
    legacy = r.latestOffset({j: len(new[0])}, r.getDefaultReadLimit())
    assert legacy == end
    assert values(r, {j: len(new[0])}, legacy) == [x.rstrip(b"\n") for x in new[1:]]

    # Recreated again under a planned micro-batch (replayed after a restart): its range is lost.
    gz.apply_journals([pb.ApplyRequest.Change(delete=j, expect_mod_revision=-1)])
    wait_for(lambda: not gz.list_journals(f"name={j}"), what="the journal to be deleted")
    spec.fragment.stores[:] = ["file:///recreated-again/"]
    create_journals(gz, spec)
    append_each(gz, j, [b"".join(json_records(2000, 40, pad=9))])
    with pytest.raises(DataLossError, match=rf"data loss in journal {j}: offsets \[0, "):
        reader("true").partitions(anew, end)
    assert values(reader("false"), anew, end) == []


def test_trigger_available_now_does_not_read_a_journal_recreated_since_it_started(
    spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    # Trigger.AvailableNow reads up to the heads of the moment the query starts. A journal
    # deleted and created again since then is another journal: the old one's head is no
    # offset of it (it may fall inside a record), so the query does not read it (the next
    # query does, from where this one leaves it: its beginning).
    from pygazette.protocol.pb import protocol_pb2 as pb
    from pygazette.spark.framing import Framing
    from pygazette.spark.options import parse_read_options
    from pygazette.spark.schema import default_schema, layout
    from pygazette.spark.stream_reader import GazetteStreamReader

    j = prefix + "reborn-now"
    create_journals(gz, journal_spec(j))
    old = json_records(0, 10)
    append_each(gz, j, [b"".join(old)])
    opts = parse_read_options(
        {
            "broker": spark_broker.url,
            "journals": j,
            "framing": "lines",
            "startingOffsets": "earliest",
            "failOnDataLoss": "false",
        },
        streaming=True,
    )
    r = GazetteStreamReader(opts, layout(default_schema(Framing.LINES), Framing.LINES))
    r.prepareForTriggerAvailableNow()
    start = r.initialOffset()

    gz.apply_journals([pb.ApplyRequest.Change(delete=j, expect_mod_revision=-1)])
    wait_for(lambda: not gz.list_journals(f"name={j}"), what="the journal to be deleted")
    spec = journal_spec(j)
    spec.fragment.stores[:] = ["file:///recreated-now/"]
    create_journals(gz, spec)
    new = json_records(1000, 30, pad=7)  # The old head falls inside a record of these.
    append_each(gz, j, [b"".join(new)])
    recreated = gz.list_journals(f"name={j}")[0].create_revision

    anew = r.latestOffset(start, r.getDefaultReadLimit())
    assert anew == {j: [0, recreated]}
    assert r.latestOffset(anew, r.getDefaultReadLimit()) == anew


def test_a_journal_deleted_while_a_trigger_admits_its_records_stays_where_it_was(
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under a budget, the trigger reads journals to cut their end offsets at record
    # boundaries, after it has their heads: a journal deleted in between stays where it was
    # (as one deleted before its head was asked), and the others advance.
    from pygazette.protocol.pb import protocol_pb2 as pb
    from pygazette.spark import stream_reader
    from pygazette.spark.framing import Framing
    from pygazette.spark.options import parse_read_options
    from pygazette.spark.schema import default_schema, layout

    topic = prefix.strip("/").replace("/", ".")
    kept, gone = prefix + "kept", prefix + "gone"
    records = json_records(0, 10)
    for j in (kept, gone):
        create_journals(gz, journal_spec(j, labels={"topic": topic}))
        append_each(gz, j, [b"".join(records)])
    opts = parse_read_options(
        {
            "broker": spark_broker.url,
            "selector": f"topic={topic}",
            "framing": "lines",
            "startingOffsets": "earliest",
            "maxBytesPerTrigger": str(len(b"".join(records))),  # Half of each journal.
        },
        streaming=True,
    )
    reader = stream_reader.GazetteStreamReader(
        opts, layout(default_schema(Framing.LINES), Framing.LINES)
    )
    start = reader.initialOffset()
    heads_before = stream_reader.jn.write_heads

    async def deleted_once_its_head_is_known(*args: Any, **kwargs: Any) -> dict[str, int]:
        heads = await heads_before(*args, **kwargs)
        gz.apply_journals([pb.ApplyRequest.Change(delete=gone, expect_mod_revision=-1)])
        wait_for(lambda: not gz.list_journals(f"name={gone}"), what="the journal to be deleted")
        return heads

    monkeypatch.setattr(stream_reader.jn, "write_heads", deleted_once_its_head_is_known)
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end[gone] == start[gone]
    assert start[kept][0] < end[kept][0] < len(b"".join(records))
    assert end[kept][0] in offsets_of(records)


def test_starting_offsets_past_a_write_head_are_an_option_error(
    spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    # An offset past the write head has nothing to read at it (yet): the query failed at its
    # first trigger, told of a data loss ('its write head 8 is below the offset 100 the query
    # has read up to (was it deleted and recreated?)'), or with failOnDataLoss false started
    # at the head as if it had been asked to. A batch read says so of its endingOffsets.
    from pygazette.spark.options import OptionError

    a, b = prefix + "a", prefix + "b"
    create_journals(gz, journal_spec(a), journal_spec(b))
    append_each(gz, a, [b"one\n", b"two\n"])

    def start(offsets: dict[str, int]) -> dict[str, Any]:
        reader = direct_reader(
            spark_broker,
            journals=f"{a},{b}",
            startingOffsets=json.dumps(offsets),
            failOnDataLoss="false",
        )
        return reader.initialOffset()  # type: ignore[no-any-return]

    with pytest.raises(
        OptionError, match=rf"startingOffsets of {a} \(100\) is past its write head 8"
    ):
        start({a: 100})
    rev = {j: gz.list_journals(f"name={j}")[0].create_revision for j in (a, b)}
    assert start({a: 8, b: -1}) == {a: [8, rev[a]], b: [0, rev[b]]}


def test_offsets_naming_a_journal_the_selector_does_not_match_are_an_option_error(
    spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    # With option journals, offsets naming another journal are an error; with a selector they
    # were ignored: a misspelt name (or one the selector leaves out) read that journal from
    # the default offset, silently (a stream's latest: what it held was skipped).
    from pygazette.spark.batch_reader import batch_ranges
    from pygazette.spark.options import OptionError, parse_read_options
    from pygazette.spark.runtime import call

    topic = prefix.strip("/").replace("/", ".")
    a = prefix + "part-000"
    create_journals(gz, journal_spec(a, labels={"topic": topic}))
    append_each(gz, a, [b"one\n", b"two\n"])
    typo = prefix + "part-00"

    def options(**offsets: str) -> dict[str, str]:
        return {"broker": spark_broker.url, "selector": f"topic={topic}", **offsets}

    reader = direct_reader(
        spark_broker, "raw", selector=f"topic={topic}", startingOffsets=json.dumps({typo: 4})
    )
    message = rf"startingOffsets names journals that are not read: {typo} \(option selector"
    with pytest.raises(OptionError, match=message):
        reader.initialOffset()
    for name in ("startingOffsets", "endingOffsets"):
        batch = parse_read_options(options(**{name: json.dumps({typo: 4})}), streaming=False)
        with pytest.raises(OptionError, match=message.replace("startingOffsets", name)):
            call(spark_broker.url, lambda c, batch=batch: batch_ranges(c, batch))
    batch = parse_read_options(options(startingOffsets=json.dumps({a: 4})), streaming=False)
    ranges, _ = call(spark_broker.url, lambda c: batch_ranges(c, batch))
    assert ranges == {a: (4, 8)}


@pytest.mark.parametrize("available_now", [False, True], ids=["trigger", "available-now"])
def test_a_stream_starts_while_a_selected_journal_is_not_served_yet(
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    available_now: bool,
) -> None:
    # A journal just created is listed before a broker serves it. A trigger leaves such a
    # journal for the next one (which finds it at its earliest offset); the query's start
    # failed on it (JOURNAL_NOT_FOUND), so a stream over a selector could not start while a
    # matching journal was being created. Trigger.AvailableNow's start (its target offsets)
    # failed so too: a journal not served yet has nothing available now, and is not read.
    from pygazette.spark import stream_reader

    topic = prefix.strip("/").replace("/", ".")
    served, fresh = prefix + "served", prefix + "fresh"
    create_journals(gz, journal_spec(served, labels={"topic": topic}))
    append_each(gz, served, [b"one\n"])
    rev = gz.list_journals(f"name={served}")[0].create_revision
    listed = stream_reader.jn.journal_revisions

    async def listed_before_served(*args: Any, **kwargs: Any) -> dict[str, int]:
        return {**await listed(*args, **kwargs), fresh: rev + 1}

    monkeypatch.setattr(stream_reader.jn, "journal_revisions", listed_before_served)
    if not available_now:
        reader = direct_reader(spark_broker, selector=f"topic={topic}")
        assert reader.initialOffset() == {served: [4, rev]}
        return
    reader = direct_reader(spark_broker, selector=f"topic={topic}", startingOffsets="earliest")
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    assert start == {served: [0, rev]}
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {served: [4, rev]}
    assert reader.latestOffset(end, reader.getDefaultReadLimit()) == end
