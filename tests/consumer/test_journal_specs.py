"""JournalSpecs: journals asked for together are looked up together (one lookup per batch of
names, each name once), answers are shared for `max_age`, failures are not kept. The last
test looks journals up on a real broker."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from pygazette.client.journal_client import JournalClient
from pygazette.client.list_apply import apply_journals
from pygazette.consumer.journal_specs import JournalSpecs, list_specs
from pygazette.protocol.errors import JournalNotFound
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.support.broker_process import BrokerProcess


class _Broker:
    """Answers lookups once `release` is set; records them."""

    def __init__(self, journals: set[str]) -> None:
        self.journals = journals
        self.asked: list[list[str]] = []
        self.release = asyncio.Event()
        self.fail = False

    async def fetch(self, names: Sequence[str]) -> dict[str, pb.JournalSpec]:
        self.asked.append(list(names))
        await self.release.wait()
        if self.fail:
            raise ConnectionError("broker unreachable")
        return {n: pb.JournalSpec(name=n) for n in names if n in self.journals}


async def test_concurrent_asks_are_looked_up_together_once_each() -> None:
    broker = _Broker({f"a/{i}" for i in range(250)})
    now = [0.0]
    specs = JournalSpecs(broker.fetch, max_age=30.0, batch=100, clock=lambda: now[0])
    # 1,000 shards over 250 journals, asking at once.
    asks = [asyncio.ensure_future(specs.get(f"a/{i % 250}")) for i in range(1000)]
    await asyncio.sleep(0)
    broker.release.set()
    got = await asyncio.gather(*asks)
    assert [s.name for s in got] == [f"a/{i % 250}" for i in range(1000)]
    assert sorted(len(b) for b in broker.asked) == [50, 100, 100]
    assert sorted(n for b in broker.asked for n in b) == sorted(f"a/{i}" for i in range(250))

    # Within max_age: answered from what was fetched; past it: fetched again.
    now[0] = 29.0
    assert (await specs.get("a/0")).name == "a/0" and len(broker.asked) == 3
    assert (await specs.get("a/0;meta")).name == "a/0" and len(broker.asked) == 3
    now[0] = 31.0
    assert (await specs.get("a/0")).name == "a/0" and broker.asked[-1] == ["a/0"]
    assert specs.fetches == 4


async def test_failed_or_missing_lookups_fail_their_askers_and_are_tried_again() -> None:
    broker = _Broker({"here"})
    broker.fail = True
    specs = JournalSpecs(broker.fetch)
    asks = [asyncio.ensure_future(specs.get("here")) for _ in range(5)]
    missing = asyncio.ensure_future(specs.get("gone"))
    await asyncio.sleep(0)
    broker.release.set()
    for ask in asks:
        with pytest.raises(ConnectionError):
            await ask
    with pytest.raises(ConnectionError):
        await missing
    assert broker.asked == [["here", "gone"]]
    broker.fail = False
    assert (await specs.get("here")).name == "here"
    with pytest.raises(JournalNotFound):
        await specs.get("gone")
    assert len(broker.asked) == 3


async def test_one_asker_cancelled_leaves_the_lookup_to_the_others() -> None:
    broker = _Broker({"j"})
    specs = JournalSpecs(broker.fetch)
    first = asyncio.ensure_future(specs.get("j"))
    second = asyncio.ensure_future(specs.get("j"))
    await asyncio.sleep(0)
    first.cancel()
    broker.release.set()
    assert (await second).name == "j"
    assert first.cancelled() and broker.asked == [["j"]]


async def test_list_specs_looks_several_journals_up_in_one_list(broker: BrokerProcess) -> None:
    async with JournalClient(broker.address) as client:
        names = ["specs/a", "specs/b", "specs/c"]
        changes = []
        for name in names:
            spec = pb.JournalSpec(name=name, replication=1)
            spec.fragment.length = 1 << 20
            spec.fragment.compression_codec = pb.NONE
            spec.fragment.refresh_interval.FromSeconds(60)
            spec.labels.labels.add(name="content-type", value="application/x-ndjson")
            changes.append(pb.ApplyRequest.Change(upsert=spec))
        await apply_journals(client, changes)
        got = await list_specs(client)(["specs/c", "specs/missing", "specs/a", "specs/c"])
        assert sorted(got) == ["specs/a", "specs/c"]
        assert got["specs/a"].labels.labels[0].value == "application/x-ndjson"


async def test_an_ask_made_as_every_lookup_finishes_is_looked_up() -> None:
    # Every lookup busy with a name of its own; they all finish in one turn of the loop, and
    # a shard woken meanwhile asks for another journal before the finished lookups are
    # dropped from the count of lookups in flight. Its name must still be looked up: it used
    # to wait, with no lookup to take it, until some other ask came along (for ever, in a
    # quiet process: the shard never started).
    broker = _Broker({"a", "b", "c", "d", "e"})
    answered = asyncio.Event()
    all_asked = asyncio.Event()
    fetch = broker.fetch

    async def fetch_then_wake(names: Sequence[str]) -> dict[str, pb.JournalSpec]:
        if len(broker.asked) == 3:
            all_asked.set()
        got = await fetch(names)
        answered.set()  # Wakes the late asker in this turn, ahead of the lookups' ends.
        return got

    specs = JournalSpecs(fetch_then_wake, batch=1, lookups=4)
    asks = [asyncio.ensure_future(specs.get(n)) for n in "abcd"]

    async def late_ask() -> pb.JournalSpec:
        await answered.wait()
        return await specs.get("e")

    late = asyncio.ensure_future(late_ask())
    async with asyncio.timeout(5.0):
        await all_asked.wait()
    assert len(broker.asked) == 4  # One lookup per name, all four in flight.
    broker.release.set()
    assert [s.name for s in await asyncio.gather(*asks)] == list("abcd")
    try:
        async with asyncio.timeout(5.0):
            assert (await late).name == "e"
    finally:
        late.cancel()
