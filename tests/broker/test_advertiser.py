"""Route advertisements batched into shared transactions (`broker.advertiser`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from pygazette.broker.advertiser import RouteAdvertiser
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Compare, Delete, KeyspaceUnavailable, Put, TxnResult


class CountingKeyspace(EmbeddedKeyspace):
    """An embedded keyspace that records each transaction's size (and may fail them)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.txns: list[tuple[int, int]] = []
        self.fail: Exception | None = None
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()  # Set by each transaction.

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> TxnResult:
        self.txns.append((len(compares), len(ops)))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        keys = [op.key for op in ops]
        assert len(keys) == len(set(keys)), "etcd refuses a key put twice in a transaction"
        return await super().txn(compares, ops)


async def _assignments(ks: CountingKeyspace, journals: int) -> dict[str, list[str]]:
    """Two assignment keys a journal, created empty."""
    keys = {f"j{i}": [f"/assign/j{i}#a", f"/assign/j{i}#b"] for i in range(journals)}
    await ks.txn([], [Put(k, b"") for ks_ in keys.values() for k in ks_])
    ks.txns.clear()
    ks.entered.clear()
    return keys


def _advertisement(ks: CountingKeyspace, keys: list[str], value: bytes) -> tuple[list, list]:
    compares = []
    for k in keys:
        kv = ks.get(k)
        assert kv is not None
        compares.append(Compare(k, kv.mod_revision))
    return compares, [Put(k, value, ignore_lease=True) for k in keys]


async def test_concurrent_advertisements_share_one_transaction() -> None:
    ks = CountingKeyspace()
    keys = await _assignments(ks, 30)
    adv = RouteAdvertiser(ks)
    before = ks.revision
    results = await asyncio.gather(
        *(adv.advertise(*_advertisement(ks, k, name.encode())) for name, k in keys.items())
    )
    assert all(r.succeeded for r in results)
    assert {r.revision for r in results} == {before + 1}
    assert ks.txns == [(60, 60)]
    assert (adv.transactions, adv.batches, adv.fallbacks) == (1, 1, 0)
    for name, k in keys.items():
        assert all(ks.get(key).value == name.encode() for key in k)  # type: ignore[union-attr]


async def test_batches_hold_at_most_max_ops() -> None:
    ks = CountingKeyspace()
    keys = await _assignments(ks, 120)
    adv = RouteAdvertiser(ks)  # 100 compares and puts: 50 journals a transaction.
    results = await asyncio.gather(
        *(adv.advertise(*_advertisement(ks, k, b"r")) for k in keys.values())
    )
    assert all(r.succeeded for r in results)
    assert ks.txns == [(100, 100), (100, 100), (40, 40)]


async def test_advertisements_queue_behind_the_transaction_in_flight() -> None:
    ks = CountingKeyspace()
    keys = list((await _assignments(ks, 11)).values())
    adv = RouteAdvertiser(ks)
    ks.gate = asyncio.Event()
    first = adv.submit(*_advertisement(ks, keys[0], b"r"))
    await ks.entered.wait()
    rest = [adv.submit(*_advertisement(ks, k, b"r")) for k in keys[1:]]
    ks.gate.set()
    results = await asyncio.gather(first, *rest)
    assert all(r.succeeded for r in results)
    assert ks.txns == [(2, 2), (20, 20)]


async def test_a_compare_failing_mid_batch_fails_that_advertisement_alone() -> None:
    ks = CountingKeyspace()
    keys = list((await _assignments(ks, 5)).values())
    ads = [_advertisement(ks, k, b"r") for k in keys]
    # Journal 2's assignment changes after its advertisement read it.
    await ks.txn([], [Put(keys[2][1], b"moved")])
    ks.txns.clear()
    adv = RouteAdvertiser(ks)
    results = await asyncio.gather(*(adv.advertise(*ad) for ad in ads))
    assert [r.succeeded for r in results] == [True, True, False, True, True]
    # The batch (which applied nothing), then each advertisement on its own.
    assert ks.txns == [(10, 10)] + [(2, 2)] * 5
    assert (adv.transactions, adv.batches, adv.fallbacks) == (6, 1, 1)
    assert ks.get(keys[2][0]).value == b""  # type: ignore[union-attr]
    assert ks.get(keys[2][1]).value == b"moved"  # type: ignore[union-attr]
    for i in (0, 1, 3, 4):
        assert all(ks.get(k).value == b"r" for k in keys[i])  # type: ignore[union-attr]


