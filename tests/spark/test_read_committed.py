"""TransactionResolver (option readCommitted): Gazette's sequencing rules, one journal at a time,
checked against the message layer's Sequencer, and with owned and read-ahead records."""

from __future__ import annotations

import json
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pygazette.client import SyncJournalClient
from pygazette.message.csv_framing import CSVFraming
from pygazette.message.envelope import Envelope
from pygazette.message.json_framing import JSONFraming
from pygazette.message.sequencer import Sequencer
from pygazette.message.uuid import ACK_TXN, CONTINUE_TXN, OUTSIDE_TXN, UUIDFormatter
from pygazette.spark.read_committed import TransactionResolver, uuid_parts
from tests.spark.test_batch_read import reader
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import append_each
from tests.support.spark_session import create_journals, journal_spec

J = "a/journal"
P1, P2, P3 = b"\x01" * 6, b"\x02" * 6, b"\x03" * 6

# (producer, clock, flags); clock 0 is a record without a UUID.
messages = st.lists(
    st.tuples(
        st.sampled_from([P1, P2, P3]),
        st.integers(min_value=0, max_value=12),
        st.sampled_from([OUTSIDE_TXN, CONTINUE_TXN, ACK_TXN]),
    ),
    max_size=60,
)


def _sequenced(msgs: list[tuple[bytes, int, int]]) -> list[int]:
    """Offsets of the non-ACK messages the Sequencer delivers, in order."""
    seq = Sequencer(buffer=4096)
    envs = [
        Envelope(J, i, i + 1, None, p if c else bytes(6), c, f if c else 0)
        for i, (p, c, f) in enumerate(msgs)
    ]
    out: list[Envelope] = []
    assert seq.sequence(envs, 0, out) == len(envs)
    return [e.begin for e in out if not (e.clock and e.flags == ACK_TXN)]


@settings(max_examples=400, deadline=None)
@given(messages)
def test_rows_are_the_messages_the_sequencer_delivers(msgs: list[tuple[bytes, int, int]]) -> None:
    r = TransactionResolver(J)
    for i, (p, c, f) in enumerate(msgs):
        r.add(i, b"%d" % i, p, c, f)
    assert [offset for offset, _payload in r.take()] == _sequenced(msgs)
    assert r.pending_owned == sum(1 for p in r._producers.values() for x in p.pending)


@settings(max_examples=300, deadline=None)
@given(messages, st.integers(min_value=0, max_value=60))
def test_records_read_ahead_decide_owned_ones_and_are_not_rows(
    msgs: list[tuple[bytes, int, int]], owned: int
) -> None:
    r = TransactionResolver(J)
    for i, (p, c, f) in enumerate(msgs):
        r.add(i, b"%d" % i if i < owned else None, p, c, f)
    assert [o for o, _ in r.take()] == [o for o in _sequenced(msgs) if o < owned]


def test_records_read_ahead_are_not_kept() -> None:
    """A read-ahead passes other transactions' messages (of later partitions, appended since)
    until the owned ones are decided: it keeps none of them."""
    r = TransactionResolver(J)
    r.add(0, b"a", P1, 5, CONTINUE_TXN)
    for i in range(1, 10_001):
        r.add(i, None, P2, i, CONTINUE_TXN)  # Another producer's open transaction.
        r.add(i, None, P3, i, CONTINUE_TXN)
    assert sum(len(p.pending) for p in r._producers.values()) == 1
    r.add(10_002, None, P2, 10_000, ACK_TXN)
    r.add(10_003, None, P1, 5, ACK_TXN)
    assert r.take() == [(0, b"a")] and r.pending_owned == 0


def test_a_transaction_commits_at_its_ack_and_rolls_back_at_an_older_one() -> None:
    r = TransactionResolver(J)
    r.add(0, b"a", P1, 5, CONTINUE_TXN)
    r.add(1, b"b", P1, 6, CONTINUE_TXN)
    r.add(2, b"x", P2, 3, OUTSIDE_TXN)  # Another producer flows meanwhile.
    assert r.take() == [(2, b"x")] and r.pending_owned == 2
    r.add(3, None, P1, 6, ACK_TXN)  # Read ahead: decides, is not a row.
    assert r.take() == [(0, b"a"), (1, b"b")] and r.pending_owned == 0
    r.add(4, b"c", P1, 7, CONTINUE_TXN)
    r.add(5, b"d", P1, 8, CONTINUE_TXN)
    r.add(6, b"ack", P1, 6, ACK_TXN)  # A recovered producer's older ACK: a rollback.
    assert r.take() == [] and r.rolled_back == 2
    r.add(7, b"e", P1, 7, CONTINUE_TXN)  # Re-sent after the rollback, and acknowledged.
    assert r.oldest_pending() == (7, P1)
    r.add(8, b"ack", P1, 9, ACK_TXN)
    assert r.take() == [(7, b"e")]
    r.add(9, b"f", P1, 10, CONTINUE_TXN)
    assert r.abandon() == 1 and r.pending_owned == 0 and r.rolled_back == 2


