"""`LocalSession`: membership of the only consumer on an embedded keyspace (no etcd).

With no etcd there are no leases: the one process owns its member key for as long as it
runs, and keeps it (with its assignments) across restarts, so a restarted process picks
its shards up again. It offers what the runner uses of `MemberSession`.
"""

from __future__ import annotations

import asyncio

from pygazette.keyspace.keyspace import Compare, Keyspace, KeyspaceUnavailable, Put

__all__ = ["LocalSession"]


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
