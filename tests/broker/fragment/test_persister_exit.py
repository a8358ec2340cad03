"""A broker exiting persists spools its journal's store refuses (permission denied, no such
bucket) to the journal's next store, as Gazette's broker does (Persist with isExiting), rather
than leave them on its own disk; while it runs, it waits for the first store instead."""

from __future__ import annotations

import asyncio
import errno
import pathlib
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from pygazette.broker.server import Broker, BrokerConfig
from pygazette.protocol.fragment_name import parse_fragment_path
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.stores.file_store import FileStore
from pygazette.stores.store import StoreAuthError
from pygazette.stores.store_url import parse_store_url
from tests.broker.rpc_helpers import append, apply_specs, journal_spec

JOURNAL = "exit/fallback"
DENIED, FALLBACK = "file:///denied/", "file:///fallback/"


def _deny_writes_under(denied: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Directories under `denied` cannot be made, as for a broker without permission to
    write there (tests run as root, whom the file system never refuses)."""
    mkdir = pathlib.Path.mkdir

    def refusing(self: Path, *args: Any, **kwargs: Any) -> None:
        if self == denied or denied in self.parents:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", refusing)


async def test_a_file_store_without_permission_is_an_auth_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    (root / "denied").mkdir(parents=True)  # The store's directory exists; below it, refused.
    _deny_writes_under(root / "denied", monkeypatch)
    src = tmp_path / "src"
    src.write_bytes(b"content")
    with pytest.raises(StoreAuthError, match="Permission denied"):
        await FileStore(parse_store_url(DENIED), root).put_file("j/f.raw", src)


async def test_an_exiting_broker_persists_what_its_store_refuses_to_the_next_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data", port=0, retention_interval=0))
    await broker.start()
    fallback = broker.file_root / "fallback"
    for store in (broker.file_root / "denied", fallback):
        store.mkdir()  # Both stores' directories exist (Gazette's file store requires it).
    _deny_writes_under(broker.file_root / "denied", monkeypatch)
    stopped = False
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            spec = journal_spec(JOURNAL, length=1024, stores=[DENIED, FALLBACK])
            assert (await apply_specs(stub, spec)).status == pb.OK
            for data in (b"a" * 1500, b"b" * 1500):  # The second append rolls the first.
                assert (await append(stub, JOURNAL, data)).status == pb.OK
        persister = broker.persister
        deadline = time.monotonic() + 10
        while DENIED not in persister._last_error:  # A persist of the first spool was refused.
            assert time.monotonic() < deadline, "no persist was attempted"
            await asyncio.sleep(0.01)
        assert "Permission denied" in persister._last_error[DENIED]
        assert not (fallback / JOURNAL).exists()  # Running, it waits for its first store.

        stopped = True
        await broker.stop(grace=10.0)
        files = sorted(p for p in (fallback / JOURNAL).rglob("*") if p.is_file())
        frags = [parse_fragment_path(JOURNAL, p.name) for p in files]
        assert [(f.begin, f.end) for f in frags] == [(0, 1500), (1500, 3000)]
        assert b"".join(p.read_bytes() for p in files) == b"a" * 1500 + b"b" * 1500
        assert not list((tmp_path / "data").rglob("*.spool"))  # Nothing left behind.
    finally:
        if not stopped:
            await broker.stop(grace=1.0)