def test_uuids_of_records() -> None:
    framing = JSONFraming()
    text = UUIDFormatter(P1).format(42, CONTINUE_TXN)
    assert uuid_parts(framing, b'{"uuid": "%s", "n": 1}' % text.encode()) == (
        P1,
        42,
        CONTINUE_TXN,
    )
    # Go's field name matches whatever its case, as Go's encoding/json.
    assert uuid_parts(framing, b'{"UUID": "%s"}' % text.encode())[1] == 42
    assert uuid_parts(framing, b'{"n": 1}')[1] == 0  # No UUID: commits at once.
    assert uuid_parts(framing, b"not json")[1] == 0  # Parsing the row reports it.
    assert uuid_parts(framing, b'{"uuid": "not-a-uuid"}')[1] == 0
    assert uuid_parts(framing, b'{"uuid": 5}')[1] == 0  # Not a string: as no UUID.
    assert uuid_parts(framing, b'[1, 2]')[1] == 0
    # A string of invalid UTF-8, which orjson refuses and Go (and the message layer) reads
    # as U+FFFD: the message still has its UUID (it was taken for one without, committed at
    # once, never rolled back nor de-duplicated).
    assert uuid_parts(framing, b'{"uuid": "%s", "s": "\xff"}' % text.encode())[1] == 42


def test_uuids_of_csv_records_that_sparks_parser_reads_though_go_refuses_them() -> None:
    """A CSV record Go's reader refuses (a quote within an unquoted field, text after a
    quoted field's closing quote) is still a row to Spark's CSV parser (pyarrow reads it
    leniently): its UUID decides it as any other row's does. It was taken for a record
    without one, so a message of a rolled-back transaction, or a duplicate, was a row."""
    framing = CSVFraming()
    text = UUIDFormatter(P1).format(42, CONTINUE_TXN)
    for row in (f'{text},5" screen', f'{text},"a"b', f'"{text}",x"y', f'{text},a"b\r'):
        assert uuid_parts(framing, row.encode()) == (P1, 42, CONTINUE_TXN), row
    assert uuid_parts(framing, b'not-a-uuid,a"b')[1] == 0
    assert uuid_parts(framing, b',a"b')[1] == 0  # No UUID: commits at once.


# Against a real broker and Spark local[2] --------------------------------------------------


def _message(fmt: UUIDFormatter, clock: int, flags: int, n: int, key: str = "uuid") -> bytes:
    return orjson.dumps({key: fmt.format(clock, flags), "n": n}) + b"\n"


def _ack(fmt: UUIDFormatter, clock: int) -> bytes:
    return orjson.dumps({"uuid": fmt.format(clock, ACK_TXN)}) + b"\n"


def _transactions() -> tuple[list[bytes], set[int]]:
    """Appends of three producers' messages, and the `n` of those that are committed.

    A commits a transaction of 60 messages spread over many appends (its ACK lies in a later
    partition than its first messages) and leaves a second one open at the head; B publishes
    outside transactions, with Go's field name "UUID"; C's transaction is rolled back by an
    ACK of an older clock; a record without a UUID commits at once.
    """
    a, b, c = UUIDFormatter(P1), UUIDFormatter(P2), UUIDFormatter(P3)
    appends: list[bytes] = []
    committed: set[int] = set()
    n = 0
    for i in range(60):
        rec = _message(a, 1 + i, CONTINUE_TXN, n)
        committed.add(n)
        n += 1
        out = _message(b, 1000 + i, OUTSIDE_TXN, n, key="UUID")
        committed.add(n)
        n += 1
        roll = _message(c, 100 + i, CONTINUE_TXN, n) if i < 20 else b""
        n += 1
        appends.append(rec + out + roll)
    appends.append(_ack(c, 99) + b'{"n": %d}\n' % n)  # C rolls back; no UUID commits.
    committed.add(n)
    n += 1
    appends.append(_ack(a, 60))
    for i in range(10):  # A's next transaction: open at the head.
        appends.append(_message(a, 61 + i, CONTINUE_TXN, n))
        n += 1
    return appends, committed


