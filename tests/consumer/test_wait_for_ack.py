"""Gazette's wait-for-ACK, against a real broker: a transaction that read a message of an
upstream transaction still awaiting its ACK stays open (up to max_txn_duration) until the
ACK arrives, and consumes the acknowledged messages too; with the spec's
`disable_wait_for_ack`, it closes at once and they go to the next transaction."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from pygazette.client import JournalClient, apply_journals
from pygazette.client.append_service import AppendService
from pygazette.consumer.memory_store import MemoryStore
from pygazette.consumer.progress import Progress
from pygazette.consumer.source_reader import SourceReaders
from pygazette.consumer.transaction import Transactions
from pygazette.message.envelope import Envelope
from pygazette.message.framing import framing_for
from pygazette.message.publisher import Publisher
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.consumer.test_transactions import FakeShard
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import small_journal_spec

NDJSON = "application/x-ndjson"


@pytest.fixture(scope="module")
def ack_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("wait-for-ack") / "broker-data")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
async def client(ack_broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(ack_broker.url) as c:
        yield c


class Recording:
    """Records the ids of the messages each transaction consumed."""

    def __init__(self) -> None:
        self.current: list[str] = []
        self.txns: list[list[str]] = []
        self.changed = asyncio.Event()

    def new_store(self, shard: Any, recorder: Any) -> MemoryStore:
        return MemoryStore({})

    def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Publisher) -> None:
        self.current.append(env.message["id"])
        self.changed.set()

    def finalize_txn(self, shard: Any, store: Any, pub: Publisher) -> None:
        self.txns.append(self.current)
        self.current = []
        self.changed.set()

    async def until(self, cond: Any, within: float = 30.0) -> None:
        async with asyncio.timeout(within):
            while not cond():
                self.changed.clear()
                await self.changed.wait()


class Shard:
    """Transactions of one shard reading `source`, running until `stop()`."""

    def __init__(self, client: JournalClient, source: str, spec: cpb.ShardSpec) -> None:
        self.app = Recording()
        self.shard = FakeShard(spec, client)
        self.readers = SourceReaders(client, spec.sources, {}, {}, {source: framing_for(NDJSON)})
        self.service = AppendService(client)
        self.txns = Transactions(
            self.shard,
            self.app,
            MemoryStore({}),
            self.service,
            Publisher(self.service),
            self.readers,
            Progress(),
        )
        self.readers.start()
        self.run = asyncio.ensure_future(self.txns.run(cpb.Checkpoint()))

    async def stop(self) -> None:
        self.shard.stopping.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self.run, 30)
        await self.readers.close()
        await self.service.close(cancel=True)


async def scenario(client: JournalClient, source: str, *, disable: bool, max_ms: int) -> Shard:
    """An upstream transaction begins (message "b", uncommitted) before a committed message
    "a" of another producer, in one source journal; the shard reads both."""
    await apply_journals(
        client, [pb.ApplyRequest.Change(upsert=small_journal_spec(source), expect_mod_revision=0)]
    )
    spec = cpb.ShardSpec(id="acks-000", disable_wait_for_ack=disable)
    spec.sources.add(journal=source)
    spec.max_txn_duration.FromMilliseconds(max_ms)
    return Shard(client, source, spec)


async def test_a_transaction_waits_for_the_ack_of_what_it_read(client: JournalClient) -> None:
    source = "tests/consumer/acks/wait"
    shard = await scenario(client, source, disable=False, max_ms=60_000)
    try:
        async with AppendService(client) as service:
            upstream, other = Publisher(service), Publisher(service)
            await upstream.publish_uncommitted(lambda _m: (source, NDJSON), {"id": "b"})
            await other.publish_committed(lambda _m: (source, NDJSON), {"id": "a"})
            await shard.app.until(lambda: shard.app.current == ["a"])
            # "b" awaits its ACK: the transaction holding "a" stays open meanwhile.
            with pytest.raises(TimeoutError):
                await shard.app.until(lambda: shard.app.txns, within=1.0)
            assert shard.app.txns == [] and shard.app.current == ["a"]
            for intent in upstream.build_ack_intents():
                await service.append(intent.journal, intent.intent)
        await shard.app.until(lambda: shard.app.txns)
        assert shard.app.txns == [["a", "b"]]
    finally:
        await shard.stop()


async def test_max_txn_duration_bounds_the_wait(client: JournalClient) -> None:
    source = "tests/consumer/acks/bounded"
    shard = await scenario(client, source, disable=False, max_ms=300)
    try:
        async with AppendService(client) as service:
            upstream, other = Publisher(service), Publisher(service)
            await upstream.publish_uncommitted(lambda _m: (source, NDJSON), {"id": "b"})
            await other.publish_committed(lambda _m: (source, NDJSON), {"id": "a"})
            await shard.app.until(lambda: shard.app.current == ["a"])
            began = time.monotonic()
            await shard.app.until(lambda: shard.app.txns)
            assert shard.app.txns == [["a"]]  # Closed at max_txn_duration, without "b".
            assert time.monotonic() - began >= 0.2
            for intent in upstream.build_ack_intents():
                await service.append(intent.journal, intent.intent)
        await shard.app.until(lambda: len(shard.app.txns) == 2)
        assert shard.app.txns == [["a"], ["b"]]
    finally:
        await shard.stop()


async def test_disable_wait_for_ack_closes_at_once(client: JournalClient) -> None:
    source = "tests/consumer/acks/disabled"
    shard = await scenario(client, source, disable=True, max_ms=60_000)
    try:
        async with AppendService(client) as service:
            upstream, other = Publisher(service), Publisher(service)
            await upstream.publish_uncommitted(lambda _m: (source, NDJSON), {"id": "b"})
            await other.publish_committed(lambda _m: (source, NDJSON), {"id": "a"})
            # The transaction of "a" commits without waiting for "b"'s ACK.
            await shard.app.until(lambda: shard.app.txns)
            assert shard.app.txns == [["a"]]
            for intent in upstream.build_ack_intents():
                await service.append(intent.journal, intent.intent)
        await shard.app.until(lambda: len(shard.app.txns) == 2)
        assert shard.app.txns == [["a"], ["b"]]
    finally:
        await shard.stop()
