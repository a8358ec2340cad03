"""Shared fixtures: a real broker subprocess per test that asks for one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker_process import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "broker-data")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()
