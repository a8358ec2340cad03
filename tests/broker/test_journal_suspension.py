"""Journal suspension, as Gazette's brokers do it (`gazctl journals suspend`).

An empty append asking SUSPEND_IF_FLUSHED suspends an idle journal, SUSPEND_NOW any journal:
PARTIAL (one broker serves it; its spool is rolled and persisted) or, with no fragment
holding content, FULL (no broker). Its primary answers SUSPENDED; an ordinary append resumes
it at the offset it was suspended at. A suspending append may not carry content.

Two brokers run in this process on a real etcd; the journals have two replicas.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from pygazette.broker import append_fsm, pulser, replicate_service
from pygazette.broker.server import Broker
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.in_process_brokers import start_brokers
from tests.broker.rpc_helpers import append, apply_specs, journal_spec
from tests.support.cluster import read_range
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

NOW = pb.AppendRequest.SUSPEND_NOW
IF_FLUSHED = pb.AppendRequest.SUSPEND_IF_FLUSHED
WAIT_SECONDS = 20.0


class Brokers:
    def __init__(
        self, tmp: Path, etcd: EtcdProcess, root: str, count: int = 2, **options: object
    ) -> None:
        self.tmp, self.etcd, self.root, self.options = tmp, etcd, root, options
        self.count = count
        self.brokers: list[Broker] = []
        self.channel: grpc.aio.Channel | None = None

    async def start(self) -> None:
        self.brokers = await start_brokers(
            self.tmp, self.etcd, self.root, self.count, **self.options
        )
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.brokers[0].port}")
        self.stub = pb_grpc.JournalStub(self.channel)  # type: ignore[no-untyped-call]

    async def journal(self, name: str) -> pb.ListResponse.Journal:
        request = pb.ListRequest(
            selector=pb.LabelSelector(
                include=pb.LabelSet(labels=[pb.Label(name="name", value=name)])
            )
        )
        call = self.stub.List(request)
        listing = await call.read()
        call.cancel()
        assert isinstance(listing, pb.ListResponse) and len(listing.journals) == 1, listing
        return listing.journals[0]

    async def until(
        self, name: str, ok: Callable[[pb.ListResponse.Journal], bool]
    ) -> pb.ListResponse.Journal:
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            j = await self.journal(name)
            if ok(j):
                return j
            assert time.monotonic() < deadline, f"{name} never got there: {j}"
            await asyncio.sleep(0.05)

    async def append(self, name: str, *chunks: bytes, **options: object) -> pb.AppendResponse:
        """An append through broker 0 (it proxies to the primary), retried while the route
        is still settling after an apply or a suspension."""
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            resp = await append(self.stub, name, *chunks, **options)
            if resp.status not in (pb.NO_JOURNAL_PRIMARY_BROKER, pb.INSUFFICIENT_JOURNAL_BROKERS):
                return resp
            assert time.monotonic() < deadline, resp
            await asyncio.sleep(0.05)

    async def read(self, name: str) -> bytes:
        return (await read_range(self.stub, name, 0, 0))[0]

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close(None)
        for b in self.brokers:
            await b.stop(grace=1.0)


def _members(n: int) -> Callable[[pb.ListResponse.Journal], bool]:
    return lambda j: len(j.route.members) == n and (n == 0 or j.route.primary >= 0)


@pytest.fixture
async def brokers(tmp_path: Path, etcd: EtcdProcess, etcd_root: str) -> AsyncIterator[Brokers]:
    b = Brokers(tmp_path, etcd, etcd_root)
    try:
        await b.start()
        yield b
    finally:
        await b.close()


async def test_suspend_now_leaves_one_broker_and_an_append_resumes_where_it_was(
    brokers: Brokers,
) -> None:
    name = "suspension/busy"
    await apply_specs(brokers.stub, journal_spec(name, replication=2))
    await brokers.until(name, _members(2))
    resp = await brokers.append(name, b"hello\n")
    assert resp.status == pb.OK and resp.commit.end == 6

    # Its content isn't persisted: it is in use, and only SUSPEND_NOW suspends it.
    resp = await brokers.append(name, suspend=IF_FLUSHED)
    assert resp.status == pb.OK
    assert (await brokers.journal(name)).spec.suspend.level == pb.JournalSpec.Suspend.NONE
    # A suspending append carries no content.
    resp = await brokers.append(name, b"nope\n", suspend=NOW)
    assert resp.status == pb.NOT_ALLOWED

    resp = await brokers.append(name, suspend=NOW)
    assert resp.status == pb.SUSPENDED
    j = await brokers.until(name, _members(1))
    assert j.spec.suspend.level == pb.JournalSpec.Suspend.PARTIAL
    assert j.spec.suspend.offset == 6
    # Its spool was rolled, and persisted: the store holds [0, 6).
    store = brokers.tmp / "store" / name
    deadline = time.monotonic() + WAIT_SECONDS
    while not any(p.name.startswith(f"{0:016x}-{6:016x}-") for p in store.glob("*")):
        assert time.monotonic() < deadline, list(store.glob("*"))
        await asyncio.sleep(0.05)
    # Suspended, it is still read; an append that must not resume it is told so.
    assert (await read_range(brokers.stub, name, 0, 6))[0] == b"hello\n"
    resp = await brokers.append(name, suspend=pb.AppendRequest.SUSPEND_NO_RESUME)
    assert resp.status == pb.SUSPENDED
    # Asked again, it stays suspended.
    resp = await brokers.append(name, suspend=IF_FLUSHED)
    assert resp.status == pb.SUSPENDED

    # An ordinary append resumes it, where it was suspended.
    resp = await brokers.append(name, b"again\n")
    assert resp.status == pb.OK and (resp.commit.begin, resp.commit.end) == (6, 12)
    j = await brokers.until(name, _members(2))
    assert j.spec.suspend.level == pb.JournalSpec.Suspend.NONE
    assert (await read_range(brokers.stub, name, 0, 12))[0] == b"hello\nagain\n"


async def test_an_idle_journal_is_suspended_if_flushed(
    brokers: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Idle as soon as its newest fragment is persisted (not a day later).
    monkeypatch.setattr(append_fsm, "SUSPEND_IDLE_SECONDS", 0)
    name = "suspension/idle"
    await apply_specs(brokers.stub, journal_spec(name, replication=2))
    await brokers.until(name, _members(2))
    resp = await brokers.append(name, b"idle\n")
    assert resp.status == pb.OK
    # Its content is in a spool: in use.
    resp = await brokers.append(name, suspend=IF_FLUSHED)
    assert resp.status == pb.OK
    # That empty append rolled the spool (it held the journal's first write): once [0, 5)
    # is persisted, the journal is idle.
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        resp = await brokers.append(name, suspend=IF_FLUSHED)
        if resp.status == pb.SUSPENDED:
            break
        assert resp.status == pb.OK, resp
        assert time.monotonic() < deadline, "never idle"
        await asyncio.sleep(0.05)
    j = await brokers.until(name, _members(1))
    assert j.spec.suspend.level == pb.JournalSpec.Suspend.PARTIAL
    assert j.spec.suspend.offset == 5


async def test_a_journal_without_content_is_suspended_fully(brokers: Brokers) -> None:
    name = "suspension/empty"
    await apply_specs(brokers.stub, journal_spec(name, replication=2))
    await brokers.until(name, _members(2))

    resp = await brokers.append(name, suspend=IF_FLUSHED)
    assert resp.status == pb.SUSPENDED
    j = await brokers.until(name, _members(0))
    assert j.spec.suspend.level == pb.JournalSpec.Suspend.FULL
    assert j.spec.suspend.offset == 0
    # No broker serves it: reads are told it is suspended, as are appends asking again.
    read = brokers.stub.Read(pb.ReadRequest(journal=name, offset=0, block=False))
    first = await read.read()
    assert isinstance(first, pb.ReadResponse) and first.status == pb.SUSPENDED
    read.cancel()
    resp = await brokers.append(name, suspend=NOW)
    assert resp.status == pb.SUSPENDED

    # An append resumes it, from where it was.
    resp = await brokers.append(name, b"back\n")
    assert resp.status == pb.OK and (resp.commit.begin, resp.commit.end) == (0, 5)
    j = await brokers.until(name, _members(2))
    assert j.spec.suspend.level == pb.JournalSpec.Suspend.NONE


def _suspended_at(spec: pb.JournalSpec, level: int, offset: int) -> pb.JournalSpec:
    spec.suspend.level = level  # type: ignore[assignment]
    spec.suspend.offset = offset
    return spec


async def test_a_resume_lands_at_the_suspension_offset_not_below(brokers: Brokers) -> None:
    # Suspended at 100 (its fragments since removed by retention, or its broker replaced: the
    # one serving it now holds nothing): its spool is below the offset. As Gazette's, an
    # append resumes it at 100, never below (offsets readers may have read).
    name = "suspension/partial-at-100"
    await apply_specs(
        brokers.stub,
        _suspended_at(journal_spec(name, replication=2), pb.JournalSpec.Suspend.PARTIAL, 100),
    )
    await brokers.until(name, _members(1))
    resp = await brokers.append(name, b"back\n")
    assert resp.status == pb.OK and (resp.commit.begin, resp.commit.end) == (100, 105), resp
    j = await brokers.until(name, _members(2))
    assert j.spec.suspend.level == pb.JournalSpec.Suspend.NONE
    assert j.spec.suspend.offset >= 100


async def test_a_suspension_keeps_the_offset_the_journal_resumes_at(brokers: Brokers) -> None:
    # Suspended at 100, served by a broker that holds nothing (its spool is below): suspended
    # fully, it still resumes at 100.
    name = "suspension/partial-again-at-100"
    await apply_specs(
        brokers.stub,
        _suspended_at(journal_spec(name, replication=2), pb.JournalSpec.Suspend.PARTIAL, 100),
    )
    await brokers.until(name, _members(1))
    resp = await brokers.append(name, suspend=IF_FLUSHED)
    assert resp.status == pb.SUSPENDED
    j = await brokers.until(name, _members(0))
    assert j.spec.suspend.level == pb.JournalSpec.Suspend.FULL
    assert j.spec.suspend.offset == 100
    resp = await brokers.append(name, b"back\n")
    assert resp.status == pb.OK and (resp.commit.begin, resp.commit.end) == (100, 105), resp


async def test_auto_suspension_suspends_journals_left_idle(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --auto-suspend`: a journal whose pipeline closed idle is asked to suspend
    itself (SUSPEND_IF_FLUSHED) a while later, and again once it could be; an append
    resumes it. (Every period here is cut short.)"""
    monkeypatch.setattr(pulser, "SWEEP_SECONDS", 0.2)
    monkeypatch.setattr(pulser, "PIPELINE_IDLE_SECONDS", 0.5)
    monkeypatch.setattr(pulser, "AUTO_SUSPEND_IDLE_SECONDS", 0.5)
    monkeypatch.setattr(append_fsm, "SUSPEND_IDLE_SECONDS", 1)
    brokers = Brokers(tmp_path, etcd, etcd_root, auto_suspend=True)
    try:
        await brokers.start()
        await apply_specs(
            brokers.stub,
            journal_spec("auto/quiet", replication=2),
            journal_spec("auto/empty", replication=2),
        )
        assert (await brokers.append("auto/quiet", b"quiet\n")).status == pb.OK

        # Never written: suspended fully. Written, once its spool persisted (its idle check
        # rolls it: it holds the journal's first write) and a second passed: partly.
        j = await brokers.until("auto/empty", _members(0))
        assert j.spec.suspend.level == pb.JournalSpec.Suspend.FULL
        j = await brokers.until("auto/quiet", _members(1))
        assert j.spec.suspend.level == pb.JournalSpec.Suspend.PARTIAL
        assert j.spec.suspend.offset == 6
        assert sum(b.member.pulser.suspension_checks for b in brokers.brokers if b.member) >= 2

        resp = await brokers.append("auto/quiet", b"again\n")
        assert resp.status == pb.OK and (resp.commit.begin, resp.commit.end) == (6, 12)
        assert (await brokers.read("auto/quiet")) == b"quiet\nagain\n"
    finally:
        await brokers.close()


