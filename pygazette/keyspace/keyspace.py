"""The keyspace interface: revisioned keys, compare-and-swap transactions, change watches.

It models the part of etcd that brokers use: every write bumps one global revision; each
key remembers the revision that created and last modified it (and the lease it lives
under, if any); a transaction applies all of its operations only if every compared key
still has the expected mod revision (0 = absent). A keyspace mirrors the keys under one
root (Gazette's default: `/gazette/cluster`).
"""

from __future__ import annotations

import abc
import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_ROOT = "/gazette/cluster"
# etcd's default --max-txn-ops: the most operations (and compares) one transaction may hold.
MAX_TXN_OPS = 128


# Weakly referenceable: what is decoded from a value lives as long as its KeyValue (as
# Gazette keeps a decoded value beside its key-value), e.g. `broker.allocation.JournalDecoder`.
@dataclass(frozen=True, slots=True, weakref_slot=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0  # The etcd lease the key is attached to (0: none).


@dataclass(frozen=True, slots=True)
class Put:
    """Set `key` to `value`, attached to `lease` (0: none); `ignore_lease` keeps its lease."""

    key: str
    value: bytes
    lease: int = 0
    ignore_lease: bool = False


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class Compare:
    """Holds when `key`'s mod revision equals `mod_revision` (0: the key does not exist)."""

    key: str
    mod_revision: int


class KeyspaceUnavailable(Exception):
    """The coordination store could not be reached (or refused the request)."""


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int


@dataclass(frozen=True, slots=True)
class ClusterIdentity:
    """What a response Header reports of the coordination store."""

    cluster_id: int
    member_id: int
    raft_term: int


@dataclass(frozen=True, slots=True)
class KeyChanges:
    """What one applied change did: the keys it changed that exist after it (with their
    values then) and those it left deleted (each key once, in one list or the other), and
    the mirror's revision before (`prior`) and after it. `reset` means the mirror was
    (re)loaded whole: listeners must read it from scratch, not apply the lists."""

    prior: int
    revision: int
    puts: Sequence[KeyValue] = ()
    deletes: Sequence[str] = ()
    reset: bool = False


Listener = Callable[[int], None]
ChangeListener = Callable[[KeyChanges], None]

log = logging.getLogger(__name__)


class Keyspace(abc.ABC):
    """A revisioned key/value mirror with transactions and change notification."""

    def __init__(self, root: str = DEFAULT_ROOT) -> None:
        if not root.startswith("/") or root.endswith("/"):
            raise ValueError(f"keyspace root must start and not end with '/': {root!r}")
        self.root = root
        self._listeners: list[ChangeListener] = []
        self._changed = asyncio.Condition()
        # wait_for_revision's waiters by revision: a change wakes only those it satisfies
        # (through a Condition, every change woke every waiter: O(waiters) per change).
        self._revision_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_seq = itertools.count()

    @property
    @abc.abstractmethod
    def revision(self) -> int:
        """The revision of the latest change this mirror has applied."""

    @property
    @abc.abstractmethod
    def identity(self) -> ClusterIdentity: ...

    @abc.abstractmethod
    def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    def range(self, prefix: str) -> list[KeyValue]:
        """Keys starting with `prefix`, in key order."""

    @abc.abstractmethod
    async def txn(self, compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> TxnResult:
        """Apply `ops` atomically iff every compare holds."""

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(revision)` after each applied change."""
        self._listeners.append(lambda changes: listener(changes.revision))

    def add_change_listener(self, listener: ChangeListener) -> None:
        """Call `listener(changes)` after each applied change (a transaction, or all events
        of one watch response), in registration order with `add_listener`'s."""
        self._listeners.append(listener)

    async def _notify(self, changes: KeyChanges) -> None:
        revision = changes.revision
        for listener in self._listeners:
            try:
                listener(changes)
            except Exception:  # One broken listener must not stop the mirror.
                log.exception("keyspace listener failed", extra={"revision": revision})
        waiters, reached = self._revision_waiters, self.revision
        while waiters and waiters[0][0] <= reached:
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                fut.set_result(None)
        async with self._changed:
            self._changed.notify_all()

    async def wait_for_revision(self, revision: int, within: float | None = None) -> None:
        """Return once the mirror has applied `revision` (TimeoutError after `within` s)."""
        if self.revision >= revision:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._revision_waiters, (revision, next(self._waiter_seq), fut))
        try:
            async with asyncio.timeout(within):
                await fut
        finally:
            if not fut.done():
                fut.cancel()  # Dropped from the heap once its revision is reached.

    async def wait_for_store_revision(self, revision: int, within: float | None = None) -> None:
        """`wait_for_revision` for a revision of the whole store, such as one a peer's
        Header names: a store shared with other roots (etcd) may reach it through writes
        the mirror never sees, and the mirror then stands for it once no key under the
        root changed up to it."""
        await self.wait_for_revision(revision, within)

    async def wait_until(self, predicate: Callable[[], bool], within: float | None = None) -> None:
        """Return once `predicate()` holds, checking it after each applied change
        (TimeoutError after `within` s)."""
        if predicate():
            return
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_for_change(self, after: int, within: float | None = None) -> None:
        """Return once the mirror has applied a revision greater than `after`."""
        await self.wait_for_revision(after + 1, within)

    async def close(self) -> None:
        """Release resources (watches, connections)."""
        self._listeners.clear()
