"""A primary replica interrupted by a transient failure recovers in place, exactly once.

The real `ShardReplica` (recovery log, JSONFileStore, the `Counter` app) runs against a real
broker, in this process, with a lease check the test controls. While the lease is uncertain
(as through an etcd restart) the shard must not commit: it abandons the transaction and,
once the lease is sure again, plays its log and goes on. Gazette would leave the shard
FAILED until an operator unassigned it; here it is never FAILED, and the committed outputs
still count 1, 2, …, N per key. An application error, by contrast, still fails the shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata

from pygazette.client import JournalClient, apply_journals
from pygazette.client.append_service import DependencyFailed
from pygazette.client.list_apply import list_journals
from pygazette.consumer.hints import decode_hints, encode_hints
from pygazette.consumer.metrics import RECOVERIES
from pygazette.consumer.recoverylog import Recorder, RecorderFailed
from pygazette.consumer.replica import ConsumerContext, ShardReplica
from pygazette.consumer.transaction import LeaseLost
from pygazette.consumer.transient_failure import is_transient
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Delete, KeyspaceUnavailable, KeyValue, Put
from pygazette.message.framing import MessageDecodeError
from pygazette.message.reader import ReadCommitted
from pygazette.protocol.errors import FragmentStoreUnhealthy
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from pygazette.protocol.shard_validation import hint_backup_keys, hint_primary_key
from tests.consumer.apps import Counter
from tests.consumer.test_consumer_cluster import (
    LOGS,
    OUT,
    RECOVERY_LOG,
    SHARD,
    SOURCES,
    Inputs,
    assert_exactly_once,
    committed_outputs,
    log_write_head,
    shard_spec,
)
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import small_journal_spec

pytestmark = pytest.mark.timeout(180)


def _rpc_error(code: grpc.StatusCode) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details="test")


def test_transient_failures_are_those_of_the_infrastructure() -> None:
    lease = LeaseLost("consumer lease may have expired; not committing")
    transient: list[BaseException] = [
        lease,
        RecorderFailed("commit failed"),
        KeyspaceUnavailable("etcd down"),
        FragmentStoreUnhealthy(detail="store down"),
        OSError(errno.ENOSPC, "No space left on device"),
        _rpc_error(grpc.StatusCode.UNAVAILABLE),
        _rpc_error(grpc.StatusCode.UNKNOWN),
        _rpc_error(grpc.StatusCode.CANCELLED),  # A call an overloaded broker dropped.
        ExceptionGroup("both", [lease, KeyspaceUnavailable("x")]),
    ]
    wrapped = DependencyFailed("a dependency failed")
    wrapped.__cause__ = lease
    transient.append(wrapped)
    for exc in transient:
        assert is_transient(exc), exc

    app_error = ValueError("cannot count key")
    permanent: list[BaseException] = [
        app_error,
        MessageDecodeError("not JSON"),
        OSError("cannot open the store"),  # No errno: not a full disk.
        _rpc_error(grpc.StatusCode.INVALID_ARGUMENT),
        ExceptionGroup("mixed", [lease, app_error]),
    ]
    wrapped_app = DependencyFailed("a dependency failed")
    wrapped_app.__cause__ = app_error
    permanent.append(wrapped_app)
    # Raised while handling a transient failure is still the application's.
    try:
        try:
            raise lease
        except LeaseLost:
            raise ValueError("app bug") from None
    except ValueError as exc:
        permanent.append(exc)
    for exc in permanent:
        assert not is_transient(exc), exc


class _Harness:
    def __init__(self, tmp: Path, client: JournalClient) -> None:
        self.lease_ok = True
        self.statuses: list[cpb.ReplicaStatus] = []
        self.changed = asyncio.Condition()
        self.ks = EmbeddedKeyspace(tmp / "keyspace.json")
        self.ctx = ConsumerContext(
            app=Counter(),
            client=client,
            keyspace=self.ks,
            data_dir=tmp / "consumer",
            lease_check=lambda: self.lease_ok,
            hints_interval=0.5,
        )

    async def report(self, status: cpb.ReplicaStatus) -> None:
        """The replica's status reporter: every change it makes comes through here."""
        self.statuses.append(status)
        async with self.changed:
            self.changed.notify_all()

    async def wait(self, cond: Callable[[], bool], within: float = 60.0) -> None:
        async with asyncio.timeout(within), self.changed:
            await self.changed.wait_for(cond)

    def codes(self) -> list[str]:
        return [cpb.ReplicaStatus.Code.Name(s.code) for s in self.statuses]


