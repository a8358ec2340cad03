"""`LocalSession`: membership of the only consumer on an embedded keyspace (no etcd).

With no etcd there are no leases: the one process owns its member key for as long as it
runs, and keeps it (with its assignments) across restarts, so a restarted process picks
its shards up again. It offers what the runner uses of `MemberSession`. A restarted
process starts its FAILED shards afresh (`clear_failed_assignments`), as one on etcd does.
"""

from __future__ import annotations

import asyncio

from pygazette.consumer.key_space import ShardDecoder
from pygazette.keyspace.keyspace import Compare, Delete, Keyspace, KeyspaceUnavailable, Put
from pygazette.keyspace.layout import KeyDecodeError, KeyLayout
from pygazette.protocol.pb import consumer_pb2 as cpb

__all__ = ["LocalSession", "clear_failed_assignments"]


async def clear_failed_assignments(
    ks: Keyspace, layout: KeyLayout, decoder: ShardDecoder, zone: str, suffix: str
) -> list[str]:
    """Remove the member's FAILED assignments; returns their shards.

    On etcd a restarted consumer is a new member: its old lease, and the assignments under
    it (FAILED ones too), are gone, and its shards are assigned and started afresh. Here
    the member and its assignments outlive the process, so a shard that failed stayed
    FAILED across restarts (until `shards unassign --failed`), the restart after a fix
    included. Removed, the allocator assigns those shards again."""
    compares: list[Compare] = []
    ops: list[Put | Delete] = []
    shards: list[str] = []
    for kv in ks.range(layout.assign_prefix):
        try:
            a = layout.parse_assignment_key(kv.key)
        except KeyDecodeError:
            continue
        if (a.zone, a.suffix) != (zone, suffix):
            continue
        status = decoder.replica_status(kv)
        if status is not None and status.code == cpb.ReplicaStatus.FAILED:
            compares.append(Compare(kv.key, kv.mod_revision))
            ops.append(Delete(kv.key))
            shards.append(a.item)
    if ops and not (await ks.txn(compares, ops)).succeeded:
        raise KeyspaceUnavailable("assignments changed while clearing failed ones")
    return shards


class LocalSession:
    def __init__(self, ks: Keyspace, key: str, value: bytes) -> None:
        self.ks = ks
        self.key = key
        self.value = value
        self.lost = asyncio.Event()

    async def start(self) -> int:
        kv = self.ks.get(self.key)
        result = await self.ks.txn(
            [Compare(self.key, kv.mod_revision if kv else 0)], [Put(self.key, self.value)]
        )
        if not result.succeeded:
            raise KeyspaceUnavailable(f"member key {self.key} changed concurrently")
        return result.revision

    async def update(self, value: bytes) -> int:
        self.value = value
        return await self.start()

    def lease_alive(self, margin: float = 0.0) -> bool:
        return True

    async def close(self, *, revoke: bool = True) -> None:
        """Nothing to release: the member key outlives the process on purpose."""
