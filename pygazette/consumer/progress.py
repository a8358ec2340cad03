"""`Progress`: what a shard has committed, and waiting for it (the Stat RPC's read-your-writes).

`read_through` holds, per source journal, the offset through which committed transactions
have consumed; `publish_at` holds, per output journal, the offset through which the shard's
acknowledgements have been appended. Both only grow while a shard is primary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

__all__ = ["Progress"]


class Progress:
    def __init__(self) -> None:
        self.read_through: dict[str, int] = {}
        self.publish_at: dict[str, int] = {}
        self.transactions = 0
        self.messages = 0
        self.bytes = 0
        self._changed = asyncio.Condition()

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        return dict(self.read_through), dict(self.publish_at)

    async def advance(
        self,
        read_through: Mapping[str, int],
        publish_at: Mapping[str, int],
        *,
        messages: int = 0,
        nbytes: int = 0,
    ) -> None:
        """Record a committed transaction's offsets and wake waiters."""
        for journal, offset in read_through.items():
            if offset > self.read_through.get(journal, -1):
                self.read_through[journal] = offset
        for journal, offset in publish_at.items():
            if offset > self.publish_at.get(journal, -1):
                self.publish_at[journal] = offset
        if messages or nbytes:
            self.transactions += 1
            self.messages += messages
            self.bytes += nbytes
        async with self._changed:
            self._changed.notify_all()

    def covers(self, read_through: Mapping[str, int]) -> bool:
        return all(self.read_through.get(j, -1) >= o for j, o in read_through.items())

    async def wait_for(
        self, read_through: Mapping[str, int], within: float | None
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Wait until every journal in `read_through` is read through at least its offset;
        returns the snapshot (TimeoutError after `within` seconds)."""
        if not self.covers(read_through):
            async with asyncio.timeout(within), self._changed:
                await self._changed.wait_for(lambda: self.covers(read_through))
        return self.snapshot()
