"""Consumer transactions against a real broker: pipelined commits, exactly-once effects
across application failures, read-committed outputs, Stat-style progress."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pygazette.client import JournalClient, apply_journals
from pygazette.client.append_service import AppendService
from pygazette.client.appender import append
from pygazette.client.reader import Reader
from pygazette.consumer.checkpoint import checkpoint_sources
from pygazette.consumer.memory_store import MemoryStore
from pygazette.consumer.progress import Progress
from pygazette.consumer.source_reader import SourceReaders
from pygazette.consumer.transaction import Transactions
from pygazette.keyspace.keyspace import KeyValue
from pygazette.message.envelope import Envelope
from pygazette.message.framing import framing_for
from pygazette.message.publisher import Publisher
from pygazette.message.reader import ReadCommitted
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import small_journal_spec

NDJSON = "application/x-ndjson"
SOURCES = ["tests/consumer/in-a", "tests/consumer/in-b"]
OUT = "tests/consumer/out"


@dataclass
class FakeShard:
    """A Shard handle without a consumer process around it."""

    spec: cpb.ShardSpec
    client: JournalClient
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    assignment: KeyValue = field(default_factory=lambda: KeyValue("", b"", 1, 1))
    recovery_log: str = ""
    local_dir: str = ""

    @property
    def id(self) -> str:
        return self.spec.id

    def progress(self) -> tuple[dict[str, int], dict[str, int]]:
        return {}, {}


class Counter:
    """Counts messages per key, and publishes one output per input (uncommitted)."""

    def __init__(self, fail_at: int = -1) -> None:
        self.fail_at = fail_at
        self.seen = 0
        self.txns = 0

    def new_store(self, shard: Any, recorder: Any) -> MemoryStore:
        return MemoryStore({"counts": {}})

    def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Publisher) -> None:
        self.seen += 1
        if self.seen == self.fail_at:
            raise RuntimeError("injected failure")
        key = env.message["key"]
        counts = store.state["counts"]
        counts[key] = counts.get(key, 0) + 1
        pub.publish_uncommitted(
            lambda _m: (OUT, NDJSON), {"key": key, "n": env.message["n"], "src": env.journal}
        )

    def finalize_txn(self, shard: Any, store: Any, pub: Publisher) -> None:
        self.txns += 1


@pytest.fixture
async def client(broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.url) as c:
        await apply_journals(
            c,
            [
                pb.ApplyRequest.Change(upsert=small_journal_spec(j), expect_mod_revision=0)
                for j in [*SOURCES, OUT]
            ],
        )
        yield c


async def publish_inputs(client: JournalClient, n: int) -> dict[str, int]:
    """n committed messages per source; returns each source's write head."""
    heads: dict[str, int] = {}
    async with AppendService(client) as service:
        pub = Publisher(service)
        for src in SOURCES:
            msgs = [{"key": f"k{i % 7}", "n": i} for i in range(n)]
            aas = pub.publish_committed_many(lambda _m, src=src: (src, NDJSON), msgs)
            for aa in aas:
                await aa
                assert aa.response is not None
                heads[src] = aa.response.commit.end
    return heads


def shard_spec(min_ms: int = 0, max_ms: int = 50) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(id="counter-000")
    for src in SOURCES:
        spec.sources.add(journal=src)
    spec.min_txn_duration.FromMilliseconds(min_ms)
    spec.max_txn_duration.FromMilliseconds(max_ms)
    return spec


