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


async def test_an_item_wider_than_a_transaction_converges(
    etcd: EtcdProcess, etcd_root: str
) -> None:
    """An item whose changes need more operations than etcd takes in one transaction
    (--max-txn-ops, 128: a shard of 149 hot standbys over 150 consumers) converges over
    several rounds, adding and then removing its assignments a transaction's worth at a
    time. Its group went whole into one transaction, which etcd refused every round (and
    the items after it in the round never converged)."""
    from pygazette.allocator.converge import BatchedTxn, converge, unchanged
    from pygazette.allocator.solver import DesiredPlan
    from pygazette.allocator.state import AllocatorState
    from pygazette.keyspace.keyspace import Delete

    layout = KeyLayout(etcd_root)
    ks = EtcdKeyspace(etcd.url, etcd_root)
    await ks.open()
    leader = layout.member_key("a", "leader")
    try:
        await ks.txn([], [Put(leader, b"0")])
        members = [Put(layout.member_key("a", f"m{i:03d}"), b"1") for i in range(150)]
        for start in range(0, len(members), 100):
            await ks.txn([], members[start : start + 100])
        r = await ks.txn(
            [],
            [Put(layout.item_key("wide"), b"150"), Put(layout.item_key("zz-narrow"), b"1")],
        )
        await ks.wait_for_revision(r.revision, 10)

        async def rounds() -> None:
            for _ in range(10):
                state = AllocatorState.extract(ks, layout, TextDecoder(), leader)
                plan = DesiredPlan()
                plan.update(state, None)
                work = state.for_convergence()
                txn = BatchedTxn(ks, [unchanged(work.members[work.local_member].kv)])
                await converge(work, plan.by_item, txn)
                await txn.flush()
                if txn.revision == 0:
                    return
                await ks.wait_for_revision(txn.revision, 10)
            raise AssertionError("did not converge")

        await rounds()
        state = AllocatorState.extract(ks, layout, TextDecoder(), leader)
        assert len(state.assignments_of("wide")) == 149  # zz-narrow holds the 150th member.
        assert len(state.assignments_of("zz-narrow")) == 1
        # Its replication drops to 1: 148 removals.
        r = await ks.txn([], [Put(layout.item_key("wide"), b"1")])
        await ks.wait_for_revision(r.revision, 10)
        await rounds()
        state = AllocatorState.extract(ks, layout, TextDecoder(), leader)
        assert [a.slot for a in state.assignments_of("wide")] == [0]
        # Grown again, then deleted: 149 dead assignments go.
        r = await ks.txn([], [Put(layout.item_key("wide"), b"150")])
        await ks.wait_for_revision(r.revision, 10)
        await rounds()
        r = await ks.txn([], [Delete(layout.item_key("wide"))])
        await ks.wait_for_revision(r.revision, 10)
        await rounds()
        assert ks.range(layout.assign_prefix + "wide#") == []
    finally:
        await ks.close()


async def test_keys_that_are_not_utf8_do_not_stop_members(
    etcd: EtcdProcess, etcd_root: str
) -> None:
    """etcd keys are bytes: a key under the root that is not UTF-8 (written by another
    tool) is an undecodable key like any other, logged and left alone, as Gazette's keyspace
    does. The mirror decoded keys as UTF-8: such a key made its load fail (no member could
    start) and each watch response bringing one fail, the watch restarting from the same
    revision for ever: the mirror froze, and with it allocation on every member."""
    import aetcd.rpc as etcd_rpc

    layout = KeyLayout(etcd_root)
    writer = EtcdKeyspace(etcd.url, etcd_root)
    await writer.open()
    root = etcd_root.encode()
    foreign = [
        root + b"/items/\xff\xfe",
        root + b"/assign/\xff\xfe#a#member-1#0",
        root + b"/assign/item-x#a\xc3#member-1#1",
        root + b"/members/a#\xff",
    ]

    async def put_raw(key: bytes) -> None:
        await writer._client.kvstub.Put(etcd_rpc.PutRequest(key=key, value=b"1"))

    m1: Member | None = None
    try:
        await put_raw(foreign[0])  # Before the member loads the keyspace...
        m1 = await _member(etcd, etcd_root, "a/member-1")
        assert len(m1.ks.range(layout.items_prefix)) == 1
        for key in foreign[1:]:  # ...and while it watches.
            await put_raw(key)
        r = await writer.txn([], [Put(layout.item_key("item-x"), b"1")])
        await m1.ks.wait_for_revision(r.revision, 10)
        await _until(m1, lambda: _holders(m1, "item-x") == {"a/member-1"}, "item-x is assigned")
        assert not m1.task.done()
        assert len(m1.ks.range(etcd_root + "/")) == 3 + len(foreign)  # Member, item, slot.
        # Left alone, as undecodable keys are.
        for key in foreign:
            resp = await writer._client.kvstub.Range(etcd_rpc.RangeRequest(key=key))
            assert len(resp.kvs) == 1, key
    finally:
        if m1 is not None:
            await m1.close(revoke=True)
        await writer.close()
