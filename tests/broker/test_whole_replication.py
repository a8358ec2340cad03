"""Appends to a journal with no pipeline open, replicated whole (`whole_replication`).

Two in-process brokers on a real etcd, a journal at replication 2. Its pulse opens a
pipeline; closing it as idle (`pulser.PIPELINE_IDLE_SECONDS`) leaves the journal as an idle
journal is, and its next append goes to the peer as one `ReplicateWhole` call. Each test
checks what readers of both brokers see: every acknowledged append once, where its commit
says, and the same bytes on both.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.broker import append_fsm, pulser
from pygazette.broker.allocation import assignments_advertise, route_of
from pygazette.broker.peers import Peers
from pygazette.broker.replica import Replica
from pygazette.broker.server import Broker
from pygazette.broker.whole_replication import (
    WholeInDoubt,
    WholeRefused,
    WholeUnserved,
    replicate_whole,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import append, apply_specs, journal_spec
from tests.broker.test_append_fsm import JOURNAL, InProcessCluster
from tests.support.cluster import read_range
from tests.support.etcd_process import EtcdProcess


@pytest.fixture
async def cluster(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> AsyncIterator[InProcessCluster]:
    c = InProcessCluster(tmp_path, etcd, etcd_root)
    try:
        for i in range(2):
            await c.start(i)
        yield c
    finally:
        await c.close()


def _replicas(cluster: InProcessCluster) -> list[Replica]:
    return [b.resolver.replicas[JOURNAL] for b in cluster.brokers.values()]


async def _idle_journal(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch, flush_interval: int = 0
) -> None:
    """The journal, pulsed and served by both brokers, with its pipeline closed."""
    spec = journal_spec(JOURNAL, replication=2)
    spec.fragment.flush_interval.seconds = flush_interval
    assert (await apply_specs(cluster.stub(0), spec)).status == pb.OK
    deadline = time.monotonic() + 60
    while not all(_settled(b) for b in cluster.brokers.values()):
        assert time.monotonic() < deadline, "the journal's route was never advertised"
        await asyncio.sleep(0.05)
    await _close_pipelines(cluster, monkeypatch)


async def _written_then_quiet(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch, data: bytes
) -> pb.AppendResponse:
    """The journal written once (`data`), its pipeline closed, and the moment after a whole
    append over: its next append replicates whole."""
    await _idle_journal(cluster, monkeypatch)
    first = await append(cluster.stub(0), JOURNAL, data)
    assert first.status == pb.OK
    await _close_pipelines(cluster, monkeypatch)
    for r in _replicas(cluster):
        r.replicated_whole_at = float("-inf")
    return first


def _settled(broker: Broker) -> bool:
    """The broker serves the journal, and sees its route advertised by every assignment
    (its pulses are done: a pulse opens a pipeline)."""
    member = broker.member
    replica = broker.resolver.replicas.get(JOURNAL)
    if member is None or replica is None or replica.rspool is None:
        return False
    group = member.observed.current.assignments_of(JOURNAL)
    return bool(group) and len(group) == 2 and assignments_advertise(route_of(group), group)


async def _close_pipelines(cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pulser, "PIPELINE_IDLE_SECONDS", 0.0)
    for b in cluster.brokers.values():
        assert b.member is not None
        await b.member.pulser.sweep()
    assert not any(r.replication for r in _replicas(cluster))
    monkeypatch.undo()


async def _both_read(cluster: InProcessCluster) -> bytes:
    """The journal as each broker serves it (they must agree)."""
    reads = [await read_range(cluster.stub(i), JOURNAL) for i in cluster.brokers]
    assert all(r == reads[0] for r in reads), reads
    content, head = reads[0]
    assert head == len(content)
    return content


class Calls:
    """Counts `replicate_whole` calls; `then` runs after each (the real call) returns."""

    def __init__(self, then: type[Exception] | None = None, before: bool = False) -> None:
        self.count = 0
        self.then = then
        self.before = before

    async def __call__(
        self, peers: Peers, endpoint: str, journal: str, requests: Sequence[pb.ReplicateRequest]
    ) -> list[pb.ReplicateResponse]:
        self.count += 1
        if self.then is not None and self.before:
            raise self.then("injected before the call")
        answers = await replicate_whole(peers, endpoint, journal, requests)
        if self.then is not None:
            raise self.then("injected after the call")
        return answers


async def test_appends_to_an_idle_journal_replicate_whole_and_agree(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _idle_journal(cluster, monkeypatch)
    calls = Calls()
    monkeypatch.setattr(append_fsm, "replicate_whole", calls)
    acked: list[tuple[bytes, pb.AppendResponse]] = []
    for i in range(3):
        data = f"whole-{i}\n".encode()
        resp = await append(cluster.stub(i % 2), JOURNAL, data)
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        acked.append((data, resp))
        assert not any(r.replication for r in _replicas(cluster))  # No pipeline opened.
        # Appended to a moment ago, it would open a pipeline next: let that moment pass.
        for r in _replicas(cluster):
            r.replicated_whole_at = float("-inf")
    assert calls.count == 3
    # Then appends that follow one another at once go through a pipeline, after them.
    for i in range(2):
        data = f"piped-{i}\n".encode()
        resp = await append(cluster.stub(0), JOURNAL, data)
        assert resp.status == pb.OK
        acked.append((data, resp))
    assert calls.count == 4  # The first of them only.
    assert any(r.replication for r in _replicas(cluster))
    content = await _both_read(cluster)
    assert content == b"".join(d for d, _ in acked)
    for data, resp in acked:
        assert content[resp.commit.begin : resp.commit.end] == data
    # Each broker's frontier covers every acknowledged append (confirmed on both).
    for r in _replicas(cluster):
        assert r.rspool is not None and r.rspool.confirmed == len(content)


async def test_a_refused_whole_replication_appends_through_a_pipeline_instead(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await _written_then_quiet(cluster, monkeypatch, b"before\n")
    calls = Calls(WholeRefused, before=True)
    monkeypatch.setattr(append_fsm, "replicate_whole", calls)
    resp = await append(cluster.stub(1), JOURNAL, b"refused, then piped\n")
    assert resp.status == pb.OK, pb.Status.Name(resp.status)
    assert calls.count == 1
    assert resp.commit.begin == first.commit.end  # The cut local commit left no gap.
    assert any(r.replication for r in _replicas(cluster))
    assert await _both_read(cluster) == b"before\nrefused, then piped\n"


async def test_a_peer_without_whole_replication_gets_pipelines(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _idle_journal(cluster, monkeypatch)
    for r in _replicas(cluster):
        r.replicated_whole_at = float("-inf")
    calls = Calls(WholeUnserved, before=True)
    monkeypatch.setattr(append_fsm, "replicate_whole", calls)
    resp = await append(cluster.stub(0), JOURNAL, b"streamed\n")
    assert resp.status == pb.OK, pb.Status.Name(resp.status)
    assert calls.count == 1
    assert any(r.replication for r in _replicas(cluster))
    primary = next(b for b in cluster.brokers.values() if b.resolver.replicas[JOURNAL].primary)
    assert primary.member is not None
    assert primary.member.appends._replicates_streaming_only  # Asked again only later.
    # Its pipeline closed, the journal's next append is not replicated whole either.
    await _close_pipelines(cluster, monkeypatch)
    monkeypatch.setattr(append_fsm, "replicate_whole", calls)
    resp = await append(cluster.stub(0), JOURNAL, b"again\n")
    assert resp.status == pb.OK, pb.Status.Name(resp.status)
    assert calls.count == 1
    assert await _both_read(cluster) == b"streamed\nagain\n"


async def test_a_broker_without_the_method_is_unserved_not_in_doubt() -> None:
    """A Gazette broker (here, a gRPC server without the PeerJournal service) answers
    UNIMPLEMENTED: nothing was applied."""
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    peers = Peers()
    try:
        req = pb.ReplicateRequest(proposal=pb.Fragment(journal=JOURNAL))
        with pytest.raises(WholeUnserved):
            await replicate_whole(peers, f"http://127.0.0.1:{port}", JOURNAL, [req])
    finally:
        await peers.close()
        await server.stop(None)


async def test_an_append_whose_whole_replication_is_in_doubt_is_never_written_over(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await _written_then_quiet(cluster, monkeypatch, b"first\n")
    # The peer commits (and confirms) the append; its answer is lost on the way back.
    monkeypatch.setattr(append_fsm, "replicate_whole", Calls(WholeInDoubt))
    primary = next(i for i, b in cluster.brokers.items() if b.resolver.replicas[JOURNAL].primary)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await append(cluster.stub(primary), JOURNAL, b"doubtful\n")
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    monkeypatch.setattr(append_fsm, "replicate_whole", replicate_whole)
    after = await append(cluster.stub(primary), JOURNAL, b"after\n")
    assert after.status == pb.OK, pb.Status.Name(after.status)
    # The journal went on past the append in doubt (the peer holds it confirmed), which
    # both brokers serve, once.
    assert after.commit.begin == first.commit.end + len(b"doubtful\n")
    assert await _both_read(cluster) == b"first\ndoubtful\nafter\n"


async def test_a_journal_whose_whole_append_is_in_doubt_is_watched_by_the_pulser(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a journal whose pipeline broke with a commit in doubt: the pulser watches it, so
    its flush interval rolls the spool (through a pipeline, which confirms the content in
    doubt everywhere) without waiting for another append. Before, only an append replicated
    whole that succeeded told the pulser: one left in doubt was never flushed, and the
    primary never showed readers what its peer served, until the journal's next append."""
    await _idle_journal(cluster, monkeypatch, flush_interval=60)
    primary = next(b for b in cluster.brokers.values() if b.resolver.replicas[JOURNAL].primary)
    assert primary.member is not None
    pulses = primary.member.pulser
    await pulses.sweep()  # Its pipeline closed and its spool empty: not watched any more.
    assert JOURNAL not in pulses.active
    for r in _replicas(cluster):
        r.replicated_whole_at = float("-inf")
    # The peer commits (and confirms) the append; its answer is lost on the way back.
    monkeypatch.setattr(append_fsm, "replicate_whole", Calls(WholeInDoubt))
    stub = next(i for i, b in cluster.brokers.items() if b is primary)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await append(cluster.stub(stub), JOURNAL, b"doubtful\n")
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    monkeypatch.setattr(append_fsm, "replicate_whole", replicate_whole)
    assert JOURNAL in pulses.active
    replica = primary.resolver.replicas[JOURNAL]
    rs, spool = replica.rspool, replica.spool
    assert rs is not None and spool is not None and spool.first_append_time is not None
    spool.first_append_time -= 60  # Its flush interval has passed.
    # A sweep pulses it: the pipeline's roll confirms the content in doubt.
    deadline = time.monotonic() + 30
    while rs.confirmed != len(b"doubtful\n"):
        assert time.monotonic() < deadline, (rs.confirmed, rs.end, rs.in_doubt)
        await pulses.sweep()
        await asyncio.sleep(0.2)
    assert await _both_read(cluster) == b"doubtful\n"