async def run_until(
    client: JournalClient,
    app: Counter,
    store: MemoryStore,
    heads: dict[str, int],
    progress: Progress,
    spec: cpb.ShardSpec,
) -> None:
    """Run transactions from the store's checkpoint until every source is read through
    `heads` (raising the app's failure, if it fails first)."""
    async with running(client, app, store, progress, spec) as (shard, run):
        reached = asyncio.ensure_future(progress.wait_for(heads, None))
        try:
            await asyncio.wait([run, reached], timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if run.done():
                run.result()  # The app's failure.
            assert reached.done(), "transactions did not read through the sources"
            shard.stopping.set()
            await asyncio.wait_for(run, 30)
        finally:
            reached.cancel()


@contextlib.asynccontextmanager
async def running(
    client: JournalClient,
    app: Counter,
    store: MemoryStore,
    progress: Progress,
    spec: cpb.ShardSpec,
) -> AsyncIterator[tuple[FakeShard, asyncio.Future[None]]]:
    """A shard's transactions running from the store's checkpoint: (shard, their task).
    On leaving, the shard stops (waited for, bounded), and its readers and appends close."""
    shard = FakeShard(spec, client)
    cp = await store.restore_checkpoint(shard)
    offsets, states = checkpoint_sources(cp)
    framing = framing_for(NDJSON)
    readers = SourceReaders(client, spec.sources, offsets, states, {s: framing for s in SOURCES})
    service = AppendService(client)
    txns = Transactions(shard, app, store, service, Publisher(service), readers, progress)
    readers.start()
    run = asyncio.ensure_future(txns.run(cp))
    try:
        yield shard, run
    finally:
        shard.stopping.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(run, 30)
        run.cancel()
        with contextlib.suppress(BaseException):
            await run
        await readers.close()
        await service.close(cancel=True)


async def committed_outputs(client: JournalClient) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with ReadCommitted(client, OUT) as rc:
        with contextlib.suppress(StopAsyncIteration):
            while True:
                out.extend(e.message for e in await rc.next_batch())
    return out


async def test_exactly_once_through_pipelined_transactions(client: JournalClient) -> None:
    n = 3000
    heads = await publish_inputs(client, n)
    app, store, progress = Counter(), MemoryStore({"counts": {}}), Progress()
    await run_until(client, app, store, heads, progress, shard_spec(max_ms=20))
    assert app.txns > 1, "expected several (pipelined) transactions"
    counts = store.committed_state["counts"]
    assert sum(counts.values()) == 2 * n
    outputs = await committed_outputs(client)
    assert len(outputs) == 2 * n
    assert sorted((o["src"], o["n"]) for o in outputs) == sorted(
        (s, i) for s in SOURCES for i in range(n)
    )
    read_through, publish_at = progress.snapshot()
    assert read_through == heads
    assert set(publish_at) == {OUT}


@pytest.mark.parametrize("fail_at", [1, 777, 2999])
async def test_app_failure_commits_nothing_and_recovery_is_exactly_once(
    client: JournalClient, fail_at: int
) -> None:
    n = 1500
    heads = await publish_inputs(client, n)
    store = MemoryStore({"counts": {}})
    with pytest.raises(RuntimeError, match="injected failure"):
        await run_until(client, Counter(fail_at=fail_at), store, heads, Progress(), shard_spec())
    # A new primary restores the store and carries on: every input counted once, every
    # output readable once, whatever the failed primary had published uncommitted.
    progress = Progress()
    await run_until(client, Counter(), store, heads, progress, shard_spec())
    assert sum(store.committed_state["counts"].values()) == 2 * n
    outputs = await committed_outputs(client)
    assert sorted((o["src"], o["n"]) for o in outputs) == sorted(
        (s, i) for s in SOURCES for i in range(n)
    )


async def test_min_txn_duration_batches_messages(client: JournalClient) -> None:
    heads = await publish_inputs(client, 200)
    app, store = Counter(), MemoryStore({"counts": {}})
    await run_until(client, app, store, heads, Progress(), shard_spec(min_ms=300, max_ms=2000))
    assert app.txns <= 2
    assert sum(store.committed_state["counts"].values()) == 400


async def test_progress_covers_a_duplicate_read_while_idle(client: JournalClient) -> None:
    """A read of only a duplicate (here: a retried append's second copy) begins no
    transaction, yet the shard has read through it: its progress says so at once, as
    Gazette's does (txnRead signals progress when idle), so that a Stat asking to read
    through the duplicate's end answers rather than wait for the next real message (for
    ever, on a quiet source)."""
    heads = await publish_inputs(client, 20)
    src = SOURCES[0]
    async with Reader(client, src, offset=0, end_offset=heads[src]) as reader:
        first = (await reader.read()).split(b"\n", 1)[0] + b"\n"

    store, progress, app = MemoryStore({"counts": {}}), Progress(), Counter()
    async with running(client, app, store, progress, shard_spec()):
        await asyncio.wait_for(progress.wait_for(heads, None), 30)
        seen = app.seen
        duplicate = await append(client, src, [first])  # The first message, again.
        end = duplicate.commit.end
        await asyncio.wait_for(progress.wait_for({src: end}, None), 10)
        assert app.seen == seen  # Not consumed again.
        assert progress.read_through[src] == end


async def test_progress_covers_a_duplicate_read_while_a_transaction_is_open(
    client: JournalClient,
) -> None:
    """As the test above, with another producer's transaction open in the journal before the
    duplicate (a producer that died in it: its ACK never comes). Gazette's txnRead reports
    the duplicate's end as read through all the same; the shard's progress stayed before it
    for as long as that transaction stayed open, and a Stat through the duplicate waited
    until its deadline."""
    heads = await publish_inputs(client, 20)
    src = SOURCES[0]
    async with Reader(client, src, offset=0, end_offset=heads[src]) as reader:
        first = (await reader.read()).split(b"\n", 1)[0] + b"\n"

    store, progress, app = MemoryStore({"counts": {}}), Progress(), Counter()
    async with running(client, app, store, progress, shard_spec()):
        await asyncio.wait_for(progress.wait_for(heads, None), 30)
        seen = app.seen
        async with AppendService(client) as other:
            opened = Publisher(other).publish_uncommitted(
                lambda _m: (src, NDJSON), {"key": "k0", "n": -1}
            )
            await opened
            assert opened.response is not None
        await asyncio.wait_for(progress.wait_for({src: opened.response.commit.begin}, None), 10)
        duplicate = await append(client, src, [first])  # The first message, again.
        end = duplicate.commit.end
        await asyncio.wait_for(progress.wait_for({src: end}, None), 10)
        assert app.seen == seen  # Neither consumed.
        assert progress.read_through[src] == end


class Paired(Counter):
    """Holds a semaphore shared with other shards from begin_txn to finish_txn, as Gazette
    suggests BeginFinisher be used to bound concurrent transactions."""

    def __init__(self, semaphore: asyncio.Semaphore, fail_at: int = -1) -> None:
        super().__init__(fail_at)
        self.semaphore = semaphore
        self.finished: list[BaseException | None] = []
        self.consuming = asyncio.Event()
        self.proceed = asyncio.Event()
        self.proceed.set()

    async def begin_txn(self, shard: Any, store: Any) -> None:
        await self.semaphore.acquire()

    async def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Publisher) -> None:
        self.consuming.set()
        await self.proceed.wait()
        super().consume_message(shard, store, env, pub)

    def finish_txn(self, shard: Any, store: Any, error: BaseException | None) -> None:
        self.finished.append(error)
        self.semaphore.release()


