"""The keyspace interface: revisioned keys, compare-and-swap transactions, change watches.

It models the part of etcd that brokers use: every write bumps one global revision; each
key remembers the revision that created and last modified it; a transaction applies all of
its operations only if every compared key still has the expected mod revision (0 = absent).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class Compare:
    """Holds when `key`'s mod revision equals `mod_revision` (0: the key does not exist)."""

    key: str
    mod_revision: int


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


Listener = Callable[[int], None]


class Keyspace(abc.ABC):
    """A revisioned key/value mirror with transactions and change notification."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._changed = asyncio.Condition()

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
        self._listeners.append(listener)

    async def _notify(self, revision: int) -> None:
        for listener in self._listeners:
            listener(revision)
        async with self._changed:
            self._changed.notify_all()

    async def wait_for_revision(self, revision: int) -> None:
        """Return once the mirror has applied `revision`."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.revision >= revision)

    async def close(self) -> None:
        """Release resources (watches, connections)."""
        self._listeners.clear()
