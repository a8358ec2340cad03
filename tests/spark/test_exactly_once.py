"""Register-fenced appends of the sink against a real broker: each write commits once."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator

import pytest

from pygazette.client import JournalClient, append, apply_journals, read_journal
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.spark import exactly_once as eo
from pygazette.spark.exactly_once import Fence, FenceError, fenced_append
from tests.support.broker_process import BrokerProcess
from tests.support.spark_session import journal_spec

J = "spark/fence/journal"


@pytest.fixture
async def client(spark_broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    eo._registers.clear()  # Start each test without this process's register guesses.
    async with JournalClient(spark_broker.url) as c:
        yield c


async def fresh(client: JournalClient, name: str) -> str:
    await apply_journals(
        client, [pb.ApplyRequest.Change(upsert=journal_spec(name), expect_mod_revision=0)]
    )
    return name


async def content(client: JournalClient, journal: str) -> bytes:
    return b"".join([c async for c in read_journal(client, journal)])


async def test_stream_fence_commits_each_batch_once_and_fends_off_zombies(
    client: JournalClient,
) -> None:
    j = await fresh(client, J + "/stream")
    rows = io.BytesIO(b"b0\n")
    first = await fenced_append(client, j, rows, Fence.for_stream("q", 0, 0))
    assert first.appended and (first.begin, first.end) == (0, 3)
    # A retry of the same batch and partition (after a crash past the commit) skips.
    eo._registers.clear()
    again = await fenced_append(client, j, io.BytesIO(b"b0\n"), Fence.for_stream("q", 0, 0))
    assert not again.appended
    # Another partition of the same batch has its own label.
    other = await fenced_append(client, j, io.BytesIO(b"p1\n"), Fence.for_stream("q", 1, 0))
    assert other.appended
    # The next batches advance the label; a partition may skip batches.
    assert (
        await fenced_append(client, j, io.BytesIO(b"b1\n"), Fence.for_stream("q", 0, 1))
    ).appended
    assert (
        await fenced_append(client, j, io.BytesIO(b"b5\n"), Fence.for_stream("q", 0, 5))
    ).appended
    # A zombie attempt of an older batch never writes, whatever this process guessed.
    eo._registers.clear()
    zombie = await fenced_append(client, j, io.BytesIO(b"b3\n"), Fence.for_stream("q", 0, 3))
    assert not zombie.appended
    assert await content(client, j) == b"b0\np1\nb1\nb5\n"


async def test_concurrent_attempts_commit_once(client: JournalClient) -> None:
    j = await fresh(client, J + "/racing")
    fence = Fence.for_stream("q", 7, 3)
    outcomes = await asyncio.gather(
        *(fenced_append(client, j, io.BytesIO(b"row\n"), fence) for _ in range(6))
    )
    assert sum(o.appended for o in outcomes) == 1
    assert await content(client, j) == b"row\n"


async def test_batch_fence_and_expiry_of_old_batch_labels(client: JournalClient) -> None:
    j = await fresh(client, J + "/batch")
    fence = Fence.for_batch("write-1", 2)
    assert (await fenced_append(client, j, io.BytesIO(b"x\n"), fence)).appended
    eo._registers.clear()
    assert not (await fenced_append(client, j, io.BytesIO(b"x\n"), fence)).appended

    # A batch-write label older than the TTL is dropped by a later sink append.
    stale = eo._label(eo.BATCH_LABEL, "write-0", 0)
    await append(client, j, b"y\n", union_registers=label_set({stale: "1"}))
    eo._registers.clear()
    later = Fence.for_batch("write-2", 0)
    assert (await fenced_append(client, j, io.BytesIO(b"z\n"), later)).appended  # Learns regs.
    final = await fenced_append(client, j, io.BytesIO(b"w\n"), Fence.for_batch("write-3", 0))
    assert final.appended
    registers = eo._registers[j]
    names = {label.name for label in registers.labels}
    assert stale not in names
    assert {fence.name, later.name} <= names
    assert await content(client, j) == b"x\ny\nz\nw\n"


async def test_a_reused_batch_writer_id_skips_only_its_own_retries_and_reruns(
    client: JournalClient,
) -> None:
    """A batch label says "already written" to its own run's attempts and to a re-run of the
    same rows, while younger than the TTL; never to other rows, nor once it expired."""
    j = await fresh(client, J + "/reused")

    async def write(data: bytes, run: str, rows: str) -> bool:
        eo._registers.clear()  # As a task of another process: it learns the registers.
        fence = Fence.for_batch("nightly", 0, run, rows)
        return (await fenced_append(client, j, io.BytesIO(data), fence)).appended

    assert await write(b"a\n", "run1", "rows-a")
    assert not await write(b"a\n", "run1", "rows-a")  # A retried task of the same run.
    assert not await write(b"a\n", "run2", "rows-a")  # A re-run of the same job: same rows.
    assert await write(b"b\n", "run3", "rows-b")  # Another write minutes later: other rows.
    assert not await write(b"b2\n", "run3", "rows-b2")  # Its own attempt, whatever its rows.

    # A label past its expiry says nothing, whichever pygazette wrote it.
    name = Fence.for_batch("nightly", 0).name
    old = int(time.time()) - eo.BATCH_LABEL_TTL_SECONDS - 60
    for stale in (f"{old}.run3.rows-b", str(old)):
        await append(client, j, b"-\n", union_registers=label_set({name: stale}))
        assert await write(b"b\n", "run3", "rows-b")
    # An older pygazette's recent label (a time only) still means "written".
    await append(client, j, b"-\n", union_registers=label_set({name: str(int(time.time()))}))
    assert not await write(b"c\n", "run4", "rows-c")
    assert await content(client, j) == b"a\nb\n-\nb\n-\nb\n-\n"


async def test_a_foreign_value_in_a_stream_label_is_an_error(client: JournalClient) -> None:
    j = await fresh(client, J + "/foreign")
    fence = Fence.for_stream("q", 0, 4)
    await append(client, j, b"-\n", union_registers=label_set({fence.name: "not-a-batch"}))
    with pytest.raises(FenceError, match="not a micro-batch id"):
        await fenced_append(client, j, io.BytesIO(b"r\n"), fence)


def test_the_rows_fingerprint_ignores_order_and_batches_but_not_multiplicity() -> None:
    def digest(*batches: list[bytes]) -> str:
        d = eo.RowsDigest()
        for batch in batches:
            d.add(batch)
        return d.hexdigest()

    rows = [f"row {i}\n".encode() for i in range(100)]
    assert digest(rows) == digest(rows[::-1]) == digest(rows[50:], [], rows[:50])
    assert digest(rows) != digest(rows + rows[:1])
    assert digest(rows) != digest([*rows[1:], b"other\n"])


def test_a_stream_label_tells_its_query_from_another_under_the_same_writer_id() -> None:
    """A stream label holds its batch id and its query: another query's (a new checkpoint
    under the same writerId) says nothing of this one's batches; an older pygazette's (a
    bare batch id) is taken as this query's."""
    fence = Fence.for_stream("clicks-sink", 0, 3, "query-a")
    assert fence.value().startswith("3.") and fence.guess() == fence.value().replace("3.", "2.")
    mine = Fence.for_stream("clicks-sink", 0, 5, "query-a").value()
    other = Fence.for_stream("clicks-sink", 0, 5, "query-b").value()
    assert fence.committed(mine) and not fence.committed(other)
    assert fence.committed("3") and not fence.committed("2")
    for bad in ("x.1", "3.", "-1", ""):
        with pytest.raises(FenceError, match="not a micro-batch id"):
            fence.committed(bad)


async def test_the_register_guesses_of_a_process_are_bounded(
    client: JournalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Python worker keeps the registers of the journals it appended to last, not of every
    journal it ever wrote (a sink writing by a journal column goes on to ever more)."""
    monkeypatch.setattr(eo, "REGISTER_CACHE_JOURNALS", 3)
    journals = [await fresh(client, f"{J}/bounded-{i}") for i in range(5)]
    for j in journals:
        outcome = await fenced_append(client, j, io.BytesIO(b"r\n"), Fence.for_stream("q", 0, 0))
        assert outcome.appended
    assert list(eo._registers) == journals[-3:]
