"""`Shard`: what an application sees of a shard it processes.

A Shard handle is given to every Application callback. It says which shard this is (its
spec and current assignment), gives the journal client the shard reads and publishes
through, and reports progress: the source offsets read through by the last committed
transaction, and the offsets its outputs were published at.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from pygazette.client.journal_client import JournalClient
from pygazette.keyspace.keyspace import KeyValue
from pygazette.protocol.pb import consumer_pb2 as cpb

__all__ = ["Shard"]


class Shard(Protocol):
    @property
    def id(self) -> str:
        """The shard's ID."""
        ...

    @property
    def spec(self) -> cpb.ShardSpec:
        """The current ShardSpec (it may change while the shard runs)."""
        ...

    @property
    def assignment(self) -> KeyValue:
        """The keyspace assignment of this shard to this consumer process."""
        ...

    @property
    def client(self) -> JournalClient:
        """The journal client of the consumer process."""
        ...

    @property
    def stopping(self) -> asyncio.Event:
        """Set when the shard is being stopped (reassigned, cancelled, or the process exits)."""
        ...

    @property
    def recovery_log(self) -> str:
        """The shard's recovery log journal ('' without one)."""
        ...

    @property
    def local_dir(self) -> str:
        """A directory private to this shard's assignment in this process."""
        ...

    def progress(self) -> tuple[dict[str, int], dict[str, int]]:
        """(read_through, publish_at): source offsets read through by the last committed
        transaction, and journal offsets its outputs (and ACKs) were published through."""
        ...
