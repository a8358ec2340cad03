"""Fixtures of the broker tests: a framed-snappy reader built from Gazette's snappy library,
and a persister over a file store under the test's temp directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pygazette.broker.fragment.persister import Persister
from pygazette.stores.store import StoreRegistry
from tests.broker.fragment_helpers import build_snappycat


@pytest.fixture(scope="session")
def snappycat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = build_snappycat(tmp_path_factory.mktemp("snappycat"))
    if exe is None:
        pytest.skip("Go and the golang/snappy module are needed for the framed-snappy reader")
    return exe


@pytest.fixture
async def persister(tmp_path: Path) -> AsyncIterator[Persister]:
    (tmp_path / "store").mkdir(exist_ok=True)  # A file store's directory must exist.
    p = Persister(StoreRegistry(tmp_path / "store"), tmp_path / "scratch")
    p.start()
    yield p
    await p.stop()
