"""Fixtures of the client tests: a scripted fake broker and async clients of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from pygazette.client import JournalClient
from tests.client.fake_broker import FakeBroker, fake_broker


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    yield from fake_broker()


@pytest.fixture
async def fake_client(fake: FakeBroker) -> AsyncIterator[JournalClient]:
    async with JournalClient(fake.address) as client:
        yield client
