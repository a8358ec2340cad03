"""Allocators of several members on a real etcd: sessions, leadership, failover, exit."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from pygazette.allocator.allocator import Allocator, MemberKeyMissing, ObservedState
from pygazette.allocator.session import MemberSession
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.keyspace import Put
from pygazette.keyspace.layout import KeyLayout
from tests.allocator.test_allocation import TextDecoder
from tests.support.etcd_process import EtcdProcess


@dataclass
class Member:
    name: str
    ks: EtcdKeyspace
    session: MemberSession
    observed: ObservedState
    task: asyncio.Task[None]

    async def close(self, *, revoke: bool) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, MemberKeyMissing):
            await self.task
        await self.session.close(revoke=revoke)
        await self.ks.close()


async def _member(etcd: EtcdProcess, root: str, name: str, limit: int = 10) -> Member:
    layout = KeyLayout(root)
    zone, suffix = name.split("/")
    ks = EtcdKeyspace(etcd.url, root)
    await ks.open()
    key = layout.member_key(zone, suffix)
    session = MemberSession(ks, key, str(limit).encode(), lease_ttl=2)
    await session.start()
    observed = ObservedState(ks, layout, TextDecoder(), key)
    task = asyncio.create_task(Allocator(ks, observed).run())
    return Member(name, ks, session, observed, task)


def _holders(m: Member, item: str) -> set[str]:
    return {f"{a.zone}/{a.suffix}" for a in m.observed.current.assignments_of(item)}


async def _until(m: Member, cond, what: str, within: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    try:
        async with asyncio.timeout(within):
            while not cond():
                await m.ks.wait_for_change(m.ks.revision)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


async def test_allocation_follows_members(etcd: EtcdProcess, etcd_root: str) -> None:
    layout = KeyLayout(etcd_root)
    m1 = await _member(etcd, etcd_root, "a/member-1")
    m2 = await _member(etcd, etcd_root, "b/member-2")
    m3 = await _member(etcd, etcd_root, "a/member-3")
    members = [m1, m2, m3]
    try:
        assert m1.observed.current.is_leader()
        await m1.ks.txn([], [Put(layout.item_key(f"item-{i}"), b"2") for i in range(6)])

        def all_assigned() -> bool:
            return all(len(_holders(m1, f"item-{i}")) == 2 for i in range(6))

        await _until(m1, all_assigned, "every item has two members")
        assert all(
            {h.split("/")[0] for h in _holders(m1, f"item-{i}")} == {"a", "b"} for i in range(6)
        )

        # The leader dies without a word: its lease expires and member-2 leads.
        await m1.close(revoke=False)
        members.remove(m1)
        await _until(m2, lambda: m2.observed.current.is_leader(), "member-2 leads", 30)
        await _until(
            m2,
            lambda: all(
                _holders(m2, f"item-{i}") == {"b/member-2", "a/member-3"} for i in range(6)
            ),
            "items move to the surviving members",
        )

        # A member that is told to exit hands its items off and its allocator returns.
        m4 = await _member(etcd, etcd_root, "b/member-4")
        members.append(m4)
        await _until(
            m2,
            lambda: sum("b/member-4" in _holders(m2, f"item-{i}") for i in range(6)) > 0,
            "m4 gets items",
        )
        await m3.session.update(b"10,exiting")
        await asyncio.wait_for(m3.task, 60)  # Returns once nothing is assigned to it.
        await _until(
            m2,
            lambda: all(len(_holders(m2, f"item-{i}") - {"a/member-3"}) == 2 for i in range(6)),
            "member-3's items are all elsewhere",
        )
        assert all("a/member-3" not in _holders(m3, f"item-{i}") for i in range(6))
    finally:
        for m in members:
            await m.close(revoke=True)
