"""The shard resolver: keeps local shard replicas in step with this process's assignments,
and resolves shard IDs to the process that serves them (Gazette's consumer.Resolver).

On every keyspace change (after `ObservedState` re-extracted the allocator state) the
resolver walks the local member's assignments: a newly assigned shard gets a replica from
the factory; a replica whose spec or assignments changed is told (`update`, slot 0 = primary);
a replica no longer assigned is stopped. As in Gazette, a replica survives a promotion (its
assignment moves to a lower slot) and a change of its assignment's value, but an assignment
that was deleted and re-created (same or higher slot, new create revision) gets a new one.

Each replica reports its status through a `StatusReporter` that writes the ReplicaStatus
into its assignment's value (Gazette's updateStatus): reduced with the stored status (the
larger code wins, errors accumulate), guarded by the assignment's mod revision and keeping
the assignment's lease; retried when the assignment changed meanwhile, and a no-op once the
assignment is gone or the replica stopped. Reports made at the same time (thousands of
shards starting at once) are written together, up to `STATUS_BATCH` assignments per etcd
transaction by at most `STATUS_WRITERS` writers at a time; a batch that fails (an assignment
changed under it, etcd unreachable) is retried one report per transaction, as Gazette does.

`resolve` maps a shard ID to a Resolution at the current (or a required) revision: the spec,
the shard's route (members in key order, the slot-0 member primary, endpoints from the
members' ConsumerSpecs), the responding process, the local replica when this process is the
primary, and a status: SHARD_NOT_FOUND, NO_SHARD_PRIMARY, NOT_SHARD_PRIMARY (the primary is
elsewhere and the request may not be proxied), or OK.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from pygazette.allocator.allocator import ObservedState
from pygazette.allocator.request_fence import (
    REVISION_WAIT_SECONDS,
    ResolveError,
    pass_request_fence,
    same_process,
)
from pygazette.allocator.state import AllocatorState, Assignment, LocalItem
from pygazette.consumer.key_space import ShardDecoder
from pygazette.keyspace.keyspace import Compare, Keyspace, KeyspaceUnavailable, KeyValue, Put
from pygazette.keyspace.layout import KeyDecodeError, KeyLayout
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from pygazette.protocol.shard_validation import validate_replica_status

log = logging.getLogger(__name__)

__all__ = [
    "REVISION_WAIT_SECONDS",
    "ReplicaFactory",
    "ReplicaHandle",
    "ReplicaStopped",
    "Resolution",
    "ResolveError",
    "ShardResolver",
    "StatusReporter",
]

# Backoff between attempts to write a replica's status (etcd unreachable, lost races).
_REPORT_BACKOFF_SECONDS = (0.05, 2.0)
# Status reports written together: assignments per etcd transaction (each a compare and a
# put, within etcd's default --max-txn-ops of 128), and transactions in flight at once.
STATUS_BATCH = 100
STATUS_WRITERS = 4

StatusReporter = Callable[[cpb.ReplicaStatus], Awaitable[None]]


class ReplicaStopped(Exception):
    """The replica stopped (or failed) while a request waited on it (→ SHARD_STOPPED)."""


class ReplicaHandle(Protocol):
    """What the resolver and the Shard service need of a local shard replica."""

    def update(
        self,
        spec: cpb.ShardSpec,
        assignment: KeyValue,
        slot: int,
        all_assignments: list[Assignment],
    ) -> None:
        """Called right after the factory built the replica, then whenever the spec or any
        of the shard's assignments change. `slot` 0 means this replica is the primary."""
        ...

    async def stop(self) -> None:
        """Stop the replica (it is no longer assigned here, or the process is stopping)."""
        ...

    @property
    def status(self) -> cpb.ReplicaStatus:
        """The replica's current status."""
        ...

    async def wait_read_through(
        self, read_through: dict[str, int], within: float | None
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Once the primary is ready (its store recovered) and its committed transactions
        have read each journal of `read_through` through at least its offset, return its
        progress (read_through, publish_at). TimeoutError after `within` seconds (None:
        no limit);
        ReplicaStopped if the replica stops or fails meanwhile."""
        ...

    def hints(self) -> rpb.FSMHints | None:
        """The hints the replica recovered its store from (None before / without one)."""
        ...


ReplicaFactory = Callable[[cpb.ShardSpec, KeyValue, StatusReporter], ReplicaHandle]


@dataclass(slots=True)
class Resolution:
    status: cpb.Status
    header: pb.Header
    local_id: pb.ProcessSpec.ID
    spec: cpb.ShardSpec | None = None
    item: KeyValue | None = None
    assignments: list[Assignment] = field(default_factory=list)
    replica: ReplicaHandle | None = None  # Set iff this process is the shard's primary.
    stopped: asyncio.Event | None = None  # Set when `replica` is stopped by the resolver.

    @property
    def local(self) -> bool:
        """This process serves the request (it is the primary, or the status is an error)."""
        return same_process(self.header.process_id, self.local_id)

    @property
    def route(self) -> pb.Route:
        return self.header.route


@dataclass(slots=True, eq=False)
class _LocalShard:
    shard_id: str
    replica: ReplicaHandle | None
    assignment: Assignment
    fingerprint: tuple[object, ...] = ()
    stopped: asyncio.Event = field(default_factory=asyncio.Event)


class ShardResolver:
    """Local replicas of the shards assigned to `member_key`, and shard resolution."""

    def __init__(
        self,
        keyspace: Keyspace,
        layout: KeyLayout,
        observed: ObservedState,
        member_key: str,
        factory: ReplicaFactory,
        *,
        process_spec: pb.ProcessSpec | None = None,
    ) -> None:
        self.keyspace = keyspace
        self.layout = layout
        self.observed = observed
        self.member_key = member_key
        self.factory = factory
        decoder = observed.decoder
        self.decoder = decoder if isinstance(decoder, ShardDecoder) else ShardDecoder(layout)
        zone, suffix = layout.parse_member_key(member_key)
        self._local_id = pb.ProcessSpec.ID(zone=zone, suffix=suffix)
        if process_spec is not None and not same_process(process_spec.id, self._local_id):
            raise ValueError(
                f"process spec {process_spec.id.zone}#{process_spec.id.suffix} doesn't match "
                f"member key {member_key}"
            )
        self.process_spec = process_spec
        self.serving = True
        # Whether this process's etcd lease is surely alive. When it may not be, its view
        # of the keyspace can't be trusted and it resolves nothing.
        self.lease_alive: Callable[[], bool] = lambda: True
        self._local: dict[str, _LocalShard] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._started = False
        self._sources: tuple[int, dict[str, list[cpb.ShardSpec]]] = (-1, {})
        self._touched = observed.touched_items()
        # Status reports waiting for a batch: (entry, status, whether it was written).
        self._reports: list[tuple[_LocalShard, cpb.ReplicaStatus, asyncio.Future[bool]]] = []
        self._writers: set[asyncio.Task[None]] = set()
        self.status_txns = 0  # Batched status transactions that succeeded (tests).

    # Local replicas.
    @property
    def local_id(self) -> pb.ProcessSpec.ID:
        return pb.ProcessSpec.ID(zone=self._local_id.zone, suffix=self._local_id.suffix)

    @property
    def replicas(self) -> dict[str, ReplicaHandle]:
        """Shard ID → the local replica of each shard assigned here."""
        return {sid: e.replica for sid, e in self._local.items() if e.replica is not None}

    def start(self) -> None:
        """Follow the keyspace from now on (register after the ObservedState)."""
        if not self._started:
            self._started = True
            self.keyspace.add_listener(lambda _rev: self.sync_replicas())
        self.sync_replicas()

    def sync_replicas(self) -> None:
        """Bring local replicas in line with the local member's assignments of the shards
        that changed since the last sync (all of them, at first)."""
        if not self.serving:
            return
        state = self.observed.current
        touched = self._touched.take()
        sids: Iterable[str] = set(state.local) | set(self._local) if touched is None else touched
        for sid in sids:
            local = state.local.get(sid)
            entry = self._local.pop(sid, None)
            if local is not None:
                entry = self._sync_shard(sid, local[0], entry)
                if entry is not None:
                    self._local[sid] = entry
                    continue
            if entry is not None:
                self._stop_entry(entry)

    def _sync_shard(self, sid: str, li: LocalItem, entry: _LocalShard | None) -> _LocalShard | None:
        """The shard's local entry brought up to date (None: it can't run here)."""
        try:
            spec = self.decoder.shard_spec(li.item.kv)
        except KeyDecodeError as exc:
            log.error("undecodable shard spec", extra={"shard": sid, "error": str(exc)})
            if entry is not None:
                self._stop_entry(entry)
            return None
        asn = li.assignment
        if entry is not None:
            prev = entry.assignment
            # A promoted replica, or the same assignment with a new value, carries on;
            # an assignment deleted and re-created gets a new replica.
            promoted = asn.slot < prev.slot
            if not promoted and prev.kv.create_revision != asn.kv.create_revision:
                self._stop_entry(entry)
                entry = None
        if entry is None:
            entry = _LocalShard(sid, None, asn)
            try:
                entry.replica = self.factory(spec, asn.kv, self._reporter(entry))
            except Exception:
                log.exception("cannot create a shard replica", extra={"shard": sid})
                return None
            log.info("starting local shard", extra={"shard": sid, "slot": asn.slot})
        fingerprint = (
            li.item.kv.mod_revision,
            tuple((a.kv.key, a.kv.mod_revision) for a in li.assignments),
        )
        if fingerprint != entry.fingerprint:
            entry.fingerprint = fingerprint
            entry.assignment = asn
            assert entry.replica is not None
            try:
                entry.replica.update(spec, asn.kv, asn.slot, list(li.assignments))
            except Exception:
                log.exception("shard replica update failed", extra={"shard": sid})
        return entry

    def _stop_entry(self, entry: _LocalShard) -> None:
        if entry.stopped.is_set():
            return
        entry.stopped.set()
        if entry.replica is None:
            return
        log.info("stopping local shard", extra={"shard": entry.shard_id})
        task = asyncio.create_task(self._stop_replica(entry), name=f"stop-shard:{entry.shard_id}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    @staticmethod
    async def _stop_replica(entry: _LocalShard) -> None:
        assert entry.replica is not None
        try:
            await entry.replica.stop()
        except Exception:
            log.exception("shard replica failed to stop cleanly", extra={"shard": entry.shard_id})

    def stop_serving(self) -> None:
        """Stop every local replica now and resolve to none from now on (shutting down)."""
        self.serving = False
        for entry in self._local.values():
            self._stop_entry(entry)
        self._local = {}

    async def stop(self) -> None:
        """Stop serving and wait for every replica to have stopped."""
        self.stop_serving()
        while self._stopping:
            await asyncio.wait(list(self._stopping))

    # Status reports.
    def _reporter(self, entry: _LocalShard) -> StatusReporter:
        async def report(status: cpb.ReplicaStatus) -> None:
            await self._report_status(entry, status)

        return report

    async def _report_status(self, entry: _LocalShard, status: cpb.ReplicaStatus) -> None:
        if entry.stopped.is_set():
            return
        written: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._reports.append((entry, status, written))
        # Count only writers still running: one that finished (it found no report waiting)
        # stays in `_writers` until its done callback runs, later in this turn of the loop,
        # and would never take this report.
        if sum(1 for w in self._writers if not w.done()) < STATUS_WRITERS:
            task = asyncio.create_task(self._write_reports(), name="shard-status-writer")
            self._writers.add(task)
            task.add_done_callback(self._writers.discard)
        if not await written:
            await self._report_alone(entry, status)

    async def _write_reports(self) -> None:
        """Write waiting status reports in batches until none wait."""
        while self._reports:
            batch: list[tuple[_LocalShard, cpb.ReplicaStatus, asyncio.Future[bool]]] = []
            keys: set[str] = set()
            later = []
            for report in self._reports:
                key = report[0].assignment.kv.key
                if len(batch) == STATUS_BATCH or key in keys:
                    later.append(report)  # One put per key and transaction.
                else:
                    keys.add(key)
                    batch.append(report)
            self._reports = later
            try:
                await self._write_batch(batch)
            except Exception as exc:  # Each report is retried on its own.
                log.warning("cannot write shard statuses together", extra={"error": str(exc)})
                for _, _, written in batch:
                    if not written.done():
                        written.set_result(False)

    async def _write_batch(
        self, batch: list[tuple[_LocalShard, cpb.ReplicaStatus, asyncio.Future[bool]]]
    ) -> None:
        """One transaction writing each report of `batch` that changes its assignment;
        each report's future says whether it is done with (False: retry it alone)."""
        compares: list[Compare] = []
        puts: list[Put] = []
        pending: list[asyncio.Future[bool]] = []
        for entry, status, written in batch:
            if written.done():
                continue  # The replica gave up waiting.
            kv = self.keyspace.get(entry.assignment.kv.key)
            value = None
            if kv is not None and not entry.stopped.is_set():
                value = _reduced(status, self.decoder.replica_status(kv))
            if kv is None or value is None:
                written.set_result(True)  # Gone, stopped, or already says as much.
                continue
            try:
                validate_replica_status(value)  # Never store what no one could decode.
            except Exception as exc:
                written.set_exception(exc)
                continue
            compares.append(Compare(kv.key, kv.mod_revision))
            puts.append(Put(kv.key, value.SerializeToString(deterministic=True), ignore_lease=True))
            pending.append(written)
        if not puts:
            return
        try:
            result = await self.keyspace.txn(compares, puts)
        except KeyspaceUnavailable as exc:
            log.warning("cannot report shard statuses (will retry)", extra={"error": str(exc)})
            result = None
        if result is not None and result.succeeded:
            self.status_txns += 1
            # Return once the mirror reflects the new statuses (as Gazette's does).
            with contextlib.suppress(TimeoutError):
                await self.keyspace.wait_for_revision(result.revision, REVISION_WAIT_SECONDS)
        for written in pending:
            if not written.done():
                written.set_result(result is not None and result.succeeded)

    async def _report_alone(self, entry: _LocalShard, status: cpb.ReplicaStatus) -> None:
        """Write one report in transactions of its own until it is done with."""
        backoff, max_backoff = _REPORT_BACKOFF_SECONDS
        while not entry.stopped.is_set():
            key = entry.assignment.kv.key
            kv = self.keyspace.get(key)
            if kv is None:
                return  # The assignment is gone: nothing to report on.
            current = self.decoder.replica_status(kv)
            value = _reduced(status, current)
            if value is None:
                return  # Already says as much.
            validate_replica_status(value)  # Never store what no one could decode.
            seen = self.keyspace.revision
            try:
                result = await self.keyspace.txn(
                    [Compare(key, kv.mod_revision)],
                    [Put(key, value.SerializeToString(deterministic=True), ignore_lease=True)],
                )
            except KeyspaceUnavailable as exc:
                log.warning(
                    "cannot report shard status (will retry)",
                    extra={"shard": entry.shard_id, "error": str(exc)},
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(entry.stopped.wait(), backoff)
                backoff = min(backoff * 2, max_backoff)
                continue
            if result.succeeded:
                # Return once the mirror reflects the new status (as Gazette's does).
                with contextlib.suppress(TimeoutError):
                    await self.keyspace.wait_for_revision(result.revision, REVISION_WAIT_SECONDS)
                return
            # The assignment changed under us: retry once the mirror has caught up.
            with contextlib.suppress(TimeoutError):
                await self.keyspace.wait_for_change(seen, backoff)
            backoff = min(backoff * 2, max_backoff)

    # Routes and headers.
    def endpoint_of(self, state: AllocatorState, zone: str, suffix: str) -> str:
        member = state.find_member(zone, suffix)
        if member is None:
            return ""  # An assignment of a missing member: no endpoint (as Gazette's).
        try:
            return self.decoder.consumer_spec(member.kv).process_spec.endpoint
        except KeyDecodeError:
            return ""

    def shard_assignments(self, state: AllocatorState, shard_id: str) -> list[Assignment]:
        """The shard's assignments whose status decodes (Gazette sees no others), key order."""
        return [
            a
            for a in state.assignments_of(shard_id)
            if self.decoder.replica_status(a.kv) is not None
        ]

    def shard_route(self, state: AllocatorState, assignments: list[Assignment]) -> pb.Route:
        """The route of assignments: members in key order, slot 0 primary, with endpoints."""
        route = pb.Route(primary=-1)
        for a in assignments:
            if a.slot == 0:
                route.primary = len(route.members)
            route.members.add(zone=a.zone, suffix=a.suffix)
        if route.members:
            route.endpoints.extend(self.endpoint_of(state, m.zone, m.suffix) for m in route.members)
        return route

    def header(self) -> pb.Header:
        """An unrouted header of this process at the mirror's current revision."""
        ident = self.keyspace.identity
        return pb.Header(
            process_id=self.local_id,
            route=pb.Route(primary=-1),
            etcd=pb.Header.Etcd(
                cluster_id=ident.cluster_id,
                member_id=ident.member_id,
                revision=self.keyspace.revision,
                raft_term=ident.raft_term,
            ),
        )

    def shard_spec(
        self, state: AllocatorState, shard_id: str
    ) -> tuple[cpb.ShardSpec, KeyValue] | None:
        item = state.item(shard_id)
        if item is None:
            return None
        kv = item.kv
        try:
            return self.decoder.shard_spec(kv), kv
        except KeyDecodeError:
            return None

    def shards_with_source(self, journal: str) -> list[cpb.ShardSpec]:
        """Specs of shards reading `journal`, in shard ID order (Gazette's ShardsWithSource)."""
        state = self.observed.current
        revision, index = self._sources
        if revision != state.revision:
            index = {}
            for item in state.items:
                try:
                    spec = self.decoder.shard_spec(item.kv)
                except KeyDecodeError:
                    continue
                for src in spec.sources:
                    index.setdefault(src.journal, []).append(spec)
            self._sources = (state.revision, index)
        return list(index.get(journal, []))

    # Resolution.
    async def resolve(
        self,
        shard_id: str,
        *,
        require_primary: bool = True,
        proxy: bool = True,
        min_revision: int = 0,
        proxy_header: pb.Header | None = None,
    ) -> Resolution:
        """Resolve `shard_id` to the process that serves it.

        With `require_primary`, the shard must have a primary (else NO_SHARD_PRIMARY), and
        unless `proxy` it must be this process (else NOT_SHARD_PRIMARY); when it is, the
        resolution carries the local replica. `proxy_header` is the header a peer resolved
        the request with: it must name this cluster (and this process), and resolution
        first waits for its revision, as for `min_revision`. Raises ResolveError.
        """
        local_id = self.local_id
        if not self.lease_alive():
            raise ResolveError("this consumer's etcd lease may have expired")
        await pass_request_fence(self.keyspace, local_id, min_revision, proxy_header)

        state = self.observed.current
        header = self.header()
        res = Resolution(cpb.OK, header, local_id)
        found = self.shard_spec(state, shard_id)
        if found is not None:
            res.spec, res.item = found
            res.assignments = self.shard_assignments(state, shard_id)
            header.route.CopyFrom(self.shard_route(state, res.assignments))
        route = header.route
        primary = route.members[route.primary] if route.primary >= 0 else None

        if res.spec is None:
            res.status = cpb.SHARD_NOT_FOUND
        elif require_primary and primary is None:
            res.status = cpb.NO_SHARD_PRIMARY
        elif (
            require_primary
            and not proxy
            and (primary is None or not same_process(primary, local_id))
        ):
            res.status = cpb.NOT_SHARD_PRIMARY
        if res.status == cpb.OK and primary is not None:
            header.process_id.CopyFrom(primary)  # Else: we author the response.

        if res.status == cpb.OK and primary is not None and same_process(primary, local_id):
            if not self.serving:
                raise ResolveError("this consumer is shutting down")
            entry = self._local.get(shard_id)
            if entry is None or entry.replica is None or entry.stopped.is_set():
                raise ResolveError(f"no local replica of shard {shard_id} (stopping?)")
            res.replica = entry.replica
            res.stopped = entry.stopped
        return res


def _reduced(
    status: cpb.ReplicaStatus, current: cpb.ReplicaStatus | None
) -> cpb.ReplicaStatus | None:
    """`status` reduced with the stored one (Gazette's ReplicaStatus.Reduce: the larger code
    wins, errors accumulate — each error once), or None when that changes nothing."""
    out = cpb.ReplicaStatus()
    out.CopyFrom(status)
    if current is None:
        return out
    if current.code > out.code:
        out.code = current.code
    for err in current.errors:
        if err not in out.errors:
            out.errors.append(err)
    if out.code == current.code and set(out.errors) == set(current.errors):
        return None
    return out
