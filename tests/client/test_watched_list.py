"""WatchedList against a real broker: stopping it."""

from __future__ import annotations

import asyncio

import pytest

from pygazette.client import JournalClient, WatchedList
from tests.support.broker_process import BrokerProcess


async def test_stop_keeps_its_callers_cancellation(broker: BrokerProcess) -> None:
    # A task cancelled while stopping a WatchedList stays cancelled: stop() swallowed every
    # CancelledError of its wait for the watch task, its caller's own included, and the
    # caller (a consumer shutting down, a timeout) went on as if never cancelled.
    async with JournalClient(broker.url) as client:
        watched = WatchedList(client)
        await watched.start()
        stopper = asyncio.create_task(watched.stop())
        await asyncio.sleep(0)  # The stopper cancelled the watch and waits for it.
        stopper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopper
        await watched.stop()  # Stopped already: nothing left to wait for.
