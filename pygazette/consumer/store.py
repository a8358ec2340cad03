"""The `Store` contract: where a shard keeps its state and its checkpoint, committed together.

A store holds an application's state for one shard. Each consumer transaction ends with
`start_commit(shard, checkpoint, wait_for)`: the store makes the transaction's changes *and*
the checkpoint (source offsets, producer states, ACK intents) durable in one atomic commit,
but only after every future in `wait_for` (the transaction's uncommitted output appends)
has resolved. `start_commit` returns at once with a future of that commit, so the next
transaction consumes while this one commits; the shard awaits commits in order.

`restore_checkpoint(shard)` returns the checkpoint of the last commit (an empty Checkpoint
for a new store). Stores fenced against a newer primary (a recovery log's author register,
a SQL fence column) fail every commit of a deposed primary.

`destroy()` releases everything the store holds locally (files, connections).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING

from pygazette.protocol.pb import consumer_pb2 as cpb

if TYPE_CHECKING:
    from pygazette.consumer.shard_api import Shard

__all__ = ["CommitFuture", "Store", "StoreFenced"]

CommitFuture = asyncio.Future[None]


class StoreFenced(Exception):
    """A newer primary owns the shard's store: this commit (and every later one) fails."""


class Store(abc.ABC):
    """A shard's state and checkpoint (see the module docstring)."""

    @abc.abstractmethod
    async def restore_checkpoint(self, shard: Shard) -> cpb.Checkpoint:
        """The checkpoint of the last commit; an empty Checkpoint if there was none."""

    @abc.abstractmethod
    def start_commit(
        self, shard: Shard, checkpoint: cpb.Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> CommitFuture:
        """Begin an atomic commit of the transaction's state with `checkpoint`, after every
        `wait_for` resolves; returns a future resolving once it is durable (or failing)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Release local resources; the store is unusable afterwards."""