@pytest.fixture
async def client(broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.url) as c:
        specs = [small_journal_spec(j) for j in [*SOURCES, OUT]]
        specs.append(small_journal_spec(f"{LOGS}/{SHARD}", RECOVERY_LOG))
        await apply_journals(
            c, [pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs]
        )
        yield c


async def test_primary_recovers_in_place_when_its_lease_was_uncertain(
    tmp_path: Path, client: JournalClient
) -> None:
    h = _Harness(tmp_path, client)
    spec = shard_spec(standbys=0)
    assignment = KeyValue(f"/assignments/{SHARD}#local#0", b"", 1, 1)
    replica = ShardReplica(h.ctx, spec, assignment, h.report)
    recoveries = RECOVERIES.labels(SHARD)
    before_recoveries = recoveries._value.get()
    replica.update(spec, assignment, 0, [])
    try:
        inputs = Inputs(client)
        await h.wait(lambda: replica.is_primary)
        await inputs.publish(200)
        assert_exactly_once(await committed_outputs(client, inputs.sent, 60), inputs.sent)

        # The lease becomes uncertain: the next transaction must not commit.
        h.lease_ok = False
        await inputs.publish(200)
        await h.wait(lambda: not replica.is_primary)
        assert recoveries._value.get() == before_recoveries + 1
        # Nothing it read meanwhile is committed; it waits for the lease, not FAILED.
        stuck = await committed_outputs(client, 0, 0.5)
        assert len(stuck) < inputs.sent
        assert "FAILED" not in h.codes()

        h.lease_ok = True
        await h.wait(lambda: replica.is_primary)
        await inputs.publish(200)
        outputs = await committed_outputs(client, inputs.sent, 60)
        assert_exactly_once(outputs, inputs.sent)
        assert "FAILED" not in h.codes(), h.codes()
        assert replica.status.code == cpb.ReplicaStatus.PRIMARY
    finally:
        await replica.stop()