async def test_an_append_failing_its_preconditions_is_checked_again_through_a_pipeline(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked against the primary's spool alone, a failure might be stale (a peer ahead of
    it): the answer comes from a pipeline, which hears from the peer first."""
    first = await _written_then_quiet(cluster, monkeypatch, b"first\n")
    calls = Calls()
    monkeypatch.setattr(append_fsm, "replicate_whole", calls)
    resp = await append(cluster.stub(0), JOURNAL, b"x\n", offset=first.commit.end + 1)
    assert resp.status == pb.WRONG_APPEND_OFFSET
    assert calls.count == 0
    assert any(r.replication for r in _replicas(cluster))  # Answered through a pipeline.
    assert await _both_read(cluster) == b"first\n"


async def test_whole_replication_is_signed_and_authorized(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `--auth-keys`, the primary signs its ReplicateWhole call for the one journal
    (REPLICATE), and the peer takes it."""
    keys = base64.b64encode(b"whole-auth-key".ljust(32, b"w")).decode()

    cluster = InProcessCluster(tmp_path, etcd, etcd_root, auth_keys=keys)
    try:
        for i in range(2):
            await cluster.start(i)
        await _idle_journal(cluster, monkeypatch)
        calls = Calls()
        monkeypatch.setattr(append_fsm, "replicate_whole", calls)
        resp = await append(cluster.stub(0), JOURNAL, b"signed\n")
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        assert calls.count == 1
        assert not any(r.replication for r in _replicas(cluster))  # Not a pipeline's.
        assert await _both_read(cluster) == b"signed\n"
    finally:
        await cluster.close()


async def test_total_chunks_count_the_commit_chunk_as_gazettes_do(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AppendResponse.total_chunks counts every chunk the append read, its closing empty one
    included (Gazette's appendFlowControl counts each chunk it receives), on either way a
    cluster append goes: replicated whole, or through a pipeline."""
    await _idle_journal(cluster, monkeypatch)
    calls = Calls()
    monkeypatch.setattr(append_fsm, "replicate_whole", calls)
    whole = await append(cluster.stub(0), JOURNAL, b"one ", b"two\n")
    assert calls.count == 1  # Replicated whole.
    piped = await append(cluster.stub(0), JOURNAL, b"three ", b"four\n")
    assert calls.count == 1 and any(r.replication for r in _replicas(cluster))
    empty = await append(cluster.stub(0), JOURNAL)
    assert [r.status for r in (whole, piped, empty)] == [pb.OK] * 3
    assert [r.total_chunks for r in (whole, piped, empty)] == [3, 3, 1]