async def test_finish_txn_follows_a_transaction_that_failed_consuming(
    client: JournalClient,
) -> None:
    """Every begin_txn is paired with a finish_txn (Gazette's BeginFinisher contract), also
    when the transaction fails before it commits: else a semaphore taken in begin_txn is
    never given back, and every other shard of the process waits on it for ever."""
    heads = await publish_inputs(client, 50)
    semaphore = asyncio.Semaphore(1)
    app = Paired(semaphore, fail_at=10)
    with pytest.raises(RuntimeError, match="injected failure"):
        await run_until(client, app, MemoryStore({"counts": {}}), heads, Progress(), shard_spec())
    assert app.finished and isinstance(app.finished[-1], RuntimeError)
    # Another shard of the process still gets to run its transactions.
    other = Paired(semaphore)
    await asyncio.wait_for(
        run_until(client, other, MemoryStore({"counts": {}}), heads, Progress(), shard_spec()),
        60,
    )
    assert other.seen == 100


async def test_finish_txn_follows_a_transaction_abandoned_by_a_stop(
    client: JournalClient,
) -> None:
    """A shard stopped with a transaction open abandons it (nothing of it commits), and
    still tells the application the transaction finished."""
    await publish_inputs(client, 5)
    semaphore = asyncio.Semaphore(1)
    app = Paired(semaphore)
    app.proceed.clear()
    spec = shard_spec(min_ms=10_000, max_ms=20_000)  # The transaction stays open.
    store = MemoryStore({"counts": {}})
    async with running(client, app, store, Progress(), spec) as (shard, run):
        await asyncio.wait_for(app.consuming.wait(), 30)
        shard.stopping.set()
        app.proceed.set()
        await asyncio.wait_for(run, 30)
    assert len(app.finished) == 1 and app.finished[0] is not None
    assert store.committed_state["counts"] == {}  # Abandoned: nothing committed.
    assert not semaphore.locked()


class HeldAtBegin(Counter):
    """Its first begin_txn waits (as on a semaphore shared by shards) until released; it
    records how many messages each transaction consumed."""

    def __init__(self) -> None:
        super().__init__()
        self.beginning = asyncio.Event()
        self.release = asyncio.Event()
        self.sizes: list[int] = []
        self._began_at = 0

    async def begin_txn(self, shard: Any, store: Any) -> None:
        self.beginning.set()
        await self.release.wait()

    def finalize_txn(self, shard: Any, store: Any, pub: Publisher) -> None:
        super().finalize_txn(shard, store, pub)
        self.sizes.append(self.seen - self._began_at)
        self._began_at = self.seen


