"""Read-committed partitions against a real broker, without Spark: what partitions decide
together (batch reads planned at one write head) and the metadata of the rows they commit."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from pyspark.sql.types import LongType, StructField, StructType, TimestampType

from pygazette.client import SyncJournalClient
from pygazette.message.uuid import ACK_TXN, CONTINUE_TXN, UUIDFormatter
from pygazette.spark.batch_reader import GazetteBatchReader
from pygazette.spark.framing import Framing
from pygazette.spark.options import parse_read_options
from pygazette.spark.planning import GazettePartition
from pygazette.spark.schema import layout
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import append_each, wait_persisted
from tests.support.spark_session import create_journals, journal_spec

J = "committed/journal"
P1, P2 = b"\x01" * 6, b"\x02" * 6
SCHEMA = StructType(
    [
        StructField("n", LongType()),
        StructField("offset", LongType()),
        StructField("fragment_mod_time", TimestampType()),
    ]
)


@pytest.fixture
def gz(broker: BrokerProcess) -> Iterator[SyncJournalClient]:
    with SyncJournalClient(broker.url) as client:
        yield client


def _message(fmt: UUIDFormatter, clock: int, flags: int, n: int, pad: int = 0) -> bytes:
    return orjson.dumps({"uuid": fmt.format(clock, flags), "n": n, "pad": "x" * pad}) + b"\n"


def _batch_reader(broker: BrokerProcess, **options: str) -> GazetteBatchReader:
    opts = parse_read_options(
        {
            "broker": broker.url,
            "journals": J,
            "framing": "json",
            "readCommitted": "true",
            **options,
        },
        streaming=False,
    )
    return GazetteBatchReader(opts, layout(SCHEMA, Framing.JSON))


def _rows(reader: GazetteBatchReader, part: GazettePartition) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for batch in reader.read(part):
        out.extend(batch.to_pylist())
    return out


def test_partitions_decide_a_transaction_at_the_head_they_were_planned_at(
    broker: BrokerProcess, gz: SyncJournalClient
) -> None:
    """A transaction spanning two partitions, whose ACK is appended after the read was planned
    and between the two partitions' tasks: both leave it out (it was open at the head the
    read was planned at), rather than the later one committing its half of it."""
    create_journals(gz, journal_spec(J))
    a = UUIDFormatter(P1)
    append_each(gz, J, [_message(a, 1 + i, CONTINUE_TXN, i, pad=100) for i in range(40)])
    reader = _batch_reader(broker, minPartitions="2")
    parts = [p for p in reader.partitions() if isinstance(p, GazettePartition)]
    assert len(parts) == 2
    first = _rows(reader, parts[0])
    gz.append(J, _message(a, 40, ACK_TXN, -1))  # Commits all 40, after planning.
    second = _rows(reader, parts[1])
    assert first == []
    assert second == []
    # A read planned after the ACK has them all.
    again = _batch_reader(broker, minPartitions="2")
    assert sorted(r["n"] for p in again.partitions() for r in _rows(again, p)) == list(range(40))


def test_a_row_committed_in_a_later_fragment_has_its_own_fragments_mod_time(
    broker: BrokerProcess, gz: SyncJournalClient
) -> None:
    """A transaction's messages in a persisted fragment, its ACK in the broker's spool (no
    modification time): the rows are those of the persisted fragment, with its time."""
    create_journals(gz, journal_spec(J, fragment_length=1024))
    a, b = UUIDFormatter(P1), UUIDFormatter(P2)
    appends = [_message(a, 1 + i, CONTINUE_TXN, i, pad=300) for i in range(6)]
    appends.append(_message(b, 1, ACK_TXN, -2, pad=1024))  # Fills the spool: it rolls next.
    appends.append(_message(a, 6, ACK_TXN, -1))  # In the new spool.
    ack_at = append_each(gz, J, appends)[-1]
    wait_persisted(gz, J, ack_at)

    def mod_times(**options: str) -> dict[int, object]:
        reader = _batch_reader(broker, **options)
        rows = [r for p in reader.partitions() for r in _rows(reader, p)]
        return {r["offset"]: r["fragment_mod_time"] for r in rows if r["n"] >= 0}  # type: ignore[misc]

    every = mod_times(readCommitted="false")
    assert len(every) == 6 and None not in every.values()  # Persisted, every one.
    assert mod_times() == every


def test_read_ahead_begins_after_a_data_loss_that_ends_the_piece() -> None:
    """Bytes lost up to past the piece's end: what follows them begins the read-ahead (the
    hole was reported once; reading ahead from before it would report it again)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from pygazette.message.json_framing import JSONFraming
    from pygazette.spark.partition_reader import PieceDecoder
    from pygazette.spark.planning import Piece
    from pygazette.spark.read_committed import CommittedReads, TransactionResolver

    lay = layout(SCHEMA, Framing.JSON)
    data = StructType([f for f in SCHEMA.fields if f.name == "n"])
    piece = Piece(J, 0, 1000, 0, 2000, False, None)
    resolver = TransactionResolver(J)
    decoder = PieceDecoder(
        piece,
        lay,
        to_arrow_schema(SCHEMA, timezone="UTC"),
        to_arrow_schema(data, timezone="UTC"),
        resolver=resolver,
        committed=CommittedReads(JSONFraming("uuid"), wait=False),
    )
    first = _message(UUIDFormatter(P1), 1, CONTINUE_TXN, 0)
    assert list(decoder.feed(0, first + b'{"uuid": "cut sh')) == []
    assert list(decoder.skip_to(1500)) == []  # Lost: [len(first) + ..., 1500).
    assert decoder.done and resolver.pending_owned == 1
    assert decoder.next_record_at == 1500


