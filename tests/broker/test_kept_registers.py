"""A journal's registers survive its brokers' restarts once its spools are all persisted.

Registers live in a journal's spools (`fragment/spool.py`); a journal whose last spool was
persisted and removed kept them nowhere, so after every broker of its route restarted it had
none, and any `check_registers` passed: the fences built on them (a recovery log's author
register, the Spark sink's labels) were gone. They are kept on disk now
(`fragment/kept_registers.py`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pygazette.broker.replica import spool_directory
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

JOURNAL = "regs/kept"
OWNER = pb.LabelSet(labels=[pb.Label(name="owner", value="writer-1")])


def _selector(value: str) -> pb.LabelSelector:
    return pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="owner", value=value)]))


async def _append(
    stub: pb_grpc.JournalStub, data: bytes, **first: object
) -> pb.AppendResponse:
    async def requests() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=JOURNAL, **first)  # type: ignore[arg-type]
        if data:
            yield pb.AppendRequest(content=data)
        yield pb.AppendRequest()

    resp: pb.AppendResponse = await stub.Append(requests(), timeout=20)
    return resp


async def _until_ok(stub: pb_grpc.JournalStub, data: bytes, **first: object) -> pb.AppendResponse:
    """Retried while the journal's route settles (brokers just started)."""
    for _ in range(200):
        resp = await _append(stub, data, **first)
        if resp.status not in (pb.NO_JOURNAL_PRIMARY_BROKER, pb.INSUFFICIENT_JOURNAL_BROKERS):
            return resp
        await asyncio.sleep(0.1)
    raise AssertionError(f"the journal never took an append: {resp}")


async def test_registers_survive_every_broker_restarting_after_their_spools_persisted(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    cluster = Cluster(tmp_path, etcd, f"/kept-{uuid.uuid4().hex[:8]}/gazette/cluster")
    a, b = cluster.add("zone-a", "broker-a"), cluster.add("zone-b", "broker-b")
    try:
        await cluster.start()
        spec = journal_spec(JOURNAL, replication=2)
        assert (await apply_specs(cluster.stub(a), spec)).status == pb.OK
        await cluster.wait_ready([JOURNAL], 2)
        stub = cluster.stub(a)
        resp = await _until_ok(stub, b"r" * 2047 + b"\n", union_registers=OWNER)
        assert resp.status == pb.OK, resp
        assert resp.registers == OWNER

        # The whole cluster shuts down (SIGTERM: each broker persists its spools as it
        # drains), then comes back.
        await asyncio.gather(*(asyncio.to_thread(broker.stop, 60.0) for broker in (a, b)))
        for broker in (a, b):
            left = list(spool_directory(broker.data_dir / "spools", JOURNAL).glob("*.log"))
            assert not left, (left, cluster.log_tail())
        for broker in (a, b):
            await asyncio.to_thread(broker.start, 60.0)
        await cluster.wait_ready([JOURNAL], 2)

        stub = cluster.stub(b)
        # Another writer's check fails: the register is there (with none, it would pass).
        refused = await _until_ok(stub, b"x\n", check_registers=_selector("writer-2"))
        assert refused.status == pb.REGISTER_MISMATCH, refused
        assert refused.registers == OWNER
        taken = await _until_ok(stub, b"y\n", check_registers=_selector("writer-1"))
        assert taken.status == pb.OK, taken
        assert taken.commit.begin == 2048
    finally:
        await cluster.close()