async def test_a_key_is_written_once_a_transaction() -> None:
    ks = CountingKeyspace()
    keys = list((await _assignments(ks, 2)).values())
    adv = RouteAdvertiser(ks)
    one = _advertisement(ks, keys[0], b"one")
    other = _advertisement(ks, keys[0], b"other")  # The same journal, another value.
    third = _advertisement(ks, keys[1], b"r")
    results = await asyncio.gather(
        adv.advertise(*one), adv.advertise(*other), adv.advertise(*third)
    )
    # The first and third share a transaction; the second, whose compares the first
    # invalidated, fails in the next.
    assert [r.succeeded for r in results] == [True, False, True]
    assert ks.txns == [(4, 4), (2, 2)]


async def test_the_same_advertisement_is_sent_once() -> None:
    ks = CountingKeyspace()
    keys = list((await _assignments(ks, 1)).values())
    adv = RouteAdvertiser(ks)
    ad = _advertisement(ks, keys[0], b"r")
    ks.gate = asyncio.Event()
    first = adv.submit(*ad)
    assert adv.submit(*ad) is first  # Queued.
    await ks.entered.wait()
    assert adv.submit(*ad) is first  # In flight.
    ks.gate.set()
    assert (await first).succeeded
    assert ks.txns == [(2, 2)]


async def test_a_failed_transaction_fails_its_advertisements() -> None:
    ks = CountingKeyspace()
    keys = list((await _assignments(ks, 3)).values())
    adv = RouteAdvertiser(ks)
    ks.fail = KeyspaceUnavailable("etcd is gone")
    futures = [adv.submit(*_advertisement(ks, k, b"r")) for k in keys]
    await asyncio.wait(futures)
    for fut in futures:
        with pytest.raises(KeyspaceUnavailable):
            fut.result()
    # The advertiser carries on once etcd is back.
    ks.fail = None
    assert (await adv.advertise(*_advertisement(ks, keys[0], b"r"))).succeeded


async def test_a_cancelled_caller_leaves_the_advertisement_be() -> None:
    ks = CountingKeyspace()
    keys = list((await _assignments(ks, 1)).values())
    adv = RouteAdvertiser(ks)
    ks.gate = asyncio.Event()
    ad = _advertisement(ks, keys[0], b"r")
    caller = asyncio.ensure_future(adv.advertise(*ad))
    await ks.entered.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    again = adv.submit(*ad)  # The same transaction, still in flight.
    ks.gate.set()
    assert (await again).succeeded
    assert ks.txns == [(2, 2)]


async def test_stop_cancels_what_is_queued() -> None:
    ks = CountingKeyspace()
    keys = list((await _assignments(ks, 2)).values())
    adv = RouteAdvertiser(ks)
    ks.gate = asyncio.Event()
    first = adv.submit(*_advertisement(ks, keys[0], b"r"))
    await ks.entered.wait()
    second = adv.submit(*_advertisement(ks, keys[1], b"r"))
    await adv.stop()
    assert first.cancelled() and second.cancelled()
    assert adv.submit(*_advertisement(ks, keys[1], b"r")).cancelled()


async def test_a_pulse_advertisement_lingers_for_others_and_an_awaited_one_sends_them() -> None:
    ks = CountingKeyspace()
    keys = list((await _assignments(ks, 4)).values())
    adv = RouteAdvertiser(ks, linger=60.0)
    pulses = [adv.submit(*_advertisement(ks, k, b"r")) for k in keys[:3]]
    for _ in range(10):
        await asyncio.sleep(0)
    assert ks.txns == []  # Waiting for others to join.
    async with asyncio.timeout(10):
        awaited = await adv.advertise(*_advertisement(ks, keys[3], b"r"))
        assert awaited.succeeded
        assert all(r.succeeded for r in await asyncio.gather(*pulses))
    assert ks.txns == [(8, 8)]


async def test_a_full_batch_is_sent_without_lingering() -> None:
    ks = CountingKeyspace()
    keys = list((await _assignments(ks, 50)).values())
    adv = RouteAdvertiser(ks, linger=60.0)
    async with asyncio.timeout(10):
        results = await asyncio.gather(*(adv.submit(*_advertisement(ks, k, b"r")) for k in keys))
    assert all(r.succeeded for r in results)
    assert ks.txns == [(100, 100)]
