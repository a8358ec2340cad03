"""Exactly-once against real broker processes: killed transactional producers, duplicates
injected by retried appends, and a broker killed and restarted under AppendService load."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pygazette.client import AppendService, JournalClient, WatchedList, apply_journals
from pygazette.message import (
    ACK_TXN,
    Envelope,
    FixedFraming,
    Publisher,
    ReadCommitted,
    ReadUncommitted,
    Sequencer,
    append_ack_intents,
    random_mapping,
    rendezvous_mapping,
)
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.support.broker_process import BrokerProcess
from tests.support.tcp_proxy import TcpProxy

REPO = Path(__file__).resolve().parents[2]


def spec(
    name: str, content_type: str = "application/x-ndjson", topic: str = "events"
) -> pb.JournalSpec:
    s = pb.JournalSpec(
        name=name, replication=1, labels=label_set({"topic": topic, "content-type": content_type})
    )
    s.fragment.length = 1 << 20
    s.fragment.compression_codec = pb.SNAPPY
    s.fragment.stores.append("file:///")
    s.fragment.refresh_interval.seconds = 300
    return s


async def create(client: JournalClient, *specs: pb.JournalSpec) -> None:
    await apply_journals(
        client, [pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs]
    )


async def committed(client: JournalClient, journals: list[str], **kw: Any) -> list[Envelope]:
    out: list[Envelope] = []
    for journal in journals:
        async with ReadCommitted(client, journal, **kw) as it:
            out.extend([env async for env in it])
    return out


async def uncommitted(client: JournalClient, journals: list[str]) -> list[Envelope]:
    out: list[Envelope] = []
    for journal in journals:
        async with ReadUncommitted(client, journal) as it:
            out.extend([env async for env in it])
    return out


@pytest.fixture
async def client(broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.url) as c:
        yield c


PARTS = ["events/part-0", "events/part-1", "events/part-2"]


async def test_publish_and_read_committed_in_every_framing(client: JournalClient) -> None:
    await create(
        client,
        *(spec(p) for p in PARTS),
        spec("csv/a", "text/csv", "csv"),
        spec("proto/a", "application/x-protobuf-fixed", "proto"),
    )
    async with WatchedList(client, "topic=events") as parts, AppendService(client) as svc:
        proto = FixedFraming(pb.Label, uuid_field="value")
        pub = Publisher(svc, framings={"application/x-protobuf-fixed": proto})
        by_user = rendezvous_mapping(lambda m: m["user"], parts)
        for i in range(300):
            pub.publish_committed(by_user, {"user": f"u{i % 7}", "n": i})
        pub.publish_committed_many(
            by_user, [{"user": f"u{i % 7}", "n": i} for i in range(300, 600)]
        )
        csv_map = random_mapping(await WatchedList(client, "topic=csv").start())
        pub.publish_committed(csv_map, ["", "a,b", 'quote "x"'])
        proto_map = random_mapping(await WatchedList(client, "topic=proto").start())
        pub.publish_committed(proto_map, pb.Label(name="hello"))
        await svc.wait_all()

    envs = await committed(client, PARTS)
    assert sorted(e.message["n"] for e in envs) == list(range(600))
    # Each user's messages went to one journal (rendezvous), in publish order.
    by_journal: dict[str, list[int]] = collections.defaultdict(list)
    for e in envs:
        by_journal[e.message["user"]].append(e.journal)
        assert e.producer == pub.producer
    assert all(len(set(js)) == 1 for js in by_journal.values())
    for journal in PARTS:
        ns = [e.message["n"] for e in envs if e.journal == journal]
        assert ns == sorted(ns)
    # Envelopes carry exact offsets: the bytes there are the message's frame.
    e = envs[-1]
    async with ReadUncommitted(client, e.journal, offset=e.begin, end_offset=e.end) as it:
        (again,) = [x async for x in it]
    assert again.message == e.message and (again.begin, again.end) == (e.begin, e.end)

    (row,) = await committed(client, ["csv/a"])
    assert row.message[1:] == ["a,b", 'quote "x"'] and row.clock > 0
    (label,) = await committed(client, ["proto/a"], framing=proto)
    assert label.message.name == "hello" and label.producer == pub.producer


async def test_publishing_many_takes_any_iterable_of_messages(client: JournalClient) -> None:
    """publish_*_many take an Iterable: a generator is published whole whatever the mapping.
    With a mapping without map_many (modulo, rendezvous), mapping the messages used the
    generator up, and the publish raised ValueError (zip: argument 2 is longer)."""
    await create(client, *(spec(p) for p in PARTS))
    async with WatchedList(client, "topic=events") as parts, AppendService(client) as svc:
        pub = Publisher(svc)
        by_n = rendezvous_mapping(lambda m: str(m["n"]), parts)
        pub.publish_committed_many(by_n, ({"n": i} for i in range(50)))
        pub.publish_uncommitted_many(by_n, ({"n": i} for i in range(50, 100)))
        await svc.wait_all()
        for op in append_ack_intents(svc, pub.build_ack_intents()):
            await op
    assert sorted(e.message["n"] for e in await committed(client, PARTS)) == list(range(100))


async def test_transactions_are_invisible_until_acknowledged(client: JournalClient) -> None:
    await create(client, *(spec(p) for p in PARTS))
    async with WatchedList(client, "topic=events") as parts, AppendService(client) as svc:
        pub = Publisher(svc)
        mapping = rendezvous_mapping(lambda m: str(m["i"]), parts)
        pub.publish_uncommitted_many(mapping, [{"i": i} for i in range(100)])
        await svc.wait_all()
        assert await committed(client, PARTS) == []
        assert len(await uncommitted(client, PARTS)) == 100

        intents = pub.build_ack_intents()
        assert sorted(i.journal for i in intents) == sorted(
            {e.journal for e in await uncommitted(client, PARTS)}
        )
        for op in append_ack_intents(svc, intents):
            await op
        assert sorted(e.message["i"] for e in await committed(client, PARTS)) == list(range(100))

        # A rolled-back transaction: its messages never show, the next one's do.
        pub.publish_uncommitted_many(mapping, [{"i": i} for i in range(100, 150)])
        for intent in intents:  # Re-sending an older ACK rolls back what followed it.
            svc.append(intent.journal, intent.intent)
        await svc.wait_all()
        pub.publish_uncommitted_many(mapping, [{"i": i} for i in range(150, 160)])
        for op in append_ack_intents(svc, pub.build_ack_intents()):
            await op
    got = sorted(e.message["i"] for e in await committed(client, PARTS))
    assert got == list(range(100)) + list(range(150, 160))


def run_producer(broker: BrokerProcess, checkpoint: Path, *args: str) -> int:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.message.txn_producer",
            "--broker",
            broker.url,
            "--selector",
            "topic=events",
            "--checkpoint",
            str(checkpoint),
            "--txns",
            "4",
            "--per-txn",
            "60",
            *args,
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode in (0, -9), proc.stderr.decode(errors="replace")
    return proc.returncode


def txn_ids(envs: list[Envelope]) -> list[tuple[int, int]]:
    return sorted((e.message["txn"], e.message["i"]) for e in envs if e.flags != ACK_TXN)


def all_ids(txns: range) -> list[tuple[int, int]]:
    return sorted((t, i) for t in txns for i in range(60))


async def test_a_producer_killed_mid_transaction_commits_exactly_once_after_restart(
    broker: BrokerProcess, client: JournalClient, tmp_path: Path
) -> None:
    await create(client, *(spec(p) for p in PARTS))
    checkpoint = tmp_path / "producer.json"

    # Killed after transaction 2's messages were appended, before its ACKs were stored.
    assert (
        await asyncio.to_thread(run_producer, broker, checkpoint, "--crash-before-ack", "2") == -9
    )
    assert txn_ids(await committed(client, PARTS)) == all_ids(range(2))
    # The partial output is in the journals, but read-committed never shows it.
    assert txn_ids(await uncommitted(client, PARTS)) == all_ids(range(3))

    # The restarted producer does transaction 2 again, under a new producer ID.
    assert await asyncio.to_thread(run_producer, broker, checkpoint) == 0
    assert txn_ids(await committed(client, PARTS)) == all_ids(range(4))
    # The dead producer's messages of transaction 2 are still there, never to be read.
    assert len(txn_ids(await uncommitted(client, PARTS))) == 5 * 60


async def test_a_producer_killed_while_acknowledging_completes_on_restart(
    broker: BrokerProcess, client: JournalClient, tmp_path: Path
) -> None:
    await create(client, *(spec(p) for p in PARTS))
    checkpoint = tmp_path / "producer.json"
    # Killed after storing transaction 1's intents and appending only the first of them.
    assert await asyncio.to_thread(run_producer, broker, checkpoint, "--crash-mid-ack", "1") == -9
    seen = set(txn_ids(await committed(client, PARTS)))
    assert set(all_ids(range(1))) < seen < set(all_ids(range(2)))  # Txn 1 is partly visible...
    assert await asyncio.to_thread(run_producer, broker, checkpoint) == 0
    # ...until the restarted producer appends the stored intents: then exactly once.
    assert txn_ids(await committed(client, PARTS)) == all_ids(range(4))


async def test_duplicates_from_a_retried_append_are_removed(
    broker: BrokerProcess, client: JournalClient
) -> None:
    await create(client, spec(PARTS[0]))
    journal = [PARTS[0]]
    proxy = TcpProxy(broker.port)
    try:
        async with JournalClient(proxy.url) as proxied, AppendService(proxied) as svc:
            pub = Publisher(svc)
            mapping = random_mapping(await WatchedList(client, f"name={PARTS[0]}").start())
            for op in pub.publish_committed_many(mapping, [{"n": i} for i in range(10)]):
                await op

            # The broker commits the next append, but its response is lost...
            proxy.blackhole()
            ops = pub.publish_committed_many(mapping, [{"n": i} for i in range(10, 20)])
            async with ReadUncommitted(client, PARTS[0], offset=0, block=True) as tail:
                n = 0
                async for _ in tail:
                    n += 1
                    if n == 20:
                        break
            # ...and the connection fails, so the AppendService sends it again.
            proxy.reset()
            for op in ops:
                await op
    finally:
        proxy.close()

    raw = [e.message["n"] for e in await uncommitted(client, journal)]
    assert sorted(raw) == sorted(list(range(20)) + list(range(10, 20)))  # Duplicated...
    assert [e.message["n"] for e in await committed(client, journal)] == list(range(20))  # ...not.


async def test_a_broker_restart_under_append_service_load_loses_nothing(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pygazette.client.append_service")
    total = 30_000
    async with JournalClient(broker.url) as client:
        await create(client, *(spec(p) for p in PARTS))
        async with WatchedList(client, "topic=events") as parts:
            svc = AppendService(client)
            pub = Publisher(svc)
            mapping = random_mapping(parts)
            published = 0
            restarted = False
            while published < total:
                pub.publish_committed_many(
                    mapping, [{"n": n} for n in range(published, published + 250)]
                )
                published += 250
                if published == total // 3:
                    # Kill the broker (SIGKILL) under load, and start it again on the same data.
                    await asyncio.to_thread(broker.kill)
                    await asyncio.to_thread(broker.start)
                    restarted = True
                await asyncio.sleep(0)
            await svc.wait_all()
            await svc.close()
        assert restarted
        # Appends were in flight or queued when the broker died, and were retried.
        assert any("will retry" in r.getMessage() for r in caplog.records)
        seq = Sequencer()
        got = [e.message["n"] for e in await committed(client, PARTS, sequencer=seq)]
    assert len(got) == total and set(got) == set(range(total))


async def test_a_transaction_longer_than_the_ring_is_replayed_from_the_journal(
    client: JournalClient,
) -> None:
    await create(client, spec(PARTS[0]))
    mapping = random_mapping(
        pb.ListResponse(journals=[pb.ListResponse.Journal(spec=spec(PARTS[0]))])
    )
    async with AppendService(client) as svc:
        txn, other = Publisher(svc), Publisher(svc)
        for i in range(50):  # A long transaction, interleaved with another producer's messages.
            txn.publish_uncommitted(mapping, {"txn": i})
            other.publish_committed(mapping, {"other": i})
            await asyncio.sleep(0)  # Separate appends.
        for op in append_ack_intents(svc, txn.build_ack_intents()):
            await op
    async with ReadCommitted(client, PARTS[0], sequencer=Sequencer(buffer=8)) as it:
        got = [env.message async for env in it]
        assert it.replays == 1
    assert [m["other"] for m in got if "other" in m] == list(range(50))
    assert [m["txn"] for m in got if "txn" in m] == list(range(50))
    assert got[-50:] == [{"txn": i, "uuid": m["uuid"]} for i, m in enumerate(got[-50:])]


class _ReplayHeldOnce(ReadCommitted):
    """A ReadCommitted whose first replay waits until it is cancelled."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replay_started = asyncio.Event()

    async def _replay(self) -> None:
        if not self.replay_started.is_set():
            self.replay_started.set()
            await asyncio.Event().wait()
        await super()._replay()


