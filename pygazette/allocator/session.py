"""A member's session: its key announced under an etcd lease that is kept alive.

The key says the member exists (and, in its value, what it can take); the lease says it is
alive. `start` grants the lease and creates the key, waiting out an earlier incarnation's
key if one still exists under another lease (it vanishes when that lease expires), and
trying again while etcd doesn't answer (an announcement applied unanswered is ours). A
keep-alive refreshes the lease every third of its TTL (a refresh etcd is slow to answer is
waited for, a failed one retried within half a second); if the lease can't be refreshed
before it would expire (or etcd reports it gone), `lost` is set and the member must stop
acting as one — its key and all its assignments are gone or about to be.

The keep-alive runs on a thread of its own, with its own synchronous channel to etcd
(`EtcdKeyspace.keep_alive_blocking`), not on the event loop: a loop kept busy for seconds
(a broker taking back thousands of journals after a restart) must not let the lease expire
while the member is alive. The thread only refreshes the lease and reports; everything the
member does on losing it runs on the loop (`lost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time

from pygazette.allocator.allocator import MemberKeyMissing
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.keyspace import Compare, KeyspaceUnavailable, Put

log = logging.getLogger(__name__)

ANNOUNCE_RETRY_SECONDS = 0.5
MARK_EXITING_RETRY_SECONDS = 0.5  # A failed mark of a draining member, tried again.
# How soon a failed lease refresh is tried again (Gazette's etcd client: retryConnWait).
KEEP_ALIVE_RETRY_SECONDS = 0.5


class MemberSession:
    def __init__(self, ks: EtcdKeyspace, key: str, value: bytes, lease_ttl: float) -> None:
        self.ks = ks
        self.key = key
        self.value = value
        self.lease_ttl = lease_ttl
        self.lease = 0
        self.lost = asyncio.Event()
        # Monotonic time until which the lease is surely alive: a keep-alive's send time
        # plus the TTL etcd granted. Past it, the lease may have expired unnoticed (e.g.
        # the process was frozen), and the member must not commit anything.
        self.lease_deadline = 0.0
        self.keep_alives = 0  # Refreshes etcd acknowledged (for tests and diagnostics).
        # The longest a refresh waited for etcd's answer (s).
        self.slowest_keep_alive = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    async def start(self) -> int:
        """Grant the lease and announce the key; returns the announcement's revision."""
        sent = time.monotonic()
        self.lease = await self.ks.grant_lease(max(1, math.ceil(self.lease_ttl)))
        self.lease_deadline = sent + self.lease_ttl
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._keep_alive,
            args=(asyncio.get_running_loop(),),
            name="lease-keepalive",
            daemon=True,
        )
        self._thread.start()
        warned = failed = False
        while True:
            if self.lost.is_set():
                raise KeyspaceUnavailable(f"the etcd lease was lost announcing {self.key}")
            # An announcement etcd didn't answer is tried again (it may have been applied:
            # then the key is found under this lease), as Gazette's Announce does.
            try:
                result = await self.ks.txn(
                    [Compare(self.key, 0)], [Put(self.key, self.value, lease=self.lease)]
                )
                if result.succeeded:
                    revision = result.revision
                    break
                existing = await self.ks.get_remote(self.key)
            except KeyspaceUnavailable as exc:
                if not failed:
                    log.warning(
                        "cannot announce the member key yet (will retry)",
                        extra={"key": self.key, "error": str(exc)},
                    )
                    failed = True
                await asyncio.sleep(ANNOUNCE_RETRY_SECONDS)
                continue
            if existing is not None and existing.lease == self.lease:
                revision = existing.mod_revision
                break
            if not warned:
                log.warning(
                    "member key exists under another lease; waiting for it to expire",
                    extra={"key": self.key},
                )
                warned = True
            await asyncio.sleep(ANNOUNCE_RETRY_SECONDS)
        await self.ks.wait_for_revision(revision)
        return revision

    async def update(self, value: bytes) -> int:
        """Replace the announced value (keeping the key's lease); returns the revision."""
        kv = self.ks.get(self.key)
        if kv is None:
            raise KeyspaceUnavailable(f"member key {self.key} is gone")
        result = await self.ks.txn(
            [Compare(self.key, kv.mod_revision)], [Put(self.key, value, ignore_lease=True)]
        )
        if not result.succeeded:
            raise KeyspaceUnavailable(f"member key {self.key} changed concurrently")
        self.value = value
        await self.ks.wait_for_revision(result.revision)
        return result.revision

    def _keep_alive(self, loop: asyncio.AbstractEventLoop) -> None:
        """The keep-alive thread: refresh every third of the TTL until stopped or lost.

        A refresh waits for etcd's answer as long as the lease may still be alive (a slow
        etcd still renews it in time), and a failed one is retried soon, not a third of the
        TTL later; the lease is lost once a TTL passed since the last answer. So Gazette's
        keep-alive does: its requests wait on a stream, resent every half second."""
        interval = self.lease_ttl / 3
        last_ok = time.monotonic()
        failing = False
        while not self._stop.is_set():
            sent = time.monotonic()
            wait = interval
            try:
                ttl = self.ks.keep_alive_blocking(
                    self.lease,
                    within=max(KEEP_ALIVE_RETRY_SECONDS, last_ok + self.lease_ttl - sent),
                )
            except KeyspaceUnavailable as exc:
                if self._stop.is_set():
                    return
                if time.monotonic() - last_ok > self.lease_ttl:
                    log.error(
                        "cannot keep the etcd lease alive",
                        extra={"key": self.key, "error": str(exc)},
                    )
                    self._lose(loop)
                    return
                if not failing:
                    log.warning("lease keep-alive failed (will retry)", extra={"error": str(exc)})
                failing = True
                wait = KEEP_ALIVE_RETRY_SECONDS
            else:
                if ttl <= 0:
                    log.error("etcd lease expired", extra={"key": self.key})
                    self._lose(loop)
                    return
                last_ok = time.monotonic()
                failing = False
                self.slowest_keep_alive = max(self.slowest_keep_alive, last_ok - sent)
                self.keep_alives += 1
                self.lease_deadline = sent + ttl
            self._stop.wait(wait)

    def _lose(self, loop: asyncio.AbstractEventLoop) -> None:
        """(The keep-alive thread.) The lease is lost: nothing may commit from now on, and
        the loop learns of it through `lost`."""
        self.lease_deadline = 0.0
        with contextlib.suppress(RuntimeError):  # The loop closed meanwhile.
            loop.call_soon_threadsafe(self.lost.set)

    def lease_alive(self, margin: float = 0.0) -> bool:
        """The lease is surely alive for `margin` more seconds."""
        return not self.lost.is_set() and time.monotonic() + margin < self.lease_deadline

    async def close(self, *, revoke: bool = True) -> None:
        """Stop keeping the lease alive; with `revoke`, drop it (and the member's keys) now."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            self.ks.close_blocking_channel()  # Ends a refresh in flight.
            await asyncio.to_thread(thread.join)
        if revoke and self.lease and not self.lost.is_set():
            await self.ks.revoke_lease(self.lease)


async def mark_exiting(session: MemberSession, value: bytes, deadline: float, what: str) -> bool:
    """Announce `value` (the member's spec, marked exiting) before a drain; whether it is.

    An update etcd fails to answer may still have been applied (etcd went away as it
    committed), and a brief outage ends: so a failed one is tried again, every
    MARK_EXITING_RETRY_SECONDS, until the mirror shows the value, an update succeeds,
    `deadline` passes, or the session is lost (False: the caller's membership ends, and it
    must leave as a failed member, not as one that drained)."""
    warned = False
    while not session.lost.is_set():
        kv = session.ks.get(session.key)
        if kv is not None and kv.value == value:
            return True
        try:
            await session.update(value)
            return True
        except Exception as exc:
            if not warned:
                log.warning(
                    f"cannot mark this {what} exiting yet (retrying)", extra={"error": str(exc)}
                )
                warned = True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            log.warning(f"cannot mark this {what} exiting: leaving without a drain")
            return False
        await asyncio.sleep(min(MARK_EXITING_RETRY_SECONDS, remaining))
    return False


async def membership_ended(lost: asyncio.Event, allocator: asyncio.Task[None]) -> str | None:
    """Wait until a member's allocator finishes (the member drained: None) or its membership
    is lost (`lost`, its session's): then why — the lease expired, or the member's key
    vanished (`MemberKeyMissing`). Any other failure of the allocator is raised."""
    lost_wait = asyncio.ensure_future(lost.wait())
    try:
        await asyncio.wait([allocator, lost_wait], return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost_wait.cancel()
    if lost.is_set():
        return "the etcd lease was lost"
    try:
        allocator.result()
    except MemberKeyMissing as exc:
        return str(exc)
    return None