def test_read_ahead_through_a_long_record_splits_it_once(
    broker: BrokerProcess, gz: SyncJournalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading ahead across a record of many read chunks: the bytes given to the framing to
    split are about the record's size. They were re-split from the record's start at every
    chunk (46 MB here, for an 8 MiB record): quadratic in its length."""
    import asyncio

    from pygazette.client import JournalClient
    from pygazette.message.json_framing import JSONFraming
    from pygazette.spark.partition_reader import _envelopes_after
    from pygazette.spark.read_committed import CommittedReads

    create_journals(gz, journal_spec(J))
    long_record = orjson.dumps({"n": 0, "pad": "x" * (8 << 20)}) + b"\n"  # No UUID.
    ack = _message(UUIDFormatter(P1), 1, ACK_TXN, -1)
    head = append_each(gz, J, [long_record, ack])[-1] + len(ack)
    split_bytes = 0
    split = JSONFraming.split

    def counting(self: JSONFraming, data: bytes) -> tuple[list[bytes], int]:
        nonlocal split_bytes
        split_bytes += len(data)
        return split(self, data)

    monkeypatch.setattr(JSONFraming, "split", counting)

    async def read_ahead() -> list[object]:
        committed = CommittedReads(JSONFraming("uuid"), wait=False)
        async with JournalClient(broker.url) as client:
            return [
                item
                async for items in _envelopes_after(
                    client, journal=J, offset=0, committed=committed, end=head
                )
                for item in (items if isinstance(items, list) else [items])
            ]

    seen = asyncio.run(read_ahead())
    assert seen == [(0, b"", 0, 0), (len(long_record), P1, 1, ACK_TXN)]
    assert split_bytes < 1.5 * head, split_bytes


def test_a_stream_read_ahead_spends_its_wait_only_waiting_for_content(
    broker: BrokerProcess, gz: SyncJournalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """readCommittedWaitSeconds bounds the wait for a transaction's ACK that is not written
    yet. Time reading the content before it (here: slow to decode) was counted too, so an
    ACK already in the journal, but far enough, timed out: the query failed, and with
    readCommittedOnTimeout=skip the committed transaction was left out."""
    import asyncio
    import time

    from pygazette.client import JournalClient
    from pygazette.message.json_framing import JSONFraming
    from pygazette.spark import partition_reader
    from pygazette.spark.partition_reader import _envelopes_after
    from pygazette.spark.read_committed import CommittedReads

    create_journals(gz, journal_spec(J))
    # Large enough for the ACK to come in a later read than the transaction's first message.
    others = [_message(UUIDFormatter(P2), 1 + i, CONTINUE_TXN, i, 1 << 17) for i in range(24)]
    appends = [
        _message(UUIDFormatter(P1), 1, CONTINUE_TXN, 0),
        *others,
        _message(UUIDFormatter(P1), 2, ACK_TXN, -1),
    ]
    append_each(gz, J, appends)
    uuid_parts = partition_reader.uuid_parts

    def slow_uuid_parts(framing: object, payload: bytes) -> tuple[bytes, int, int]:
        time.sleep(0.1)  # Decoding takes a while: the content is there all along.
        return uuid_parts(framing, payload)  # type: ignore[arg-type]

    monkeypatch.setattr(partition_reader, "uuid_parts", slow_uuid_parts)

    async def read_to_the_ack() -> int:
        committed = CommittedReads(JSONFraming("uuid"), wait=True, wait_seconds=1.0)
        async with JournalClient(broker.url) as client:
            async for items in _envelopes_after(client, journal=J, offset=0, committed=committed):
                assert isinstance(items, list)
                for offset, producer, _clock, flags in items:
                    if producer == P1 and flags == ACK_TXN:
                        return offset
        raise AssertionError("the read ended before the ACK")

    assert asyncio.run(read_to_the_ack()) == sum(len(a) for a in appends[:-1])


def test_a_micro_batch_split_in_two_starts_its_second_partition_from_the_states_at_the_cut(
    broker: BrokerProcess, gz: SyncJournalClient
) -> None:
    """A transaction and its re-sent copy in one micro-batch of two partitions, the copy in
    the second: its messages are duplicates there, by the states latestOffset found at the
    cut, or (a reader restarted, which found none) by scanning up to the cut. The end offsets
    carry the states at the batch's end."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from pygazette.spark.read_committed import decode_states
    from pygazette.spark.stream_reader import GazetteStreamReader

    create_journals(gz, journal_spec(J))
    a = UUIDFormatter(P1)
    txn = [_message(a, 1 + i, CONTINUE_TXN, i, pad=100) for i in range(10)]
    txn.append(_message(a, 10, ACK_TXN, -1, pad=100))
    append_each(gz, J, [b"".join(txn), b"".join(txn)])

    def stream_reader() -> GazetteStreamReader:
        opts = parse_read_options(
            {
                "broker": broker.url,
                "journals": J,
                "framing": "json",
                "readCommitted": "true",
                "startingOffsets": "earliest",
                "minPartitions": "2",
            },
            streaming=True,
        )
        return GazetteStreamReader(opts, layout(SCHEMA, Framing.JSON))

    reader = stream_reader()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert decode_states(end[J][2]) == {P1: (10, 10, -1)}
    parts = [p for p in reader.partitions(start, end) if isinstance(p, GazettePartition)]
    assert len(parts) == 2 and list(parts[1].start_states.values()) == [{P1: (10, 10, -1)}]
    rows = [r["n"] for p in parts for r in _rows(reader, p)]  # type: ignore[arg-type]
    assert sorted(rows) == list(range(10))  # type: ignore[type-var]

    restarted = stream_reader()  # Replays the micro-batch from the checkpoint's offsets.
    again = [p for p in restarted.partitions(start, end) if isinstance(p, GazettePartition)]
    assert [p.start_states for p in again] == [p.start_states for p in parts]
    assert latest_is_stable(restarted, end)


def latest_is_stable(reader: object, end: dict[str, object]) -> bool:
    """With nothing appended, the next latestOffset is the same offsets (no empty batch)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    return reader.latestOffset(end, ReadAllAvailable()) == end  # type: ignore[attr-defined, no-any-return]


def test_closing_an_iteration_ends_an_iterator_whose_cancellation_was_lost() -> None:
    """A read-ahead decided its messages and is closed while its read completes: Python
    3.11's asyncio.wait_for then returns the read and loses the cancellation, the iterator
    goes on, and its next item waited for ever on the queue nobody read. Closing waited until
    the stream's read-ahead wait ran out (readCommittedWaitSeconds, 60 s by default, in
    every task that read ahead), or for ever."""
    import asyncio
    import threading
    from collections.abc import AsyncIterator

    from pygazette.spark import runtime

    async def losing_its_cancellation(_client: object) -> AsyncIterator[int]:
        yield 0
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # Lost, as wait_for loses it.
        yield 1
        yield 2

    items = runtime.iterate("http://127.0.0.1:1", losing_its_cancellation, read_ahead=1)
    assert next(items) == 0
    closing = threading.Thread(target=items.close, daemon=True)
    closing.start()
    closing.join(10)
    assert not closing.is_alive()
