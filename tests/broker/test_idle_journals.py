"""An idle journal costs a broker a little memory and nothing else: no task, timer or
replication stream of its own (DESIGN: "cost grows with what changes").

Two brokers run in this process on a real etcd, so the test can count their asyncio tasks
and look at their replicas. Many journals are applied, assigned and pulsed (their routes
advertised); the brokers' tasks then don't grow with the journals. Appends open pipelines
(Replicate streams, with their tasks on both brokers); once idle, the pulser closes them.
A spool left with content from an earlier flush interval rolls without another append.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc.aio
import pytest

from pygazette.broker import append_fsm, pulser
from pygazette.broker.allocation import assignments_advertise, route_of
from pygazette.broker.server import Broker, BrokerConfig
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import append, apply_specs, journal_spec
from tests.broker.test_append_fsm import InProcessCluster
from tests.support.etcd_process import EtcdProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

JOURNALS = 400


async def wait_for(condition: Callable[[], bool], what: str, within: float) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


def tasks_of_journals() -> list[str]:
    """Running tasks named for a journal ("idle/…"), and the pipelines' and streams'."""
    return [
        t.get_name()
        for t in asyncio.all_tasks()
        if "idle/" in t.get_name() or t.get_name().startswith("replicate-")
    ]


def advertised(broker: Broker) -> int:
    """Journals whose assignments all advertise their route, as this broker sees them."""
    member = broker.member
    assert member is not None
    state = member.observed.current
    done = 0
    for name in broker.resolver.replicas:
        group = state.assignments_of(name)
        if group and assignments_advertise(route_of(group), group):
            done += 1
    return done


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


async def test_idle_journals_hold_no_tasks_or_streams(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = len(asyncio.all_tasks())
    names = [f"idle/j-{i:05d}" for i in range(JOURNALS)]
    for start in range(0, JOURNALS, 100):
        req = pb.ApplyRequest(
            changes=[
                pb.ApplyRequest.Change(upsert=journal_spec(n, replication=2))
                for n in names[start : start + 100]
            ]
        )
        assert (await cluster.stub(0).Apply(req)).status == pb.OK
    brokers = list(cluster.brokers.values())
    await wait_for(
        lambda: all(len(b.resolver.replicas) == JOURNALS for b in brokers),
        "every journal to have a replica on both brokers",
        120,
    )
    await wait_for(
        lambda: all(advertised(b) == JOURNALS for b in brokers),
        "every journal's route to be advertised (pulsed)",
        180,
    )
    # Their routes were written many journals a transaction (`advertiser`), not one each
    # (a transaction each would be at least JOURNALS; typically ~60 here).
    advertisers = [b.member.appends.advertiser for b in brokers if b.member is not None]
    txns = sum(a.transactions for a in advertisers)
    assert txns <= JOURNALS // 2, [(a.advertisements, a.transactions) for a in advertisers]
    # What each journal costs in tasks: nothing. (Pipelines the pulses opened are still
    # open: count them apart, then let them go idle.)
    per_journal = [n for n in tasks_of_journals() if not n.startswith("replicate-")]
    assert per_journal == []

    monkeypatch.setattr(pulser, "PIPELINE_IDLE_SECONDS", 0.5)
    for b in brokers:
        assert b.member is not None
        await b.member.pulser.sweep()
    await wait_for(
        lambda: not any(r.replication for b in brokers for r in b.resolver.replicas.values()),
        "idle pipelines to close",
        30,
    )
    await wait_for(lambda: tasks_of_journals() == [], "replication tasks to end", 30)
    # Sweeps walk only journals with traffic: with every pipeline closed, none. And after
    # its first listing of the spool root, the orphan sweep looks at no served journal.
    for b in brokers:
        assert b.member is not None
        await b.member.pulser.sweep()
        assert b.member.pulser.active == frozenset()
        b.member.sweep_orphans_once()
        assert b.member.orphan_candidates == frozenset()
    idle_tasks = len(asyncio.all_tasks())
    assert idle_tasks - baseline < 60, sorted(t.get_name() for t in asyncio.all_tasks())

    # An append to a journal without a pipeline is replicated whole, in one call to its
    # peer (`whole_replication`): no pipeline, stream or task stays behind it...
    written = names[:20]
    for name in written:
        resp = await append(cluster.stub(0), name, b"hello\n")
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
    assert not any(r.replication for b in brokers for r in b.resolver.replicas.values())
    assert tasks_of_journals() == []
    active = [n for b in brokers if b.member is not None for n in b.member.pulser.active]
    assert sorted(active) == sorted(written)
    for b in brokers:
        assert b.member is not None
        await b.member.pulser.sweep()
        assert b.member.pulser.active == frozenset()

    # ...while appends that follow one another open pipelines (and streams on the peer)...
    monkeypatch.setattr(append_fsm, "WHOLE_QUIET_SECONDS", 3600.0)
    for name in written:
        resp = await append(cluster.stub(0), name, b"hello\n")
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
    open_pipelines = [
        r.name for b in brokers for r in b.resolver.replicas.values() if r.replication
    ]
    assert sorted(open_pipelines) == sorted(written)
    assert tasks_of_journals() != []
    active = [n for b in brokers if b.member is not None for n in b.member.pulser.active]
    assert sorted(active) == sorted(written)
    # ...which close once idle, taking their tasks with them.
    for b in brokers:
        assert b.member is not None
        await b.member.pulser.sweep()
    await wait_for(
        lambda: not any(r.replication for b in brokers for r in b.resolver.replicas.values()),
        "the written journals' pipelines to close",
        30,
    )
    await wait_for(lambda: tasks_of_journals() == [], "replication tasks to end", 30)
    for b in brokers:
        assert b.member is not None
        await b.member.pulser.sweep()
        assert b.member.pulser.active == frozenset()

    # An append works again after its pipeline closed.
    resp = await append(cluster.stub(1), written[0], b"again\n")
    assert resp.status == pb.OK
    assert resp.commit.begin == 2 * len(b"hello\n")


async def test_a_spool_rolls_at_its_flush_interval_without_another_append(
    cluster: InProcessCluster,
) -> None:
    spec = journal_spec("idle/flushed", replication=2)
    spec.fragment.flush_interval.seconds = 60
    assert (
        await cluster.stub(0).Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
    ).status == pb.OK
    # Two appends: the journal's first write rolls at once (Gazette's marker of a written
    # journal); the second stays in the open spool.
    deadline = time.monotonic() + 30
    while (resp := await append(cluster.stub(0), "idle/flushed", b"first\n")).status != pb.OK:
        assert resp.status == pb.NO_JOURNAL_PRIMARY_BROKER and time.monotonic() < deadline
        await asyncio.sleep(0.1)  # Not assigned yet.
    assert (await append(cluster.stub(0), "idle/flushed", b"second\n")).status == pb.OK
    primary = next(
        b
        for b in cluster.brokers.values()
        if (r := b.resolver.replicas.get("idle/flushed")) is not None and r.primary
    )
    replica = primary.resolver.replicas["idle/flushed"]
    rs = replica.rspool
    assert rs is not None and rs.end > rs.begin
    assert not pulser.flush_due(replica, time.time())
    # An hour later, by the journal's clock: its spool is from an earlier flush interval.
    assert pulser.flush_due(replica, time.time() + 3600)
    replica.spec.fragment.flush_interval.seconds = 1  # Below Apply's minimum: in-process only.
    await asyncio.sleep(1.1)
    assert primary.member is not None
    await primary.member.pulser.sweep()
    await wait_for(lambda: rs.end == rs.begin, "the spool to roll", 30)
    persisted = Path(cluster.tmp / "store" / "idle" / "flushed")
    await wait_for(lambda: len(list(persisted.glob("*"))) == 2, "both fragments to persist", 30)


async def test_single_node_journals_hold_no_task_of_their_own(tmp_path: Path) -> None:
    # `pygazette serve` without etcd: each journal had a task of its own, for life, waiting
    # to roll its spool at flush boundaries (400 journals: 400 tasks, whether or not they
    # ever had an append). One shared timer rolls them now; a roll is a task while it runs.
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data", port=0, file_root=tmp_path / "s"))
    await broker.start()
    try:
        before = len(asyncio.all_tasks())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            specs = []
            for i in range(JOURNALS):
                spec = journal_spec(f"single/j-{i:04d}")
                spec.fragment.flush_interval.seconds = 3600
                specs.append(spec)
            assert (await apply_specs(stub, *specs)).status == pb.OK
            await wait_for(lambda: len(broker.resolver.replicas) == JOURNALS, "replicas", 60)
            for i in range(0, JOURNALS, 40):  # Some with an open spool (and content).
                for _ in range(2):  # The first write's spool rolls; the second stays open.
                    assert (await append(stub, f"single/j-{i:04d}", b"x\n")).status == pb.OK
        tasks = asyncio.all_tasks()
        assert [t.get_name() for t in tasks if t.get_name().startswith("flush:")] == []
        assert len(tasks) - before < 30, sorted(t.get_name() for t in tasks)[:50]
    finally:
        await broker.stop()
