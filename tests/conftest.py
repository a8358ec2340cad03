"""Shared fixtures: a real broker subprocess per test that asks for one, and a local S3
server (`moto_server`) for the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker_process import BrokerProcess
from tests.support.s3_server import S3Server, export_credentials, restore_environment


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "broker-data")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A local S3-compatible server for the session; tests make their own buckets."""
    server = S3Server(tmp_path_factory.mktemp("s3"))
    saved = export_credentials()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        restore_environment(saved)
