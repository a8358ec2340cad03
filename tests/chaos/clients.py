"""The chaos driver's broker clients: a JournalClient that reconnects after a stall.

A client reaches the brokers through the balancer, on one long-lived connection. If the
broker behind it is frozen (SIGSTOP), calls stall until their deadline while the connection
stays up; `reconnect()` then opens a new one, which the balancer sends elsewhere, as a
real client would after a deadline.
"""

from __future__ import annotations

import contextlib

import grpc
import grpc.aio

from pygazette.client.journal_client import JournalClient


class Reconnecting:
    def __init__(self, address: str) -> None:
        self.address = address
        self.client = JournalClient(address)

    async def reconnect(self) -> None:
        old, self.client = self.client, JournalClient(self.address)
        with contextlib.suppress(Exception):
            await old.close()

    async def on_error(self, exc: BaseException) -> None:
        """Reconnect if `exc` looks like a stalled or lost connection."""
        stalled = isinstance(exc, TimeoutError) or (
            isinstance(exc, grpc.aio.AioRpcError)
            and exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
        )
        if stalled:
            await self.reconnect()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close()
