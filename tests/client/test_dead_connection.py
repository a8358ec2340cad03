"""A client notices a broker connection that died silently (a frozen broker, a connection
lost in the network: nothing comes back, no reset) within its keepalive timeout."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from pygazette.client import Appender, JournalClient, Reader
from pygazette.client.channel import KEEPALIVE_TIMEOUT_MS
from tests.client.test_integration import J, create, journal_spec
from tests.support.broker_process import BrokerProcess


async def _fails_unavailable(what: asyncio.Future[object]) -> float:
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await what
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value
    return time.monotonic() - started


async def test_a_frozen_broker_fails_a_blocking_read_and_an_append_within_the_keepalive_timeout(
    broker: BrokerProcess,
) -> None:
    """A broker SIGSTOPped while a blocking read and an append are in flight: both fail
    UNAVAILABLE once a keepalive ping goes unanswered for KEEPALIVE_TIMEOUT_MS (20 s). grpc
    1.85's core times a ping's acknowledgement out by grpc.http2.ping_timeout_ms (one minute
    by default), not by keepalive_timeout_ms, which was all the channel set: both hung 60 s.
    (Pings every second here; the default interval is the 5 minutes servers accept.)"""
    async with JournalClient(broker.url, keepalive_time_ms=1000) as client:
        await create(client, journal_spec())
        async with Appender(client, J) as first:
            await first.write(b"one\n")
        reader = Reader(client, J, block=True)
        assert await reader.read(100) == b"one\n"

        async def append() -> None:
            async with Appender(client, J) as appender:
                await appender.write(b"two\n")

        broker.freeze()
        try:
            read = asyncio.ensure_future(reader.read(100))
            appended = asyncio.ensure_future(append())
            async with asyncio.timeout(KEEPALIVE_TIMEOUT_MS / 1000 + 15):
                waited = await asyncio.gather(
                    _fails_unavailable(read), _fails_unavailable(appended)
                )
        finally:
            broker.thaw()
        assert max(waited) < KEEPALIVE_TIMEOUT_MS / 1000 + 10, waited
