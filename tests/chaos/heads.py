"""Write-head readers: the head of every journal, as readers on every broker see it.

For each journal, one reader through the broker balancer and one pinned to each broker
(which serves the read from its own replica if it holds one, else proxies it) ask for the
write head (a non-blocking read at offset -1) every few seconds. The head each reader sees
must never move back, and must reach every append acknowledged before the read began.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from pygazette.protocol.pb import protocol_pb2 as pb
from tests.chaos.clients import Reconnecting
from tests.chaos.record import Record

READ_DEADLINE = 5.0


async def write_head(conn: Reconnecting, journal: str) -> tuple[int, str] | None:
    """The journal's write head as the broker behind `conn` answers it, and the broker that
    answered (None: no answer)."""
    head: int | None = None
    served_by = ""
    async with asyncio.timeout(READ_DEADLINE):
        async for resp in conn.client.rpc_read(
            pb.ReadRequest(journal=journal, offset=-1, block=False)
        ):
            if resp.HasField("header"):
                served_by = resp.header.process_id.suffix
            if resp.status in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
                head = max(head or 0, int(resp.write_head))
            if resp.status != pb.OK:
                break
    return None if head is None else (head, served_by)


class HeadMonitor:
    def __init__(self, record: Record) -> None:
        self.record = record
        self.reads = 0
        self.regressions = 0
        self.behind_acks = 0
        self.last: dict[tuple[str, str], int] = {}

    async def watch(
        self,
        readers: dict[str, str],
        journals: Sequence[str],
        stop: asyncio.Event,
        every: float = 3.0,
    ) -> None:
        """Poll every journal's head through each reader (name -> address) until `stop`."""

        async def one(name: str, address: str) -> None:
            conn = Reconnecting(address)
            try:
                while not stop.is_set():
                    for journal in journals:
                        if stop.is_set():
                            break
                        await self._check(name, conn, journal)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), every)
            finally:
                await conn.close()

        await asyncio.gather(*(one(n, a) for n, a in readers.items()))

    async def _check(self, name: str, conn: Reconnecting, journal: str) -> None:
        acked = self.record.acked_end.get(journal, 0)
        try:
            answer = await write_head(conn, journal)
        except Exception as exc:
            await conn.on_error(exc)
            return
        if answer is None:
            return
        head, served_by = answer
        if head == 0 and acked == 0:
            return
        self.reads += 1
        key = (name, journal)
        last = self.last.get(key, 0)
        if head < last:
            self.regressions += 1
            self.record.anomaly(
                "write head moved back",
                reader=name,
                served_by=served_by,
                journal=journal,
                seen=last,
                now=head,
            )
        if head < acked:
            self.behind_acks += 1
            self.record.anomaly(
                "write head behind an acknowledged append",
                reader=name,
                served_by=served_by,
                journal=journal,
                acked=acked,
                head=head,
            )
        self.last[key] = max(last, head)
