"""The minimum append rate polices the client, not the broker: time a primary spends
spooling a chunk (a busy event loop, a slow disk or peer) is not charged to the client.

Under load (thousands of journals' first appends), a primary slow to spool a chunk used to
abort appends whose clients had sent everything at once with "client stream didn't sustain
the minimum append data rate" — some of the failed first appends at scale (issue 21).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pygazette.broker.replicated_spool import ReplicatedSpool
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import append, journal_spec
from tests.broker.test_append_fsm import InProcessCluster
from tests.support.etcd_process import EtcdProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

JOURNAL = "flow/journal"


@pytest.fixture
async def cluster(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> AsyncIterator[InProcessCluster]:
    c = InProcessCluster(tmp_path, etcd, etcd_root)
    try:
        for i in range(2):
            await c.start(i)
        spec = journal_spec(JOURNAL, replication=2)
        req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)])
        assert (await c.stub(0).Apply(req)).status == pb.OK
        yield c
    finally:
        await c.close()


async def test_a_slow_primary_does_not_fail_a_prompt_client(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    deadline = time.monotonic() + 30
    while (resp := await append(cluster.stub(0), JOURNAL, b"ready\n")).status != pb.OK:
        assert time.monotonic() < deadline, pb.Status.Name(resp.status)
        await asyncio.sleep(0.1)

    # The primary now takes 1.5 s to spool each chunk: longer than the policer's slack
    # (1 s at the minimum rate) between the client's chunks.
    real = ReplicatedSpool.apply_content
    slowed = 0

    async def slow_apply(self: ReplicatedSpool, content: bytes, delta: int) -> None:
        nonlocal slowed
        if content and self.journal == JOURNAL:
            slowed += 1
            await asyncio.sleep(1.5)
        await real(self, content, delta)

    monkeypatch.setattr(ReplicatedSpool, "apply_content", slow_apply)
    resp = await append(cluster.stub(0), JOURNAL, b"one\n", b"two\n", b"three\n")
    assert resp.status == pb.OK
    assert resp.commit.end - resp.commit.begin == len(b"one\ntwo\nthree\n")
    assert slowed >= 3