async def test_transaction_durations_run_from_when_begin_txn_returns(
    client: JournalClient,
) -> None:
    """As Gazette's (txnConsume sets beganAt once BeginTxn returns): min_txn_duration and
    max_txn_duration count from the end of begin_txn. They counted from before it, so a
    begin_txn that waited past them (on a semaphore bounding concurrent transactions, as
    Gazette suggests) closed its transaction after the first batch: transactions of a
    message or two, for as long as the semaphore was contended."""
    app = HeldAtBegin()
    heads = await publish_inputs(client, 1)
    spec = shard_spec(min_ms=2000, max_ms=10_000)
    progress = Progress()
    async with running(client, app, MemoryStore({"counts": {}}), progress, spec) as (_s, run):
        await asyncio.wait_for(app.beginning.wait(), 30)
        await asyncio.sleep(2.2)  # begin_txn is held past min_txn_duration.
        app.release.set()
        heads = await publish_inputs(client, 1)  # Sent within the transaction's minimum.
        reached = asyncio.ensure_future(progress.wait_for(heads, 30))
        await asyncio.wait([run, reached], return_when=asyncio.FIRST_COMPLETED)
        if run.done():
            run.result()
        await reached
    assert app.sizes[0] == 4, app.sizes


async def publish_spans(client: JournalClient, n: int, span: int) -> dict[str, int]:
    """n messages per source, in producers' transactions of `span` messages, each
    committed by its ACK (the sequencer dequeues a span's messages at its ACK, at once);
    returns each source's write head."""
    heads: dict[str, int] = {}
    async with AppendService(client) as service:
        pub = Publisher(service)
        for src in SOURCES:
            for first in range(0, n, span):
                msgs = [{"key": f"k{i % 7}", "n": i} for i in range(first, min(n, first + span))]
                for aa in pub.publish_uncommitted_many(lambda _m, src=src: (src, NDJSON), msgs):
                    await aa
                for intent in pub.build_ack_intents():
                    ack = service.append(intent.journal, intent.intent)
                    await ack
                    assert ack.response is not None
                    heads[src] = ack.response.commit.end
    return heads


class Slow(Counter):
    """Takes MESSAGE_SECONDS of the event loop's thread per message (an application's CPU
    work), and records how many messages each of its transactions began to consume after
    its max_txn_duration had passed (it may then stall on its predecessor's commit, as
    Gazette's does: that is not consuming)."""

    MESSAGE_SECONDS = 0.002

    def __init__(self, max_seconds: float, fail_at: int = -1) -> None:
        super().__init__(fail_at)
        self.max_seconds = max_seconds
        self.late: list[int] = []
        self._closing = 0.0

    def begin_txn(self, shard: Any, store: Any) -> None:
        # Its transaction's clock starts once this returns: a millisecond of leeway.
        self._closing = time.monotonic() + self.max_seconds + 0.001
        self.late.append(0)

    def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Publisher) -> None:
        if time.monotonic() > self._closing:
            self.late[-1] += 1
        time.sleep(self.MESSAGE_SECONDS)
        super().consume_message(shard, store, env, pub)


@pytest.mark.parametrize("spans", [False, True], ids=["committed", "spans"])
async def test_max_txn_duration_closes_a_transaction_between_messages(
    client: JournalClient, spans: bool
) -> None:
    """As Gazette's (txnStep checks its timer before each message it consumes): a transaction
    closes at max_txn_duration however many messages are ready, within a batch of them and
    within a producer's transaction being dequeued. Transactions closed only between the
    source readers' batches (up to 1,024 messages): over 2 s each here, against 250 ms.
    Closed within a batch, the checkpoint is exactly as of the messages consumed: a primary
    failing later and the next one recovering count every message once."""
    n = 1200
    heads = await publish_spans(client, n, span=300) if spans else await publish_inputs(client, n)
    max_seconds = 0.25
    spec = shard_spec(min_ms=0, max_ms=int(max_seconds * 1000))
    store, progress = MemoryStore({"counts": {}}), Progress()
    app = Slow(max_seconds, fail_at=1500)  # After several transactions closed within batches.
    with pytest.raises(RuntimeError, match="injected failure"):
        await run_until(client, app, store, heads, progress, spec)
    assert app.txns >= 4, app.late
    # Once max_txn_duration has passed, a transaction consumes no further message (the one
    # at hand may have begun just before). Without the fix: hundreds, the rest of a batch.
    assert max(app.late) <= 1, app.late

    again = Slow(max_seconds)
    await run_until(client, again, store, heads, Progress(), spec)
    assert max(again.late) <= 1, again.late
    assert sum(store.committed_state["counts"].values()) == 2 * n
    outputs = await committed_outputs(client)
    assert sorted((o["src"], o["n"]) for o in outputs) == sorted(
        (s, i) for s in SOURCES for i in range(n)
    )
