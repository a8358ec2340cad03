"""A member's session on a real etcd: its lease outlives a busy event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from pygazette.allocator.allocator import MemberKeyMissing
from pygazette.allocator.metrics import LeaseCollector
from pygazette.allocator.session import MemberSession, membership_ended
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.layout import KeyLayout
from tests.support.etcd_process import EtcdProcess

TTL = 2.0


async def test_lease_kept_alive_while_the_event_loop_is_blocked(
    etcd: EtcdProcess, etcd_root: str
) -> None:
    ks = EtcdKeyspace(etcd.url, etcd_root)
    await ks.open()
    key = KeyLayout(etcd_root).member_key("zone-a", "busy")
    session = MemberSession(ks, key, b"1", lease_ttl=TTL)
    try:
        await session.start()
        refreshed = session.keep_alives
        # The loop does nothing else for over twice the TTL (as a broker taking back
        # thousands of journals can): a keep-alive waiting for the loop would let etcd
        # expire the lease, and the member key with it.
        time.sleep(2.5 * TTL)
        assert session.keep_alives >= refreshed + 3
        assert session.lease_alive()
        assert not session.lost.is_set()
        existing = await ks.get_remote(key)
        assert existing is not None and existing.lease == session.lease
        # Both are exposed to scrapes.
        samples = {
            sample.name: sample.value
            for family in LeaseCollector(lambda: session).collect()
            for sample in family.samples
        }
        assert samples["pygazette_etcd_lease_keepalives_total"] == session.keep_alives
        assert 0 < samples["pygazette_etcd_lease_keepalive_max_seconds"] < TTL
    finally:
        await session.close()
        await ks.close()
    assert await ks_key_gone(etcd, etcd_root, key)


async def ks_key_gone(etcd: EtcdProcess, root: str, key: str) -> bool:
    """Whether `key` is gone from etcd (closing revoked the lease)."""
    ks = EtcdKeyspace(etcd.url, root)
    await ks.open()
    try:
        return await ks.get_remote(key) is None
    finally:
        await ks.close()


async def test_membership_ends_drained_lost_or_with_its_key_missing() -> None:
    async def allocator(outcome: BaseException | None, after: asyncio.Event) -> None:
        await after.wait()
        if outcome is not None:
            raise outcome

    # The allocator finished on its own: the member drained.
    lost, go = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(allocator(None, go))
    go.set()
    assert await membership_ended(lost, task) is None

    # The lease was lost while the allocator still ran.
    lost, never = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(allocator(None, never))
    asyncio.get_running_loop().call_soon(lost.set)
    assert await membership_ended(lost, task) == "the etcd lease was lost"
    task.cancel()

    # The member's key vanished: the allocator's error says why.
    lost, go = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(allocator(MemberKeyMissing("member key is gone"), go))
    go.set()
    assert await membership_ended(lost, task) == "member key is gone"

    # Any other failure is the allocator's own, and raised.
    task = asyncio.create_task(allocator(RuntimeError("bug"), go))
    with pytest.raises(RuntimeError, match="bug"):
        await membership_ended(asyncio.Event(), task)
