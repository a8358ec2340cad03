"""A member's session on a real etcd: its lease outlives a busy event loop."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from pygazette.allocator.allocator import MemberKeyMissing
from pygazette.allocator.metrics import LeaseCollector
from pygazette.allocator.session import MemberSession, mark_exiting, membership_ended
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.keyspace import KeyspaceUnavailable, Put
from pygazette.keyspace.layout import KeyLayout
from tests.support.etcd_process import EtcdProcess
from tests.support.tcp_proxy import TcpProxy

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


async def test_lease_kept_alive_through_etcd_stalls_shorter_than_its_ttl(tmp_path: Path) -> None:
    """etcd stalls again and again (SIGSTOP: a slow disk, a defragmentation), each stall
    longer than a third of the TTL but shorter than the TTL, with a moment's progress
    between. Gazette's lease keep-alive waits for etcd's answer and keeps the lease, as it
    should: every renewal lands before the lease expires. pygazette's gave up on each
    refresh after a third of the TTL and waited another third before the next, so no refresh
    was answered in time and the member lost its lease and exited (Gazette's broker survived
    5 of 5 runs of 6 s stalls at a 10 s TTL, pygazette's none)."""
    own = EtcdProcess(tmp_path / "etcd")  # Its own: it is stopped and resumed.
    own.start()
    assert own.proc is not None
    ks = EtcdKeyspace(own.url, "/stalls")
    key = KeyLayout("/stalls").member_key("zone-a", "slow")
    session = MemberSession(ks, key, b"1", lease_ttl=3.0)  # etcd's shortest here: 3 s.
    try:
        await ks.open()
        await session.start()
        started = time.monotonic()
        while time.monotonic() - started < 10.0 and not session.lost.is_set():
            own.proc.send_signal(signal.SIGSTOP)
            await asyncio.sleep(2.2)
            own.proc.send_signal(signal.SIGCONT)
            await asyncio.sleep(0.3)
        assert not session.lost.is_set(), "the lease was lost while etcd answered within its TTL"
        existing = await ks.get_remote(key)
        assert existing is not None and existing.lease == session.lease
    finally:
        own.proc.send_signal(signal.SIGCONT)
        await session.close()
        await ks.close()
        own.stop()


async def test_lease_kept_alive_when_its_connection_to_etcd_dies_silently(
    etcd: EtcdProcess, etcd_root: str
) -> None:
    """The keep-alive's connection to etcd dies silently (a NAT or firewall losing its state:
    nothing comes back on it, no reset) while etcd itself stays reachable. Gazette's client
    pings its connections (DialKeepAliveTime) and moves to a new one; pygazette's keep-alive
    channel didn't, so each refresh waited on the dead connection until the lease was lost."""
    proxy = TcpProxy(etcd.client_port)
    ks = EtcdKeyspace(proxy.url, etcd_root)
    key = KeyLayout(etcd_root).member_key("zone-a", "silent")
    session = MemberSession(ks, key, b"1", lease_ttl=12.0)
    try:
        await ks.open()
        await session.start()
        refreshed = session.keep_alives
        async with asyncio.timeout(10):
            while session.keep_alives == refreshed:  # noqa: ASYNC110 (a thread's counter)
                await asyncio.sleep(0.01)
        proxy.stall_open()  # Right after a refresh: the whole TTL is left to notice.
        stalled, refreshed = time.monotonic(), session.keep_alives
        async with asyncio.timeout(20):
            while session.keep_alives == refreshed and not session.lost.is_set():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert not session.lost.is_set(), "the lease was lost while etcd was reachable"
        assert time.monotonic() - stalled < 12.0
        existing = await ks.get_remote(key)
        assert existing is not None and existing.lease == session.lease
        # The mirror's watch, on the other channel, moved to a new connection too.
        writer = EtcdKeyspace(etcd.url, etcd_root)
        await writer.open()
        try:
            written = await writer.txn([], [Put(etcd_root + "/after-the-stall", b"1")])
        finally:
            await writer.close()
        await ks.wait_for_revision(written.revision, 15)
    finally:
        await session.close()
        await ks.close()
        proxy.close()


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


class _Kv:
    def __init__(self, value: bytes) -> None:
        self.value = value


class _FlakyEtcd:
    """A mirror and an update that fails `failures` times: `applied` says whether a failed
    update still reached etcd (its answer lost), as when etcd goes away as it commits."""

    def __init__(self, failures: int, *, applied: bool = False) -> None:
        self.value = b"serving"
        self.failures = failures
        self.applied = applied
        self.calls = 0

    def get(self, key: str) -> _Kv:
        return _Kv(self.value)


class _Session:
    def __init__(self, ks: _FlakyEtcd) -> None:
        self.ks = ks
        self.key = "members/m"
        self.lost = asyncio.Event()

    async def update(self, value: bytes) -> int:
        self.ks.calls += 1
        if self.ks.calls <= self.ks.failures:
            if self.ks.applied:
                self.ks.value = value
            raise KeyspaceUnavailable("etcd: UNAVAILABLE")
        self.ks.value = value
        return 1


async def test_marking_a_member_exiting_retries_a_failed_update() -> None:
    """A drain's mark once gave up at the first failed update, and the member then left as
    if it had drained (exit 0), though etcd may have taken the mark (its answer lost) and
    its lease be about to lapse. It is tried again until the deadline or the session's end."""
    session = _Session(_FlakyEtcd(failures=2))
    deadline = time.monotonic() + 10
    assert await mark_exiting(session, b"exiting", deadline, "member")  # type: ignore[arg-type]
    assert session.ks.calls == 3
    # Applied though unanswered: the mirror showing it is enough.
    session = _Session(_FlakyEtcd(failures=5, applied=True))
    assert await mark_exiting(session, b"exiting", deadline, "member")  # type: ignore[arg-type]
    assert session.ks.calls == 1
    # Past the deadline, or once the session is lost: not marked.
    session = _Session(_FlakyEtcd(failures=100))
    near = time.monotonic() + 0.3
    assert not await mark_exiting(session, b"exiting", near, "member")  # type: ignore[arg-type]
    session = _Session(_FlakyEtcd(failures=100))
    asyncio.get_running_loop().call_later(0.3, session.lost.set)
    assert not await mark_exiting(session, b"exiting", deadline, "member")  # type: ignore[arg-type]


class _AnswerLostOnce(EtcdKeyspace):
    """An etcd keyspace whose first transaction is applied by etcd, but whose answer is
    lost on the way back (etcd's leader changed, the connection was cut)."""

    lost_answers = 1

    async def txn(self, compares, ops):  # type: ignore[no-untyped-def]
        result = await super().txn(compares, ops)
        if self.lost_answers:
            self.lost_answers -= 1
            raise KeyspaceUnavailable("etcd: UNAVAILABLE (answer lost)")
        return result


async def test_announcing_retries_a_transaction_whose_answer_was_lost(
    etcd: EtcdProcess, etcd_root: str
) -> None:
    """The announcement is tried again when etcd doesn't answer, and one etcd applied
    is recognised by its lease, as Gazette's Announce does. It failed the member's start
    instead, leaving its key behind until the lease lapsed (the next start waited it out)."""
    ks = _AnswerLostOnce(etcd.url, etcd_root)
    await ks.open()
    key = KeyLayout(etcd_root).member_key("zone-a", "announced")
    session = MemberSession(ks, key, b"1", lease_ttl=TTL)
    try:
        revision = await asyncio.wait_for(session.start(), 10)
        existing = await ks.get_remote(key)
        assert existing is not None and existing.lease == session.lease
        assert existing.mod_revision == revision
        assert ks.get(key) == existing
    finally:
        await session.close()
        await ks.close()