async def test_a_read_cancelled_during_a_replay_loses_nothing(client: JournalClient) -> None:
    """A read of a journal is cancelled (say by a timeout) while it replays a transaction
    longer than the ring: the next read goes on from there. The messages committed before
    the ACK in that read were lost (already sequenced, never returned), as were those after
    it, and every later read raised RuntimeError ('committed messages remain to dequeue')."""
    await create(client, spec(PARTS[0]))
    mapping = random_mapping(
        pb.ListResponse(journals=[pb.ListResponse.Journal(spec=spec(PARTS[0]))])
    )
    async with AppendService(client) as svc:
        txn, other = Publisher(svc), Publisher(svc)
        for i in range(20):
            txn.publish_uncommitted(mapping, {"txn": i})
            await asyncio.sleep(0)  # Separate appends.
        for i in range(20):
            other.publish_committed(mapping, {"other": i})
        for op in append_ack_intents(svc, txn.build_ack_intents()):
            await op
        for i in range(20, 40):
            await other.publish_committed(mapping, {"other": i})
    async with _ReplayHeldOnce(client, PARTS[0], sequencer=Sequencer(buffer=8)) as it:
        first = asyncio.create_task(it.__anext__())
        await it.replay_started.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        got = [env.message async for env in it]
    assert [m["other"] for m in got if "other" in m] == list(range(40))
    assert [m["txn"] for m in got if "txn" in m] == list(range(20))
