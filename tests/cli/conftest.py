"""Fixtures of the CLI tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker_process import BrokerProcess
from tests.support.etcd_process import EtcdProcess


@pytest.fixture
def etcd_broker(tmp_path: Path, etcd: EtcdProcess, etcd_root: str) -> Iterator[BrokerProcess]:
    """A broker on a real etcd (cluster mode, of one)."""
    proc = BrokerProcess(
        tmp_path / "broker-data", extra_args=[*etcd.client_flags, "--etcd-prefix", etcd_root]
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