def test_a_batch_read_has_the_committed_messages_only(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    j = prefix + "txns"
    create_journals(gz, journal_spec(j, fragment_length=1024))
    appends, committed = _transactions()
    append_each(gz, j, appends)
    schema = "n long, offset long"
    every = reader(spark, spark_broker, journals=j, framing="json").schema
    assert "uuid" in every.fieldNames()  # Inferred: messages and ACKs hold it.

    for parts in ("1", "5"):
        df = (
            spark.read.format("gazette")
            .schema(schema)
            .option("broker", spark_broker.url)
            .options(journals=j, framing="json", readCommitted="true", minPartitions=parts)
            .load()
        )
        if parts == "5":
            assert df.rdd.getNumPartitions() >= 5
        rows = df.collect()
        assert sorted(r.n for r in rows) == sorted(committed), parts
        assert len({r.offset for r in rows}) == len(rows)

    # Without the option, every record is a row: ACKs (n null), rolled back and open ones.
    raw = reader(spark, spark_broker, journals=j, framing="json").collect()
    assert len(raw) == sum(a.count(b"\n") for a in appends)

    # A's open transaction commits once its ACK is appended.
    gz.append(j, _ack(UUIDFormatter(P1), 70))
    later = (
        spark.read.format("gazette")
        .schema(schema)
        .option("broker", spark_broker.url)
        .options(journals=j, framing="json", readCommitted="true")
        .load()
        .collect()
    )
    assert len(later) == len(committed) + 10


def test_a_stream_waits_for_the_ack_of_an_open_transaction(
    spark: SparkSession,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    tmp_path: Path,
) -> None:
    j = prefix + "txn-stream"
    create_journals(gz, journal_spec(j, fragment_length=1024))
    a = UUIDFormatter(P1)
    append_each(gz, j, [_message(a, 1, CONTINUE_TXN, 0), _message(a, 2, CONTINUE_TXN, 1)])
    got: list[int] = []

    def batch(df: DataFrame, _batch_id: int) -> None:
        got.extend(r.n for r in df.collect())

    def start(checkpoint: str, **options: str) -> StreamingQuery:
        """An availableNow query reading `j` committed, from the earliest offset."""
        df = (
            spark.readStream.format("gazette")
            .schema("n long")
            .option("broker", spark_broker.url)
            .options(
                journals=j,
                framing="json",
                readCommitted="true",
                startingOffsets="earliest",
                **options,
            )
            .load()
        )
        return (
            df.writeStream.foreachBatch(batch)
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    query = start("checkpoint")
    try:
        # The micro-batch is planned before the ACK exists: its task waits for it, then has
        # both rows.
        deadline = time.monotonic() + 120
        while not (query.status["isTriggerActive"] and query.status["isDataAvailable"]):
            assert query.isActive and time.monotonic() < deadline, query.status
            time.sleep(0.05)
        ack_at = gz.append(j, _ack(a, 2) + _message(a, 3, CONTINUE_TXN, 2)).commit.begin
        query.awaitTermination(timeout=120)
        assert not query.isActive and query.exception() is None
        end = query.recentProgress[0]["sources"][0]["endOffset"]
        end = json.loads(end) if isinstance(end, str) else end
        offset = end[j][0] if isinstance(end[j], list) else end[j]
        assert offset == ack_at  # The micro-batch ended before the ACK.
    finally:
        query.stop()
    assert sorted(got) == [0, 1]

    # A transaction never acknowledged fails the stream after readCommittedWaitSeconds.
    query = start("checkpoint-2", readCommittedWaitSeconds="2")
    with pytest.raises(Exception, match="not committed or rolled back within 2 s"):
        query.awaitTermination(timeout=120)

    # With readCommittedOnTimeout=skip the open transaction is left out, and the stream goes
    # on: the next micro-batch has what was appended after it.
    got.clear()
    skip = {"readCommittedWaitSeconds": "1", "readCommittedOnTimeout": "skip"}
    query = start("checkpoint-3", **skip)
    query.awaitTermination(timeout=120)
    assert query.exception() is None
    assert sorted(got) == [0, 1]  # Not 2: its transaction never committed.
    gz.append(j, _message(UUIDFormatter(P2), 1, OUTSIDE_TXN, 3))
    query = start("checkpoint-3", **skip)
    query.awaitTermination(timeout=120)
    assert query.exception() is None
    assert sorted(got) == [0, 1, 3]


def test_csv_records_carry_their_uuid_in_the_first_column(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    j = prefix + "txn-csv"
    create_journals(gz, journal_spec(j, fragment_length=1024))
    a, b = UUIDFormatter(P1), UUIDFormatter(P2)
    rows = [
        f"{a.format(1, CONTINUE_TXN)},1\n",
        f"{b.format(5, CONTINUE_TXN)},2\n",  # Rolled back below.
        f'{a.format(2, CONTINUE_TXN)},"3"\n',
        f"{a.format(2, ACK_TXN)},\n",
        f"{b.format(4, ACK_TXN)},\n",
        ",4\n",  # No UUID.
        f"{b.format(6, OUTSIDE_TXN)},5\n",
    ]
    append_each(gz, j, [r.encode() for r in rows])
    got = (
        spark.read.format("gazette")
        .schema("uuid string, n long")
        .option("broker", spark_broker.url)
        .options(journals=j, framing="csv", readCommitted="true")
        .load()
        .collect()
    )
    assert sorted(r.n for r in got) == [1, 3, 4, 5]


# Producer states carried across partitions and micro-batches -------------------------------


def test_a_resolver_resumes_from_producer_states() -> None:
    """The states after some records, given to a new resolver, decide the rest as one resolver
    fed everything would: re-sent copies of earlier messages are no rows."""
    first = TransactionResolver(J)
    first.add(0, b"a", P1, 5, CONTINUE_TXN)
    first.add(1, b"b", P1, 6, CONTINUE_TXN)
    first.add(2, b"x", P2, 3, OUTSIDE_TXN)
    first.add(3, None, P1, 6, ACK_TXN)
    first.add(4, b"c", P1, 7, CONTINUE_TXN)  # Open across the cut.
    states = first.states()
    assert states == {P1: (6, 7, 4), P2: (3, 3, -1)}
    second = TransactionResolver(J, states)
    second.add(5, b"a", P1, 5, CONTINUE_TXN)  # Re-sent copies: acknowledged already ...
    second.add(6, b"x", P2, 3, OUTSIDE_TXN)
    second.add(7, b"c", P1, 7, CONTINUE_TXN)  # ... or pending before the cut.
    second.add(8, b"d", P1, 8, CONTINUE_TXN)
    second.add(9, b"ack", P1, 8, ACK_TXN)
    assert second.take() == [(8, b"d")]
    assert second.states() == {P1: (8, 8, -1), P2: (3, 3, -1)}


@settings(max_examples=300, deadline=None)
@given(messages, st.integers(min_value=0, max_value=60))
def test_resuming_at_any_cut_decides_as_one_resolver(
    msgs: list[tuple[bytes, int, int]], cut: int
) -> None:
    whole = TransactionResolver(J)
    before = TransactionResolver(J)
    for i, (p, c, f) in enumerate(msgs):
        whole.add(i, b"%d" % i, p, c, f)
        if i < cut:
            before.add(i, None, p, c, f)
    after = TransactionResolver(J, before.states())
    for i, (p, c, f) in enumerate(msgs):
        if i >= cut:
            after.add(i, b"%d" % i, p, c, f)
    assert [o for o, _ in after.take()] == [o for o, _ in whole.take() if o >= cut]


def test_producer_states_are_pruned_as_gazette_prunes_checkpoints() -> None:
    from pygazette.spark.read_committed import decode_states, encode_states, prune_states

    hour = (3600 * 10_000_000) << 4  # Clock units: 100 ns, 4 bits of sequence.
    states = {P1: (30 * hour, 30 * hour, -1), P2: (5 * hour, 7 * hour, 12), P3: (1, 2, -1)}
    # P3 is idle for more than 24 h before the newest ACK; P2's open transaction is not.
    assert prune_states(states) == {P1: states[P1], P2: states[P2]}
    assert prune_states(states, max_producers=1) == {P1: states[P1]}
    assert decode_states(orjson.loads(orjson.dumps(encode_states(states)))) == states
    assert list(encode_states(states)) == sorted(p.hex() for p in states)


def _txn(fmt: UUIDFormatter, clocks: range, n: int, pad: int = 0) -> list[bytes]:
    """A transaction's messages (n, n+1, ...) of `clocks`, and its ACK, one record each."""
    out = [
        orjson.dumps({"uuid": fmt.format(c, CONTINUE_TXN), "n": n + i, "pad": "x" * pad})
        + b"\n"
        for i, c in enumerate(clocks)
    ]
    return [*out, orjson.dumps({"uuid": fmt.format(clocks[-1], ACK_TXN), "pad": "x" * pad}) + b"\n"]


def test_a_retried_transaction_is_read_once_across_a_partition_boundary(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    """A's transaction is written, then all of it again (a retried append whose first attempt
    did commit); B's transaction is open while its first messages are re-sent. The copies
    fall in the second partition: they are duplicates there too, by the producer states at
    its start."""
    j = prefix + "txn-retried"
    create_journals(gz, journal_spec(j, fragment_length=1 << 20))
    a, b = UUIDFormatter(P1), UUIDFormatter(P2)
    a_txn = _txn(a, range(1, 11), 0, pad=100)  # Ten messages and their ACK.
    b_msgs = _txn(b, range(1, 11), 100, pad=100)[:-1]  # Ten messages, ACK later.
    half = [b"".join(a_txn), *b_msgs]
    append_each(gz, j, [*half, b"".join(a_txn), *b_msgs[:5], *b_msgs[5:]])
    gz.append(j, _ack(b, 10))
    df = (
        spark.read.format("gazette")
        .schema("n long, offset long")
        .option("broker", spark_broker.url)
        .options(journals=j, framing="json", readCommitted="true", minPartitions="2")
        .load()
    )
    assert df.rdd.getNumPartitions() == 2
    # The second partition begins where the copies do (in their first record).
    plain = reader(spark, spark_broker, journals=j, framing="json", minPartitions="2")
    firsts = plain.select("offset").rdd.glom().map(lambda rows: rows[0].offset).collect()
    copies_at = sum(len(x) for x in half)
    assert copies_at <= firsts[1] <= copies_at + len(a_txn[0]), firsts
    rows = df.collect()
    assert sorted(r.n for r in rows) == [*range(10), *range(100, 110)]


def test_a_retried_transaction_is_read_once_across_micro_batches(
    spark: SparkSession,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    tmp_path: Path,
) -> None:
    """Three runs of one query, from its checkpoint (each run's micro-batches start from the
    producer states the offsets of the run before carry):
    1. A commits a transaction.
    2. A's transaction again (a retried append), B's message, and A opens a transaction
       whose ACK is appended while the micro-batch is running (its task waits for it).
    3. A re-sends its open transaction's message, adds one, and acknowledges both.
    Every message is one row: n 0, 1 | 5, 2 | 3."""
    j = prefix + "txn-retried-stream"
    create_journals(gz, journal_spec(j, fragment_length=1024))
    a, b = UUIDFormatter(P1), UUIDFormatter(P2)
    got: list[int] = []
    checkpoint = str(tmp_path / "checkpoint")

    def batch(df: DataFrame, _batch_id: int) -> None:
        got.extend(r.n for r in df.collect())

    def start() -> StreamingQuery:
        df = (
            spark.readStream.format("gazette")
            .schema("n long")
            .option("broker", spark_broker.url)
            .options(
                journals=j, framing="json", readCommitted="true", startingOffsets="earliest"
            )
            .load()
        )
        return (
            df.writeStream.foreachBatch(batch)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    def run(then: bytes = b"") -> None:
        query = start()
        try:
            if then:
                deadline = time.monotonic() + 120
                while not (query.status["isTriggerActive"] and query.status["isDataAvailable"]):
                    assert query.isActive and time.monotonic() < deadline, query.status
                    time.sleep(0.05)
                gz.append(j, then)
            query.awaitTermination(timeout=120)
            assert not query.isActive and query.exception() is None
        finally:
            query.stop()

    t = 1 << 59  # Clocks as large as a producer's (the offsets' JSON keeps them exact).
    retried = (
        _message(a, t + 1, CONTINUE_TXN, 0) + _message(a, t + 2, CONTINUE_TXN, 1) + _ack(a, t + 2)
    )
    gz.append(j, retried)
    run()
    assert sorted(got) == [0, 1]

    gz.append(j, retried)  # Its first attempt committed; a retry appends it again.
    gz.append(j, _message(b, t + 1, OUTSIDE_TXN, 5))
    gz.append(j, _message(a, t + 3, CONTINUE_TXN, 2))
    run(
        then=_message(a, t + 3, CONTINUE_TXN, 2)
        + _message(a, t + 4, CONTINUE_TXN, 3)
        + _ack(a, t + 4)
    )
    assert sorted(got) == [0, 1, 2, 5]

    run()  # The appends made while the second run's micro-batch was running.
    assert sorted(got) == [0, 1, 2, 3, 5]
