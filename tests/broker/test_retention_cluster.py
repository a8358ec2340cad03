"""The retention loop in a cluster: a journal's primary prunes it; its other replicas leave it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.retention_bytes import RETENTION_BYTES_LABEL
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, append_once
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

SIZE = 1025  # Each append overfills a 1 KiB fragment, which rolls and persists.
APPENDS = 6


def _stored(root: Path, name: str) -> list[str]:
    where = root / name
    if not where.is_dir():
        return []
    return sorted(p.name for p in where.iterdir() if not p.name.startswith("."))


async def test_only_the_primary_prunes(tmp_path: Path, etcd: EtcdProcess, etcd_root: str) -> None:
    cluster = Cluster(tmp_path, etcd, etcd_root, broker_args=["--retention-interval", "1s"])
    b1, b2 = cluster.add("zone-a", "broker-1"), cluster.add("zone-b", "broker-2")
    try:
        await cluster.start()
        name = "retained/j"
        spec = journal_spec(
            name, replication=2, length=1024, labels={RETENTION_BYTES_LABEL: "2050"}
        )
        assert (await apply_specs(cluster.stub(b1), spec)).status == pb.OK
        await cluster.wait_ready([name], 2)
        for i in range(APPENDS):
            resp = await append_once(cluster.stub(b1), name, bytes([65 + i]) * SIZE)
            assert resp.status == pb.OK, resp
        # The last append stays in the spool (it rolls at the next append); the bound keeps
        # the last two of the five persisted. Passes run on both brokers every second.
        persisted = APPENDS - 1
        end = f"-{persisted * SIZE:016x}-"
        deadline = time.monotonic() + 30
        while len(files := _stored(cluster.file_root, name)) != 2 or end not in files[-1]:
            assert time.monotonic() < deadline, files
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.5)  # Two more passes of each broker's loop: nothing left to do.
        primary = cluster.primary_of(name)
        assert primary is not None
        other = b2 if primary is b1 else b1
        assert (
            primary.log_path.read_text(errors="replace").count("pruned fragment") == persisted - 2
        )
        assert "pruned fragment" not in other.log_path.read_text(errors="replace")
    finally:
        await cluster.close()
