"""The resolver: maps journal names to this broker's replicas, and builds response Headers.

In single-node mode this broker is the only member and the primary of every journal's route.
The resolver mirrors journal specs from the keyspace: on every keyspace change it starts
replicas for new journals, updates changed specs and stops deleted journals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from pygazette.auth.verified_claims import journal_permitted
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.metrics import forget_journal
from pygazette.broker.replica import Replica, spool_directory
from pygazette.keyspace.keyspace import Keyspace
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores.store import StoreRegistry

log = logging.getLogger(__name__)

# Where journal specs live in the keyspace, as Gazette lays them out in etcd.
JOURNALS_PREFIX = "/gazette/cluster/items/"


def journal_key(name: str) -> str:
    return JOURNALS_PREFIX + name


def _forget_series(name: str, _task: asyncio.Task[None]) -> None:
    forget_journal(name)


def _forget_stop(stops: dict[str, asyncio.Task[None]], name: str, task: asyncio.Task[None]) -> None:
    if stops.get(name) is task:
        del stops[name]


@dataclass(frozen=True, slots=True)
class BrokerIdentity:
    zone: str
    suffix: str
    endpoint: str

    def process_id(self) -> pb.ProcessSpec.ID:
        return pb.ProcessSpec.ID(zone=self.zone, suffix=self.suffix)


class Resolver:
    def __init__(
        self,
        keyspace: Keyspace,
        identity: BrokerIdentity,
        *,
        spool_root: Path,
        stores: StoreRegistry,
        persister: Persister,
        sync: bool,
    ) -> None:
        self.keyspace = keyspace
        self.identity = identity
        self.spool_root = spool_root
        self.stores = stores
        self.persister = persister
        self.sync = sync
        self.replicas: dict[str, Replica] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._stop_of: dict[str, asyncio.Task[None]] = {}  # Replicas still stopping.
        # Journals whose new replica waits for an old one to let go of its spool files.
        self._deferred: set[str] = set()
        self._closed = False
        self.serving = True  # False once the broker is shutting down (`stop_serving`).
        self._on_stop_serving: list[Callable[[], None]] = []

    def start(self) -> None:
        self.keyspace.add_listener(lambda _rev: self.sync_replicas())
        self.sync_replicas()

    def sync_replicas(self) -> None:
        """Bring replicas in line with the specs in the keyspace."""
        seen = set()
        for kv in self.keyspace.range(JOURNALS_PREFIX):
            spec = pb.JournalSpec()
            try:
                spec.ParseFromString(kv.value)
            except Exception:  # A foreign or corrupt value: skip it, don't crash.
                log.error("undecodable journal spec", extra={"key": kv.key})
                continue
            seen.add(spec.name)
            replica = self.replicas.get(spec.name)
            if replica is None:
                if not self._may_start(spec.name):
                    continue
                replica = Replica(
                    spec,
                    kv.mod_revision,
                    spool_root=self.spool_root,
                    stores=self.stores,
                    persister=self.persister,
                    sync=self.sync,
                )
                replica.is_journal = self.is_journal
                self.replicas[spec.name] = replica
                replica.start()
            elif replica.mod_revision != kv.mod_revision:
                replica.update_spec(spec, kv.mod_revision)
        for name in [n for n in self.replicas if n not in seen]:
            self._stop(name, self.replicas.pop(name))

    def _stop(self, name: str, replica: Replica) -> asyncio.Task[None]:
        """Stop a replica no longer served here, persisting its spools. The journal's kept
        registers go (and its spools, persisted now, keep none): they were the journal's as
        served here, and a journal of its name served here again (created again, or handed
        back after its route went on elsewhere) has its registers from elsewhere or none."""
        replica.keeps_registers = False
        replica.forget_kept_registers()
        task = asyncio.create_task(replica.stop(persist=True), name=f"stop:{name}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        # Its series go too, once an append still in flight is done (before a new replica
        # of it starts here: that waits for this task, with a callback added after this one).
        task.add_done_callback(partial(_forget_series, name))
        self._stop_of[name] = task
        task.add_done_callback(partial(_forget_stop, self._stop_of, name))
        return task

    def _may_start(self, name: str) -> bool:
        """Whether a new replica of `name` may start now (else it starts once it may).

        It recovers the spools in the journal's spool directory and goes on appending to
        the newest, as a restart does; an old replica's spools are those same files, which
        its stop and its persister jobs write, and persisting removes (into `spool_files`'
        pool, emptied for a next spool): shared, an acknowledged append to the new replica
        could be emptied, and its reads see other bytes. So it waits for the old replica's
        stop to end, then has the persister let go of the old spools (`Persister.release`:
        after an attempt in progress, if there is one), and starts without them."""
        if name in self._deferred:
            return False
        wait: asyncio.Future[None] | None = self._stop_of.get(name)
        if wait is None:
            wait = self.persister.release(name, spool_directory(self.spool_root, name))
            if wait is None:
                return True
        log.info("new journal replica waits for the old one's spools", extra={"journal": name})
        self._deferred.add(name)
        wait.add_done_callback(partial(self._start_deferred, name))
        return False

    def _start_deferred(self, name: str, _done: asyncio.Future[None]) -> None:
        self._deferred.discard(name)
        if not self._closed:
            self._sync_one(name)

    def _sync_one(self, name: str) -> None:
        """Bring `name`'s replica in line with the keyspace (single-node: all journals')."""
        self.sync_replicas()

    def stop_serving(self) -> None:
        """The broker is shutting down: whoever waits on a replica without holding it (an
        append waiting for the journal's first store listing, a blocking read at the head)
        ends now, rather than hold the shutdown up for its whole grace period."""
        self.serving = False
        for replica in self.replicas.values():
            replica.invalidate()
        callbacks, self._on_stop_serving = self._on_stop_serving, []
        for callback in callbacks:
            callback()

    def when_serving_stops(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the broker begins shutting down (`stop_serving`): for waits
        on things other than a replica (a read proxied to a peer)."""
        if self.serving:
            self._on_stop_serving.append(callback)
        else:
            callback()

    async def stop(self) -> None:
        self.stop_serving()
        self._closed = True
        replicas = list(self.replicas.values())
        self.replicas.clear()
        for replica in replicas:
            await replica.stop(persist=True)

    def is_journal(self, name: str) -> bool:
        """Whether a journal of that name exists (whether or not it is served here)."""
        return name in self.replicas

    def resolve(self, journal: str) -> Replica | None:
        """The journal's replica; None if there is none, or if the claims of the RPC being
        served don't reach it (then it answers as if the journal doesn't exist). A `;meta`
        suffix of the name is dropped: it doesn't change what the name resolves to (as
        Gazette's resolver, `Journal.StripMeta`)."""
        replica = self.replicas.get(journal.split(";", 1)[0])
        if replica is not None and not journal_permitted(replica.spec):
            return None
        return replica

    def route(self) -> pb.Route:
        return pb.Route(
            members=[self.identity.process_id()],
            primary=0,
            endpoints=[self.identity.endpoint],
        )

    def header(self, *, routed: bool = True) -> pb.Header:
        ident = self.keyspace.identity
        return pb.Header(
            process_id=self.identity.process_id(),
            route=self.route() if routed else pb.Route(primary=-1),
            etcd=pb.Header.Etcd(
                cluster_id=ident.cluster_id,
                member_id=ident.member_id,
                revision=self.keyspace.revision,
                raft_term=ident.raft_term,
            ),
        )