async def test_application_errors_still_fail_the_shard(
    tmp_path: Path, client: JournalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COUNTER_FAIL_ON", "k3")
    h = _Harness(tmp_path, client)
    spec = shard_spec(standbys=0)
    assignment = KeyValue(f"/assignments/{SHARD}#local#0", b"", 1, 1)
    replica = ShardReplica(h.ctx, spec, assignment, h.report)
    replica.update(spec, assignment, 0, [])
    try:
        await Inputs(client).publish(10)
        await h.wait(lambda: replica.status.code == cpb.ReplicaStatus.FAILED)
        assert any("cannot count key" in e for e in replica.status.errors)
    finally:
        await replica.stop()


async def test_hints_of_another_log_fail_the_shard(tmp_path: Path, client: JournalClient) -> None:
    """As Gazette's: stored hints naming a log other than the spec's recovery log (the spec
    moved to a new log, or hints written by hand) fail the shard rather than be played and
    recorded into."""
    h = _Harness(tmp_path, client)
    spec = shard_spec(standbys=0)
    stale = rpb.FSMHints(log="other/log")
    await h.ks.txn([], [Put(hint_primary_key(spec), encode_hints(stale))])
    assignment = KeyValue(f"/assignments/{SHARD}#local#0", b"", 1, 1)
    replica = ShardReplica(h.ctx, spec, assignment, h.report)
    replica.update(spec, assignment, 0, [])
    try:
        await h.wait(lambda: replica.status.code == cpb.ReplicaStatus.FAILED)
        wrong = "hints.Log other/log != ShardSpec.RecoveryLog"
        assert any(wrong in e for e in replica.status.errors), replica.status.errors
    finally:
        await replica.stop()


class _Lagging(EmbeddedKeyspace):
    """The keyspace view of a consumer that missed a hand-off: in "etcd" (`get_remote`) the
    assignment `gone` no longer exists; the view catches up when it is waited on, and the
    resolver then stops the replica (`on_catch_up`)."""

    gone = ""
    on_catch_up: Callable[[], object] | None = None

    async def get_remote(self, key: str) -> KeyValue | None:
        return None if key == self.gone else self.get(key)

    async def wait_until(self, predicate: Callable[[], bool], within: float | None = None) -> None:
        if self.on_catch_up is not None:
            self.on_catch_up()


async def test_a_deposed_primary_does_not_take_the_log_back(
    tmp_path: Path, client: JournalClient
) -> None:
    """A primary interrupted (here: its lease uncertain) while its assignment was removed in
    etcd, a change its view hasn't caught up with yet (a newer primary has fenced its log):
    before recovering again it catches up, and is stopped, rather than take the log back
    and fence its successor in turn."""
    h = _Harness(tmp_path, client)
    lagging = _Lagging(tmp_path / "lagging.json")
    ctx = dataclasses.replace(h.ctx, keyspace=lagging)
    spec = shard_spec(standbys=0)
    assignment = KeyValue(f"/assignments/{SHARD}#local#0", b"", 1, 1)
    replica = ShardReplica(ctx, spec, assignment, h.report)
    replica.update(spec, assignment, 0, [])
    try:
        await h.wait(lambda: replica.is_primary)
        lagging.gone = assignment.key
        lagging.on_catch_up = lambda: asyncio.ensure_future(replica.stop())
        h.lease_ok = False
        await Inputs(client).publish(10)  # Its next transaction finds the lease uncertain.
        await h.wait(lambda: not replica.is_primary)
        h.lease_ok = True
        await asyncio.wait_for(replica._ended.wait(), 30)  # Stopped, not recovered.
        assert h.codes().count("PRIMARY") == 1, h.codes()  # Never primary again.
    finally:
        await replica.stop()


async def test_a_standby_promoted_while_its_lease_may_have_expired_waits_to_take_the_log(
    tmp_path: Path, client: JournalClient
) -> None:
    """A standby promoted by a view of the keyspace it may no longer be entitled to (its
    process was frozen past its lease, and the watch delivers the promotion made before the
    lease expired): it must not hand the log off to itself, which would fence the primary
    that took over meanwhile, until its lease is surely alive again (as a replica
    recovering again waits). Found freezing a standby promoted while frozen."""
    h = _Harness(tmp_path, client)
    spec = shard_spec()
    standby = KeyValue(f"/assignments/{SHARD}#local#1", b"", 1, 1)
    replica = ShardReplica(h.ctx, spec, standby, h.report)
    replica.update(spec, standby, 1, [])
    try:
        await h.wait(lambda: replica.status.code == cpb.ReplicaStatus.STANDBY)
        head = await log_write_head(client)
        h.lease_ok = False
        primary = KeyValue(f"/assignments/{SHARD}#local#0", b"", 2, 2)
        replica.update(spec, primary, 0, [])
        # Nothing to wait on but time: it must do nothing while the lease is in doubt.
        with contextlib.suppress(TimeoutError):
            await h.wait(lambda: replica.is_primary, within=2.0)
        assert await log_write_head(client) == head  # No hand-off: the log is not fenced.
        assert not replica.is_primary, h.codes()
        h.lease_ok = True
        await h.wait(lambda: replica.is_primary)
        assert await log_write_head(client) > head
        inputs = Inputs(client)
        await inputs.publish(50)
        assert_exactly_once(await committed_outputs(client, inputs.sent, 60), inputs.sent)
    finally:
        await replica.stop()


class _Stuck(Counter):
    """Counts, but its transaction's finalize waits (for ever) once `stuck` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck = False
        self.waiting = asyncio.Event()

    async def finalize_txn(self, shard: object, store: object, pub: object) -> None:
        if self.stuck:
            self.waiting.set()
            await asyncio.Event().wait()


@pytest.mark.parametrize("lease_ok", [True, False], ids=["lease-alive", "lease-lost"])
async def test_a_shard_stops_at_once_when_its_lease_is_lost(
    tmp_path: Path, client: JournalClient, lease_ok: bool
) -> None:
    # A transaction in flight (its finalize stuck, as a commit retrying against a broker
    # that is away) gets the stop timeout to finish, unless the lease may have expired:
    # then it could not commit any more, and the shard stops at once.
    h = _Harness(tmp_path, client)
    app = _Stuck()
    h.ctx.app = app
    h.ctx.stop_timeout = 3.0
    spec = shard_spec(standbys=0)
    assignment = KeyValue(f"/assignments/{SHARD}#local#0", b"", 1, 1)
    replica = ShardReplica(h.ctx, spec, assignment, h.report)
    replica.update(spec, assignment, 0, [])
    try:
        await h.wait(lambda: replica.is_primary)
        app.stuck = True
        await Inputs(client).publish(5)
        async with asyncio.timeout(60):
            await app.waiting.wait()
        h.lease_ok = lease_ok
        started = asyncio.get_running_loop().time()
        await replica.stop()
        took = asyncio.get_running_loop().time() - started
        if lease_ok:
            assert took >= 2.5  # Given its time to finish.
        else:
            assert took < 1.0
    finally:
        await replica.stop()


async def _committed_of(client: JournalClient, journal: str) -> list[Any]:
    out: list[Any] = []
    async with ReadCommitted(client, journal, offset=None) as rc:
        with contextlib.suppress(StopAsyncIteration):
            while True:
                out.extend(e.message for e in await rc.next_batch())
    return out


async def test_a_recovered_ack_intent_of_a_deleted_journal_is_dropped(
    tmp_path: Path, client: JournalClient
) -> None:
    # The last checkpoint holds an ACK intent for an output journal deleted since. As in
    # Gazette, the new primary drops that intent (it can't be appended) and goes on: the
    # failed append must not fail every later transaction's commit (whose store commit waits
    # for all of the shard's pending appends), which made the shard FAILED.
    gone = f"{OUT}-gone"
    await apply_journals(
        client, [pb.ApplyRequest.Change(upsert=small_journal_spec(gone), expect_mod_revision=0)]
    )
    h = _Harness(tmp_path, client)
    app = Counter()
    app.output = gone
    h.ctx.app = app
    spec = shard_spec(standbys=0)
    inputs = Inputs(client)
    first = KeyValue(f"/assignments/{SHARD}#local#0", b"", 1, 1)
    replica = ShardReplica(h.ctx, spec, first, h.report)
    replica.update(spec, first, 0, [])
    try:
        await h.wait(lambda: replica.is_primary)
        await inputs.publish(100)
        await replica.wait_read_through(dict(inputs.heads), 60)
    finally:
        await replica.stop()
    outputs = await _committed_of(client, gone)
    assert len(outputs) == inputs.sent
    [listed] = await list_journals(client, pb.LabelSelector(include=label_set({"name": gone})))
    await apply_journals(
        client,
        [pb.ApplyRequest.Change(delete=gone, expect_mod_revision=listed.mod_revision)],
    )

    app.output = OUT
    second = KeyValue(f"/assignments/{SHARD}#local#0", b"", 2, 2)
    replica = ShardReplica(h.ctx, spec, second, h.report)
    replica.update(spec, second, 0, [])
    try:
        await h.wait(lambda: replica.is_primary)
        await inputs.publish(100)
        await replica.wait_read_through(dict(inputs.heads), 60)  # Raises if it FAILED.
        outputs += await committed_outputs(client, 100, 60)
        assert replica.status.code == cpb.ReplicaStatus.PRIMARY, replica.status
        assert_exactly_once(outputs, inputs.sent)
    finally:
        await replica.stop()


class _RaisesCancelled(Counter):
    """Raises CancelledError from consume_message (as awaiting a future that something else
    cancelled does) once `poisoned` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.poisoned = False

    def consume_message(self, shard: Any, store: Any, env: Any, pub: Any) -> None:
        if self.poisoned:
            raise asyncio.CancelledError("a future the application awaited was cancelled")
        super().consume_message(shard, store, env, pub)


async def test_a_cancelled_error_the_application_raises_fails_the_shard(
    tmp_path: Path, client: JournalClient
) -> None:
    # The shard was not cancelled (it is not stopping): a CancelledError out of the
    # application is its failure. It used to end the replica's task as if cancelled: the
    # shard processed nothing more, yet stayed PRIMARY, with no error anywhere.
    h = _Harness(tmp_path, client)
    app = _RaisesCancelled()
    h.ctx.app = app
    spec = shard_spec(standbys=0)
    assignment = KeyValue(f"/assignments/{SHARD}#local#0", b"", 1, 1)
    replica = ShardReplica(h.ctx, spec, assignment, h.report)
    replica.update(spec, assignment, 0, [])
    try:
        await h.wait(lambda: replica.is_primary)
        app.poisoned = True
        await Inputs(client).publish(10)
        await h.wait(lambda: replica.status.code == cpb.ReplicaStatus.FAILED, within=20)
        assert any("CancelledError" in e for e in replica.status.errors), replica.status
    finally:
        await replica.stop()


async def test_an_idle_primary_does_not_rewrite_its_hints(
    tmp_path: Path, client: JournalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A primary stores its recorded hints every hints interval, but only when they changed:
    an idle shard leaves the keyspace quiet (each write is an etcd revision, history etcd
    keeps until compaction: thousands of idle shards rewrote their hints every 5 s)."""
    built = 0
    idle = asyncio.Event()  # Set once the hints were built 10 times (over 10 intervals).
    build_hints = Recorder.build_hints

    def counting(rec: Recorder) -> rpb.FSMHints:
        nonlocal built
        built += 1
        if built >= 10:
            idle.set()
        return build_hints(rec)

    monkeypatch.setattr(Recorder, "build_hints", counting)
    h = _Harness(tmp_path, client)
    h.ctx.hints_interval = 0.05
    spec = shard_spec(standbys=0)
    assignment = KeyValue(f"/assignments/{SHARD}#local#0", b"", 1, 1)
    await h.ks.txn([], [Put(assignment.key, b"")])
    assignment = h.ks.get(assignment.key)
    assert assignment is not None
    key = hint_primary_key(spec)

    def stored() -> rpb.FSMHints | None:
        kv = h.ks.get(key)
        return None if kv is None else decode_hints(kv.value)

    replica = ShardReplica(h.ctx, spec, assignment, h.report)
    replica.update(spec, assignment, 0, [])
    try:
        inputs = Inputs(client)
        await h.wait(lambda: replica.is_primary)
        await inputs.publish(50)
        await committed_outputs(client, inputs.sent, 60)
        recorder = replica.recorder
        assert recorder is not None
        # Its hints of everything committed are stored...
        await h.ks.wait_until(lambda: stored() == build_hints(recorder), 30)
        kv = h.ks.get(key)
        assert kv is not None
        # ...and not stored again while nothing changes.
        built = 0
        idle.clear()
        await asyncio.wait_for(idle.wait(), 30)
        assert h.ks.get(key) == kv
        # A change is stored at the next interval.
        await inputs.publish(10)
        await committed_outputs(client, inputs.sent, 60)
        await h.ks.wait_until(lambda: stored() == build_hints(recorder), 30)
    finally:
        await replica.stop()


class _SlowToOpen(Counter):
    """Counts; opening its store waits until `proceed` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.opening = asyncio.Event()
        self.proceed = asyncio.Event()

    async def new_store(self, shard: Any, recorder: Any) -> Any:
        self.opening.set()
        await self.proceed.wait()
        return super().new_store(shard, recorder)


async def test_a_replica_deposed_while_it_recovered_leaves_the_backup_hints_alone(
    tmp_path: Path, client: JournalClient
) -> None:
    """As Gazette's storeRecoveredHints, the rotation of recovered hints into the backup keys
    is guarded by the replica's assignment: a replica deposed while it recovered (its
    successor may have recovered and rotated its own, newer hints since) doesn't push its
    older hints over them."""
    h = _Harness(tmp_path, client)
    app = _SlowToOpen()
    h.ctx.app = app
    spec = shard_spec(standbys=0)
    await h.ks.txn([], [Put(f"/assignments/{SHARD}#local#0", b"")])
    assignment = h.ks.get(f"/assignments/{SHARD}#local#0")
    assert assignment is not None
    backup_keys = hint_backup_keys(spec)

    replica = ShardReplica(h.ctx, spec, assignment, h.report)
    replica.update(spec, assignment, 0, [])
    try:
        async with asyncio.timeout(60):
            await app.opening.wait()  # Recovered from the log: opening its store.
        # Deposed meanwhile; its successor recovered and rotated in its newer hints.
        newer = rpb.FSMHints(log=f"{LOGS}/{SHARD}")
        newer.properties.add(path="/IDENTITY", content="the successor's")
        await h.ks.txn([], [Delete(assignment.key), Put(backup_keys[0], encode_hints(newer))])
        before = [h.ks.get(k) for k in backup_keys]
        app.proceed.set()
        await h.wait(lambda: replica.is_primary)  # Until the resolver stops it.
        assert [h.ks.get(k) for k in backup_keys] == before
    finally:
        await replica.stop()
