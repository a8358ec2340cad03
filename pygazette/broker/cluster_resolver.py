"""The cluster resolver: journal → route, and whether this broker serves or proxies.

It extends the single-node resolver for brokers on etcd. Routes come from the journal's
assignments (members in key order, the slot-0 member primary, endpoints from the members'
BrokerSpecs). On every keyspace change it brings local replicas in line with this broker's
assignments: new ones start, changed ones are told (and wake whoever waits on them), ones no
longer assigned stop and persist.

`resolve_journal` answers for one request, after waiting for the keyspace to reach any
revision the request (or a proxying peer's header) requires, with Gazette's statuses:
JOURNAL_NOT_FOUND, SUSPENDED, NO_JOURNAL_PRIMARY_BROKER (a primary is required and there is
none), INSUFFICIENT_JOURNAL_BROKERS (no broker is assigned), and NOT_JOURNAL_BROKER /
NOT_JOURNAL_PRIMARY_BROKER when the request may not be proxied and this broker can't serve
it. The resolution's header names the broker that serves: this one, or the peer to proxy to.

Reads are served by the primary (a non-primary proxies them there), which keeps the write
head readers see from ever moving backwards: a primary shows only content every replica has
confirmed (see `replicated_spool`), and a newly promoted primary starts from a frontier at
least as far. Replicas may be a round apart, so they serve reads only when asked directly
(`do_not_proxy`); a read of a journal that has members but no primary waits for one
(`journal_service`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from pygazette.allocator.allocator import ObservedState
from pygazette.allocator.request_fence import ResolveError, pass_request_fence, same_process
from pygazette.allocator.state import AllocatorState, Assignment, LocalItem, Member
from pygazette.auth.verified_claims import journal_permitted
from pygazette.broker.allocation import JournalDecoder, route_of
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.replica import Replica
from pygazette.broker.resolver import BrokerIdentity, Resolver
from pygazette.keyspace.keyspace import Keyspace, KeyValue
from pygazette.keyspace.layout import KeyDecodeError, KeyLayout, decode_broker_spec
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores.store import StoreRegistry

log = logging.getLogger(__name__)

# How soon a journal whose local replica failed to start is tried again.
RETRY_SECONDS = 1.0


@dataclass(slots=True)
class Resolution:
    status: pb.Status
    header: pb.Header
    local_id: pb.ProcessSpec.ID
    spec: pb.JournalSpec | None = None
    item: KeyValue | None = None
    assignments: list[Assignment] = field(default_factory=list)
    replica: Replica | None = None
    invalidated: asyncio.Event | None = None
    named: bool = False  # A peer's proxy header named this broker to serve the request.

    @property
    def local(self) -> bool:
        pid = self.header.process_id
        return pid.zone == self.local_id.zone and pid.suffix == self.local_id.suffix

    @property
    def route(self) -> pb.Route:
        return self.header.route


async def _settle(tasks: list[asyncio.Task[None]]) -> None:
    """Wait for tasks to end, however they end (a failure is logged, not raised)."""
    if not tasks:
        return
    await asyncio.wait(tasks)  # Our own cancellation still propagates.
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "task failed", extra={"task": task.get_name(), "error": str(task.exception())}
            )


def _discard(names: set[str], name: str, _task: asyncio.Task[None]) -> None:
    names.discard(name)


class ClusterResolver(Resolver):
    def __init__(
        self,
        keyspace: Keyspace,
        identity: BrokerIdentity,
        *,
        layout: KeyLayout,
        observed: ObservedState,
        decoder: JournalDecoder,
        spool_root: Path,
        stores: StoreRegistry,
        persister: Persister,
        sync: bool,
    ) -> None:
        super().__init__(
            keyspace,
            identity,
            spool_root=spool_root,
            stores=stores,
            persister=persister,
            sync=sync,
        )
        self.layout = layout
        self.observed = observed
        self.decoder = decoder
        self._endpoints: dict[tuple[str, int], str] = {}
        self._member_keys: dict[tuple[str, str], str] = {}  # (zone, suffix) -> member key.
        # journal -> (its assignments, the members, its route): see journal_route.
        self._routes: dict[str, tuple[list[Assignment], list[Member], pb.Route]] = {}
        # Called with each replica whose assignments changed while this broker is its
        # primary (asks for a pulse: see `pulser`; nothing runs per replica).
        self.on_primary: Callable[[Replica], None] | None = None
        # Called with the name of each journal whose replica this broker stops.
        self.on_stopped: Callable[[str], None] | None = None
        # Whether this broker's etcd lease is surely alive. When it may not be (the broker
        # was frozen, or cut off from etcd), its view of the cluster can't be trusted: it
        # resolves nothing until it knows again.
        self.lease_alive: Callable[[], bool] = lambda: True
        # Journals whose spool directory is still theirs here though no replica of them is
        # registered: replicas still stopping, new ones waiting for them, and ones that
        # failed to start (retried). Not orphans: the orphan sweep leaves their spools.
        self.stopping_journals: set[str] = set()
        self._touched = observed.touched_items()
        # Journals whose replica failed to start (synced again after RETRY_SECONDS).
        self._failed: set[str] = set()
        self._retry: asyncio.TimerHandle | None = None

    # Replicas.
    def start(self) -> None:
        self.keyspace.add_listener(lambda _rev: self.sync_replicas())
        self.sync_replicas()

    def sync_replicas(self) -> None:
        """Bring local replicas in line with the local assignments of the items that
        changed since the last sync (all of them, at first)."""
        if not self.serving:
            return
        state = self.observed.current
        touched = self._touched.take()
        if touched is None:
            names: Iterable[str] = set(state.local) | set(self.replicas)
        else:
            names = touched
        failed, self._failed = self._failed, set()
        for name in {*names, *failed}:
            local = state.local.get(name)
            if local is None:
                if name in self.replicas:
                    self._stop_replica(name)
                elif name in failed:
                    self._given_up(name)
                continue
            self._sync_guarded(name, local[0], retry=name in failed)

    def _sync_guarded(self, name: str, li: LocalItem, *, retry: bool = False) -> None:
        """`_sync_replica`, where a replica that fails to start (its spools can't be read)
        is tried again later, and the journals synced with it are synced all the same."""
        try:
            self._sync_replica(name, li)
        except Exception as exc:
            log.log(
                logging.DEBUG if retry else logging.ERROR,  # Logged once, not every retry.
                "cannot start local journal replica (will retry)",
                extra={"journal": name, "error": str(exc)},
            )
            self._failed.add(name)
            # Its spools are the replica's to come, not an orphan's to move aside.
            self.stopping_journals.add(name)
            if self._retry is None:
                self._retry = asyncio.get_running_loop().call_later(
                    RETRY_SECONDS, self._retry_failed
                )
            return
        if retry and name not in self._deferred:
            self.stopping_journals.discard(name)  # Started (or its spec doesn't decode).

    def _given_up(self, name: str) -> None:
        """A journal whose replica failed to start is no longer assigned here (deleted, or
        moved to other brokers): not retried, its spools are an orphan's now."""
        self.stopping_journals.discard(name)
        if self.on_stopped is not None:
            self.on_stopped(name)

    def _retry_failed(self) -> None:
        self._retry = None
        self.sync_replicas()

    def _sync_replica(self, name: str, li: LocalItem) -> None:
        try:
            spec = self.decoder.journal_spec(li.item.kv)
        except KeyDecodeError as exc:
            log.error("undecodable journal spec", extra={"journal": name, "error": str(exc)})
            if name in self.replicas:
                self._stop_replica(name)
            return
        primary = li.assignment.slot == 0
        replica = self.replicas.get(name)
        if replica is None:
            if not self._may_start(name):
                return
            replica = Replica(
                spec,
                li.item.kv.mod_revision,
                spool_root=self.spool_root,
                stores=self.stores,
                persister=self.persister,
                sync=self.sync,
            )
            replica.is_journal = self.is_journal
            replica.start_clustered()  # Registered once started (it may fail: retried).
            self.replicas[name] = replica
            log.info("starting local journal replica", extra={"journal": name, "primary": primary})
        elif replica.mod_revision != li.item.kv.mod_revision:
            replica.update_spec(spec, li.item.kv.mod_revision)
            replica.invalidate()
        was_primary = replica.primary
        if replica.set_assignments(primary, li.assignments):
            if primary:
                self._start_primary(replica)
            elif was_primary:
                self._demote(replica)

    def _stop_replica(self, name: str) -> None:
        replica = self.replicas.pop(name)
        replica.stopping = True
        replica.invalidate()
        log.info("stopping local journal replica", extra={"journal": name})
        self.stopping_journals.add(name)
        task = self._stop(name, replica)
        task.add_done_callback(partial(_discard, self.stopping_journals, name))
        if self.on_stopped is not None:
            self.on_stopped(name)

    def _may_start(self, name: str) -> bool:
        if super()._may_start(name):
            return True
        # Not an orphan to sweep meanwhile: its spools are the new replica's.
        self.stopping_journals.add(name)
        return False

    def _sync_one(self, name: str) -> None:
        self.stopping_journals.discard(name)
        if not self.serving or name in self.replicas:
            return
        local = self.observed.current.local.get(name)
        if local is not None:
            self._sync_guarded(name, local[0])

    def _start_primary(self, replica: Replica) -> None:
        if self.on_primary is not None:
            self.on_primary(replica)

    def _demote(self, replica: Replica) -> None:
        """No longer primary: close the pipeline, freeing the spool for the new primary."""

        async def demote() -> None:
            async with replica.pipeline:
                if not replica.primary:
                    await replica.close_replication()

        task = asyncio.create_task(demote(), name=f"demote:{replica.name}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def stop_serving(self) -> None:
        """Stop every local replica now and refuse to resolve to any (shutting down)."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        for replica in self.replicas.values():
            replica.stopping = True
        super().stop_serving()

    async def stop(self) -> None:
        self.stop_serving()
        await super().stop()
        await _settle(list(self._stopping))

    # Headers and routes.
    @property
    def local_id(self) -> pb.ProcessSpec.ID:
        return self.identity.process_id()

    def header(self, *, routed: bool = True) -> pb.Header:
        """A header of this broker (without a journal's route)."""
        hdr = super().header(routed=False)
        return hdr

    def endpoint_of(self, zone: str, suffix: str) -> str:
        key = self._member_keys.get((zone, suffix))
        if key is None:
            key = self.layout.member_key(zone, suffix)  # Checks the parts: once per member.
            if len(self._member_keys) >= 4096:
                self._member_keys.clear()
            self._member_keys[(zone, suffix)] = key
        kv = self.keyspace.get(key)
        if kv is None:
            return ""
        cached = self._endpoints.get((kv.key, kv.mod_revision))
        if cached is None:
            try:
                cached = decode_broker_spec(self.layout, kv).process_spec.endpoint
            except KeyDecodeError:
                cached = ""
            self._endpoints[(kv.key, kv.mod_revision)] = cached
        return cached

    def is_journal(self, name: str) -> bool:
        return self.observed.current.item(name) is not None

    def journal_route(self, state: AllocatorState, journal: str) -> pb.Route:
        """The journal's route in `state`, with its members' endpoints.

        Shared, not copied: copy it before changing it. A route is remembered per journal
        until the journal's assignments or the members change (a state shares both with the
        one before while they don't), so a List of every journal builds only what changed.
        """
        assignments = state.assignments_of(journal)
        hit = self._routes.get(journal)
        if hit is not None and hit[0] is assignments and hit[1] is state.members:
            return hit[2]
        route = route_of(assignments)
        route.endpoints.extend(self.endpoint_of(m.zone, m.suffix) for m in route.members)
        if assignments:
            if len(self._routes) > 2 * len(state.item_map) + 1024:
                self._routes.clear()  # Drop deleted journals' routes now and then.
            self._routes[journal] = (assignments, state.members, route)
        return route

    # Resolution.
    async def resolve_journal(
        self,
        journal: str,
        *,
        require_primary: bool,
        may_proxy: bool,
        prefer_primary: bool = False,
        min_revision: int = 0,
        proxy_header: pb.Header | None = None,
    ) -> Resolution:
        # A `;meta` suffix doesn't change what the name resolves to (Gazette's StripMeta).
        journal = journal.split(";", 1)[0]
        local_id = self.local_id
        if not self.lease_alive():
            raise ResolveError("this broker's etcd lease may have expired")
        await pass_request_fence(self.keyspace, local_id, min_revision, proxy_header)

        state = self.observed.current
        header = super().header(routed=False)
        res = Resolution(pb.OK, header, local_id)
        item = self.keyspace.get(self.layout.item_key(journal)) if "#" not in journal else None
        if item is not None:
            try:
                res.spec = self.decoder.journal_spec(item)
                res.item = item
            except KeyDecodeError:
                res.spec = None
        if res.spec is not None and not journal_permitted(res.spec):
            # The caller's claims don't reach it: act as if it doesn't exist (as Gazette).
            res.spec, res.item = None, None
        if res.spec is not None:
            res.assignments = list(state.assignments_of(journal))
            header.route.CopyFrom(self.journal_route(state, journal))
        route = header.route
        members = list(route.members)

        target: pb.ProcessSpec.ID | None = None
        is_member = any(same_process(m, local_id) for m in members)
        res.named = (
            proxy_header is not None
            and bool(proxy_header.process_id.zone or proxy_header.process_id.suffix)
            and is_member
        )
        if res.named and not require_primary:
            target = local_id  # A peer picked this member to serve it.
        elif require_primary:
            if route.primary >= 0:
                target = members[route.primary]
        elif prefer_primary and route.primary >= 0 and (may_proxy or is_member):
            target = members[route.primary] if may_proxy else local_id
        elif is_member:
            target = local_id
        elif members:
            same_zone = [m for m in members if m.zone == local_id.zone]
            target = (same_zone or members)[0]

        if res.spec is None:
            res.status = pb.JOURNAL_NOT_FOUND
        elif res.spec.HasField("suspend") and res.spec.suspend.level == pb.JournalSpec.Suspend.FULL:
            res.status = pb.SUSPENDED
        elif require_primary and route.primary < 0:
            res.status = pb.NO_JOURNAL_PRIMARY_BROKER
        elif not members:
            res.status = pb.INSUFFICIENT_JOURNAL_BROKERS
        elif target is None or (not may_proxy and not same_process(target, local_id)):
            res.status = pb.NOT_JOURNAL_PRIMARY_BROKER if require_primary else pb.NOT_JOURNAL_BROKER
        if res.status != pb.OK or target is None:
            header.process_id.CopyFrom(local_id)
        else:
            header.process_id.CopyFrom(target)

        if res.status == pb.OK and res.local:
            if not self.serving:
                raise ResolveError("this broker is shutting down")
            replica = self.replicas.get(journal)
            if replica is None or replica.stopping:
                raise ResolveError(f"no local replica of {journal} (shutting down?)")
            res.replica = replica
            res.invalidated = replica.invalidated
        return res