async def test_a_resume_never_writes_below_what_the_store_holds(brokers: Brokers) -> None:
    # Suspended at 100 by its spec, but its store holds [0, 150) (written elsewhere, or the
    # spec is stale). As Gazette's, the journal is rolled to 100 and the checks of the append's
    # offset hold from there: an append is refused INDEX_HAS_GREATER_OFFSET (and resumes
    # nothing), and one at the explicit offset 150 (`journals reset-head`) lands at 150. Both
    # were written at 100, over offsets the store holds. (One replica: no route change, and
    # so no pulse, rolls the spool between the resumption and the append.)
    name = "suspension/store-ahead"
    content = b"x" * 149 + b"\n"
    sha = hashlib.sha1(content).hexdigest()
    store = brokers.tmp / "store" / name
    store.mkdir(parents=True)
    (store / f"{0:016x}-{150:016x}-{sha}.raw").write_bytes(content)
    await apply_specs(
        brokers.stub,
        _suspended_at(journal_spec(name), pb.JournalSpec.Suspend.PARTIAL, 100),
    )
    await brokers.until(name, _members(1))
    resp = await brokers.append(name, b"over\n")
    assert resp.status == pb.INDEX_HAS_GREATER_OFFSET, resp
    assert (await brokers.journal(name)).spec.suspend.level == pb.JournalSpec.Suspend.PARTIAL

    resp = await brokers.append(name, b"head\n", offset=150)
    assert resp.status == pb.OK and (resp.commit.begin, resp.commit.end) == (150, 155), resp
    assert (await read_range(brokers.stub, name, 100, 155))[0] == content[100:] + b"head\n"


