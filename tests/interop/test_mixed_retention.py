"""Retention in a cluster of Gazette and pygazette brokers (one etcd, one file store).

Gazette's brokers never prune: a journal whose primary is a Gazette broker is pruned by its
pygazette replica, whereas a pygazette primary prunes its journals itself.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from pygazette.client import JournalClient, append, apply_journals
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.retention_bytes import RETENTION_BYTES_LABEL
from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import EtcdServer, GazetteBinaries, GazetteBroker

pytestmark = pytest.mark.slow

JOURNALS = 6
SIZE = 1025  # Each append overfills a 1 KiB fragment, which rolls and persists.
APPENDS = 6
WAIT_SECONDS = 60.0


def _spec(name: str) -> pb.JournalSpec:
    spec = pb.JournalSpec(name=name, replication=2)
    spec.labels.labels.add(name=RETENTION_BYTES_LABEL, value="2050")
    spec.fragment.length = 1024
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 1
    return spec


def _stored(root: Path, name: str) -> list[str]:
    where = root / name
    if not where.is_dir():
        return []
    return sorted(p.name for p in where.iterdir() if not p.name.startswith("."))


async def test_a_journal_whose_primary_is_a_gazette_broker_is_pruned(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    prefix = f"/gazette/mixed-{uuid.uuid4().hex[:8]}"
    gazette = GazetteBroker(
        binaries.gazette,
        etcd,
        tmp_path / "gazette",
        file_root=store,
        prefix=prefix,
        broker_id="gazette-0",
    )
    (tmp_path / "pygazette").mkdir()
    pygazette = BrokerProcess(
        tmp_path / "pygazette" / "data",
        extra_args=[
            "--etcd",
            etcd.url,
            "--etcd-prefix",
            prefix,
            "--zone",
            "local",
            "--id",
            "pygazette-0",
            "--file-root",
            str(store),
            "--retention-interval",
            "1s",
        ],
    )
    gazette.start()
    try:
        pygazette.start()
        try:
            async with JournalClient(pygazette.url) as client:
                names = [f"mixed/j{i}" for i in range(JOURNALS)]
                changes = [pb.ApplyRequest.Change(upsert=_spec(n)) for n in names]
                await apply_journals(client, changes)
                # Both brokers hold each journal; which one is primary is the allocator's.
                primaries: dict[str, str] = {}
                deadline = time.monotonic() + WAIT_SECONDS
                while len(primaries) < JOURNALS:
                    assert time.monotonic() < deadline, primaries
                    primaries = {
                        j.spec.name: j.route.members[j.route.primary].suffix
                        async for r in client.rpc_list(pb.ListRequest())
                        for j in r.journals
                        if len(j.route.members) == 2 and j.route.primary >= 0
                    }
                    await asyncio.sleep(0.1)
                by_gazette = sorted(n for n, p in primaries.items() if p == "gazette-0")
                if not by_gazette:
                    pytest.skip(f"the allocator made no Gazette broker primary: {primaries}")
                for name in by_gazette:
                    for i in range(APPENDS):
                        await append(client, name, bytes([65 + i]) * SIZE)
                # The last append stays in the spool; the bound keeps the last two persisted.
                end = f"-{(APPENDS - 1) * SIZE:016x}-"
                deadline = time.monotonic() + WAIT_SECONDS
                for name in by_gazette:
                    while len(files := _stored(store, name)) != 2 or end not in files[-1]:
                        assert time.monotonic() < deadline, (name, files)
                        await asyncio.sleep(0.1)
        finally:
            pygazette.kill()
    finally:
        gazette.kill()