async def test_a_suspension_waits_for_commits_in_flight(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suspension records the offset the journal resumes at: commits of earlier appends
    still in flight count only once confirmed. One that fails instead (its pipeline breaks)
    is cut, and the journal must not resume past it, leaving a gap."""
    name = "suspension/in-flight"
    entered, release = asyncio.Event(), asyncio.Event()
    real_apply = replicate_service._apply

    async def peer_apply(replica: Any, req: pb.ReplicateRequest, *args: Any, **kw: Any) -> Any:
        if req.HasField("proposal") and req.proposal.end == 4 and replica.name == name:
            entered.set()  # The commit of [2, 4) is in flight: held, then failed.
            await release.wait()
            raise replicate_service.ReplicateAborted(grpc.StatusCode.UNAVAILABLE, "peer fails")
        return await real_apply(replica, req, *args, **kw)

    brokers = Brokers(tmp_path, etcd, etcd_root, count=3)
    try:
        await brokers.start()
        await apply_specs(brokers.stub, journal_spec(name, replication=3))
        await brokers.until(name, _members(3))
        assert (await brokers.append(name, b"a\n")).status == pb.OK
        monkeypatch.setattr(replicate_service, "_apply", peer_apply)

        failing = asyncio.ensure_future(append(brokers.stub, name, b"b\n"))
        await asyncio.wait_for(entered.wait(), WAIT_SECONDS)
        suspension = asyncio.ensure_future(append(brokers.stub, name, suspend=NOW))
        await asyncio.sleep(0.2)  # Let it reach the journal (it must wait for the commit).
        release.set()
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await failing
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        try:
            resp = await suspension
            assert resp.status == pb.SUSPENDED  # Taken once the pipeline was rebuilt.
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE  # Failed with the pipeline.
        monkeypatch.setattr(replicate_service, "_apply", real_apply)

        j = await brokers.journal(name)
        assert j.spec.suspend.offset <= 2, j.spec.suspend  # Never past the failed commit.
        resp = await brokers.append(name, b"c\n")
        assert resp.status == pb.OK and (resp.commit.begin, resp.commit.end) == (2, 4)
        assert (await brokers.read(name)) == b"a\nc\n"
    finally:
        await brokers.close()


def _pulser_of_primary(brokers: Brokers, name: str) -> pulser.Pulser | None:
    for b in brokers.brokers:
        replica = b.resolver.replicas.get(name)
        if b.member is not None and replica is not None and replica.primary:
            return b.member.pulser
    return None


async def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_auto_suspension_keeps_one_due_time_per_idle_journal(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal its idle check found not idle for long enough (a day, without a flush
    interval) is asked again only then; used now and then meanwhile, it goes idle again
    after each use, due at that same time. The pulser's heap holds it once, not once per
    use until that far due time (a journal appended to every few minutes added hundreds of
    entries a day)."""
    monkeypatch.setattr(pulser, "RETRY_SECONDS", 0.05)
    monkeypatch.setattr(pulser, "SWEEP_SECONDS", 0.05)
    monkeypatch.setattr(pulser, "PIPELINE_IDLE_SECONDS", 0.2)
    monkeypatch.setattr(pulser, "AUTO_SUSPEND_IDLE_SECONDS", 0.2)
    name = "auto/used"
    brokers = Brokers(tmp_path, etcd, etcd_root, auto_suspend=True)
    try:
        await brokers.start()
        await apply_specs(brokers.stub, journal_spec(name, replication=2))
        assert (await brokers.append(name, b"one\n")).status == pb.OK
        p = _pulser_of_primary(brokers, name)
        assert p is not None
        # Its first idle check: written a moment ago, so not suspended; asked again in a day.
        await _wait_for(lambda: p.suspension_checks >= 1 and name in p._idle, "its idle check")
        assert p.suspension_checks == 1
        for _ in range(5):
            assert (await brokers.append(name, b"more\n")).status == pb.OK
            await _wait_for(lambda: name in p._idle, "the journal going idle again")
        assert p.suspension_checks == 1
        assert len([e for e in p._suspend_heap if e[2] == name]) == 1, p._suspend_heap
    finally:
        await brokers.close()


async def test_auto_suspension_forgets_a_journal_that_leaves_while_in_use(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal that leaves this broker (deleted, or its primary moved) while in use: the
    pulser forgets when its last idle check said to ask again. (It kept that of every
    journal that ever left so, growing with the journals a broker ever led.)"""
    monkeypatch.setattr(pulser, "RETRY_SECONDS", 0.05)
    monkeypatch.setattr(pulser, "SWEEP_SECONDS", 0.05)
    monkeypatch.setattr(pulser, "PIPELINE_IDLE_SECONDS", 0.2)
    monkeypatch.setattr(pulser, "AUTO_SUSPEND_IDLE_SECONDS", 0.2)
    name = "auto/leaving"
    brokers = Brokers(tmp_path, etcd, etcd_root, auto_suspend=True)
    try:
        await brokers.start()
        await apply_specs(brokers.stub, journal_spec(name, replication=2))
        assert (await brokers.append(name, b"one\n")).status == pb.OK
        p = _pulser_of_primary(brokers, name)
        assert p is not None
        await _wait_for(lambda: p.suspension_checks >= 1 and name in p._idle, "its idle check")
        assert name in p._not_before
        monkeypatch.setattr(pulser, "PIPELINE_IDLE_SECONDS", 60.0)  # In use from here on.
        assert (await brokers.append(name, b"more\n")).status == pb.OK
        assert name in p.active
        delete = pb.ApplyRequest.Change(delete=name, expect_mod_revision=-1)
        assert (await brokers.stub.Apply(pb.ApplyRequest(changes=[delete]))).status == pb.OK
        # The sweep lets go of it; its last answer is forgotten then, or (when the sweep took
        # it for idle before its replica was marked stopping) once its queued idle check
        # comes due and finds it gone.
        await _wait_for(
            lambda: name not in p.active and name not in p._not_before,
            "the pulser letting go of it and forgetting its last answer",
        )
    finally:
        await brokers.close()
