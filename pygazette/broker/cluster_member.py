"""This broker as a member of a cluster on etcd: joining, serving, draining and leaving.

Joining: mirror the keyspace under the etcd prefix, announce a BrokerSpec under a lease
(`/gazette/cluster/members/<zone>#<id>`), then serve the journals the allocator assigns
here while taking part in allocation (the oldest member leads).

Leaving gracefully (SIGTERM): mark the BrokerSpec `exiting`, so the allocator moves this
broker's journals elsewhere; wait until none are left, or until it is clear none can move
(e.g. three brokers serving journals of replication three), or a drain timeout; then stop
replicas (their pipelines confirm what they can, their spools persist) and revoke the lease,
so peers take over at once instead of after the lease TTL.

Failing: if the lease can't be kept alive (etcd unreachable for a TTL, or the process was
frozen past it), or the member key disappears, the broker stops serving immediately — it
may no longer hold any journal — and exits with an error for its supervisor to restart it.
A lease that may still be alive (the key deleted by hand) is revoked as it leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from pygazette.allocator.allocator import Allocator, ObservedState
from pygazette.allocator.session import MemberSession, mark_exiting, membership_ended
from pygazette.auth.authorizer import Authorizer
from pygazette.auth.tls import ClientTLS
from pygazette.broker.allocation import JournalDecoder, assignments_advertise, route_of
from pygazette.broker.append_fsm import ClusterAppends
from pygazette.broker.append_service import AppendLimits
from pygazette.broker.cluster_resolver import ClusterResolver
from pygazette.broker.fragment import kept_registers
from pygazette.broker.fragment.frontier_log import FILE_NAME as FRONTIER_FILE
from pygazette.broker.fragment.frontier_log import LEGACY_FILE, FrontierLog
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.fragment.spool import fsync_dir, spool_log_journal
from pygazette.broker.journal_runtime import JournalRuntime
from pygazette.broker.journal_service import ClusterServices
from pygazette.broker.peers import Peers
from pygazette.broker.pulser import Pulser
from pygazette.broker.replica import (
    Replica,
    adopt_quoted_directory,
    spool_directory,
    spool_directory_name,
)
from pygazette.broker.resolver import BrokerIdentity
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.layout import KeyDecodeError, KeyLayout
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.path_name import MAX_QUOTED
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_journal_name
from pygazette.stores.store import StoreRegistry

log = logging.getLogger(__name__)

ORPHAN_SWEEP_SECONDS = 10.0
# Where orphaned spools are moved to be persisted, `<spool root>/<ASIDE_DIR>/<journal
# directory>-<ns>`: no journal's spool directory ("#" is in no journal name). Earlier versions
# used LEGACY_ASIDE_DIR, a valid journal name.
ASIDE_DIR = ".#orphaned"
LEGACY_ASIDE_DIR = ".orphaned"


@dataclass(slots=True)
class ClusterConfig:
    etcd_url: str
    etcd_prefix: str
    lease_ttl: float
    journal_limit: int
    drain_timeout: float
    peer_tls: ClientTLS | None = None  # Towards `https://` peers.
    etcd_tls: ClientTLS | None = None  # Towards an `https://` etcd.
    peer_auth: Authorizer | None = None  # Signs RPCs to peers (proxying, Replicate).
    auto_suspend: bool = False  # Suspend journals left idle (`pulser`).


class MemberFailed(Exception):
    """The broker can no longer act as a cluster member."""


class ClusterMember:
    def __init__(
        self,
        config: ClusterConfig,
        *,
        identity: BrokerIdentity,
        spool_root: Path,
        stores: StoreRegistry,
        persister: Persister,
        limits: AppendLimits,
        sync: bool,
    ) -> None:
        self.config = config
        self.identity = identity
        self.spool_root = spool_root
        # The confirmed frontiers of its journals (`Replica.frontiers`: the same log).
        self.frontiers = FrontierLog.at(spool_root)
        self.stores = stores
        self.persister = persister
        self.limits = limits
        self.sync = sync
        self.spec = pb.BrokerSpec(journal_limit=config.journal_limit)
        self.spec.process_spec.id.zone = identity.zone
        self.spec.process_spec.id.suffix = identity.suffix
        self.spec.process_spec.endpoint = identity.endpoint
        self._tasks: list[asyncio.Task[None]] = []
        self._allocator_task: asyncio.Task[None] | None = None
        # Journals whose spool directory may hold orphaned spools (see `_sweep_orphans`):
        # None until the first sweep lists the spool root once.
        self._orphan_candidates: set[str] | None = None
        # Directories under ASIDE_DIR whose spools this run is persisting.
        self._aside_in_progress: set[Path] = set()

    async def open(self) -> None:
        """Connect to etcd and build this member's services (nothing is announced yet)."""
        cfg = self.config
        self.layout = KeyLayout(cfg.etcd_prefix)
        self.member_key = self.layout.member_key(self.identity.zone, self.identity.suffix)
        self.keyspace = EtcdKeyspace(cfg.etcd_url, cfg.etcd_prefix, tls=cfg.etcd_tls)
        await self.keyspace.open()
        self.decoder = JournalDecoder(self.layout)
        # The allocator state must be re-extracted before the resolver reads it: register first.
        self.observed = ObservedState(self.keyspace, self.layout, self.decoder, self.member_key)
        self.resolver = ClusterResolver(
            self.keyspace,
            self.identity,
            layout=self.layout,
            observed=self.observed,
            decoder=self.decoder,
            spool_root=self.spool_root,
            stores=self.stores,
            persister=self.persister,
            sync=self.sync,
        )
        self.session = MemberSession(
            self.keyspace, self.member_key, self.spec.SerializeToString(), cfg.lease_ttl
        )
        self.peers = Peers(tls=cfg.peer_tls, auth=cfg.peer_auth)
        self.appends = ClusterAppends(self.resolver, self.peers, self.limits, self.session)
        self.pulser = Pulser(
            self.appends.pulse,
            suspend=self.appends.suspend_if_idle if cfg.auto_suspend else None,
        )
        self.resolver.on_primary = self.pulser.request
        self.appends.on_advertise_failed = self._advertise_failed
        self.resolver.on_stopped = self._replica_stopped
        self.appends.on_pipeline_open = self._pipeline_opened
        self.resolver.lease_alive = self.session.lease_alive
        self.services = ClusterServices(self.resolver, self.appends, self.peers)

    @property
    def orphan_candidates(self) -> frozenset[str]:
        """Journals the next orphan sweep looks at (after the first sweep)."""
        return frozenset(self._orphan_candidates or ())

    def _replica_stopped(self, name: str) -> None:
        if self._orphan_candidates is not None:
            self._orphan_candidates.add(name)

    def _pipeline_opened(self, journal: JournalRuntime) -> None:
        replica = self.resolver.replicas.get(journal.name)
        if replica is journal:
            self.pulser.opened(replica)

    def _advertise_failed(self, journal: JournalRuntime) -> None:
        replica = self.resolver.replicas.get(journal.name)
        if replica is journal:
            self.pulser.retry(replica)

    async def join(self) -> None:
        """Announce this broker and start serving assignments and allocating."""
        await self.session.start()
        self.pulser.start()
        self.resolver.start()
        self.allocator = Allocator(self.keyspace, self.observed)
        self._allocator_task = asyncio.create_task(self.allocator.run(), name="allocator")
        self._tasks.append(asyncio.create_task(self._sweep_orphans(), name="orphan-sweeper"))
        log.info(
            "joined cluster",
            extra={
                "member": self.member_key,
                "etcd": self.config.etcd_url,
                "lease": self.session.lease,
            },
        )

    async def ended(self) -> str:
        """Return why the member stopped on its own ("drained"), or raise MemberFailed."""
        assert self._allocator_task is not None
        failure = await membership_ended(self.session.lost, self._allocator_task)
        if failure is not None:
            raise MemberFailed(failure)
        return "drained"

    async def drain(self) -> None:
        """Mark this broker exiting, and wait for its journals to move (or not be movable)."""
        if self.session.lost.is_set():
            return
        spec = pb.BrokerSpec()
        spec.CopyFrom(self.spec)
        spec.exiting = True
        deadline = time.monotonic() + self.config.drain_timeout
        if not await mark_exiting(self.session, spec.SerializeToString(), deadline, "broker"):
            return
        while time.monotonic() < deadline:
            state = self.observed.current
            if state.local_member < 0 or not state.local_items:
                log.info("drained every journal")
                return
            if state.shed_capacity[state.local_member] == 0:
                log.info(
                    "no capacity elsewhere for this broker's journals; leaving them",
                    extra={"journals": len(state.local_items)},
                )
                return
            with contextlib.suppress(TimeoutError):
                await self.keyspace.wait_for_change(
                    self.keyspace.revision, deadline - time.monotonic()
                )
        log.warning("drain timed out", extra={"journals": len(self.observed.current.local_items)})

    def stop_serving(self) -> None:
        self.resolver.stop_serving()

    async def leave(self, *, graceful: bool) -> None:
        """Stop replicas and allocation, then give up membership (revoking the lease).
        `graceful`: the member drained (else its membership failed)."""
        self.resolver.stop_serving()
        tasks = [t for t in [*self._tasks, self._allocator_task] if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)  # Our own cancellation still propagates.
            for task in tasks:
                if not task.cancelled():
                    task.exception()  # Retrieved: its failure was reported where it ended.
        await self.pulser.stop()
        await self.appends.stop()
        await self.resolver.stop()
        log.info("replicas stopped; leaving the cluster", extra={"graceful": graceful})
        # The lease is revoked whenever it may still be alive, a failed member's too (its key
        # deleted by hand): its assignments go with it at once, as Gazette's session closes
        # its lease when its tasks end, instead of blocking its journals until it lapses. A
        # lease known lost is left alone (`MemberSession.close`).
        await self.session.close(revoke=True)
        await self.peers.close()
        await self.keyspace.close()
        log.info("left the cluster")

    # Orphaned spools.
    async def _sweep_orphans(self) -> None:
        """Persist spools of journals this broker no longer serves, once they're settled.

        A restarted broker keeps its spools (they are crash-safe), in case it is assigned
        the journal again (or the whole cluster restarted and its copy matters). Once the
        journal is consistent without this broker, its spools are done with: they're
        moved aside, cut to their confirmed frontier, and persisted if the store lacks them.

        The spool root is listed once (after a start, what an earlier run left); later
        sweeps look only at journals this broker stopped serving since, and at those not
        settled yet: their cost doesn't grow with the journals a broker ever held.
        """
        while True:
            await asyncio.sleep(ORPHAN_SWEEP_SECONDS)
            try:
                self.sweep_orphans_once()
            except Exception as exc:
                log.warning("orphaned spool sweep failed", extra={"error": str(exc)})

    def sweep_orphans_once(self) -> None:
        if not self.spool_root.is_dir():
            return
        aside_root = self.spool_root / ASIDE_DIR
        first = self._orphan_candidates is None
        if first:
            _adopt_legacy_aside(self.spool_root, aside_root)
        left: list[Path] = []
        if aside_root.is_dir():
            for aside in sorted(aside_root.iterdir()):
                if not aside.is_dir():
                    continue
                if not any(aside.glob("*.log")):
                    shutil.rmtree(aside, ignore_errors=True)  # Persisted.
                    self._aside_in_progress.discard(aside)
                elif aside not in self._aside_in_progress:
                    left.append(aside)  # An earlier run's, stopped before it persisted them.
        if first:
            self._orphan_candidates = _journal_directories(self)
        for aside in left:
            _persist_left_aside(self, aside)
        candidates = self._orphan_candidates
        assert candidates is not None
        state = self.observed.current
        for name in sorted(candidates):
            if name in self.resolver.stopping_journals:
                continue  # Looked at again once it stopped.
            candidates.discard(name)
            if name in self.resolver.replicas:
                continue  # Served: its spools are its replica's (it is a candidate again
                # when it stops).
            directory = spool_directory(self.spool_root, name)
            if self.persister.persisting(name, directory):
                # A stopped replica's spools still wait to persist, read and removed there by
                # their jobs (a store outage): looked at again next sweep.
                candidates.add(name)
                continue
            if not directory.is_dir() or not any(directory.iterdir()):
                # No spools (and none will come: not served here): its frontier is of no
                # more use, and a journal of that name served here later starts afresh.
                self.frontiers.forget(name)
                kept_registers.forget(kept_registers.path_of(self.spool_root, directory.name))
                # Nor its directory (forgotten first: a directory left is swept again).
                with contextlib.suppress(OSError):
                    directory.rmdir()
                continue
            foreign = _foreign_files(directory)
            if foreign:
                # Not only spools (a directory someone else keeps in the spool root): left
                # alone, never moved aside and removed as a deleted journal's.
                log.warning(
                    "not sweeping a spool directory holding other files",
                    extra={"path": str(directory), "files": foreign[:5]},
                )
                continue
            current = _current_spec(self, name)
            if current is None:
                candidates.add(name)  # Its spools stay until its spec reads again.
                continue
            item, spec = current
            if item is not None:
                group = state.assignments_of(name)
                if not group or not assignments_advertise(route_of(group), group):
                    candidates.add(name)  # Not settled yet: this broker may be needed for
                    continue  # recovery. Looked at again next sweep.
            # The stopped replica's spools kept here for want of a store hold their files
            # open: let go of them, as they are moved aside (and dropped, or persisted from
            # there). Kept, a deleted journal's spools held two descriptors each, and their
            # disk space, for as long as the broker ran.
            if self.persister.release(name, directory) is not None:
                candidates.add(name)  # Being persisted: looked at again next sweep.
                continue
            aside = aside_root / f"{directory.name}-{time.time_ns()}"
            aside.parent.mkdir(parents=True, exist_ok=True)
            directory.rename(aside)
            if self.sync:
                # Moved for good before the journal's frontier may be forgotten (a power
                # loss must not bring the spools back in place without it).
                fsync_dir(self.spool_root)
                fsync_dir(aside_root)
            if spec is None:
                log.info("dropping spools of a deleted journal", extra={"journal": name})
                shutil.rmtree(aside, ignore_errors=True)
                self.frontiers.forget(name)
                kept_registers.forget(kept_registers.path_of(self.spool_root, directory.name))
                continue
            log.info("persisting orphaned spools", extra={"journal": name})
            assert item is not None
            _persist_aside(self, spec, item.mod_revision, aside)


def _journal_directories(member: ClusterMember) -> set[str]:
    """The journals the spool root holds directories of, in one listing. A directory an
    earlier version kept under a long name's whole quoted name is moved to the journal's
    spool directory first (`replica.adopt_quoted_directory`; a served journal's replica moved
    its own), to be swept from there, not left unread."""
    names: set[str] = set()
    moved = False
    for d in member.spool_root.iterdir():
        if not d.is_dir():
            continue
        name = _journal_of_directory(d, d.name)
        if name is None and len(d.name) > MAX_QUOTED and "~" not in d.name:
            quoted_name = unquote(d.name)
            if (
                quoted_name not in member.resolver.replicas
                and _is_journal_name(quoted_name)
                and adopt_quoted_directory(member.spool_root, quoted_name)
            ):
                moved, name = True, quoted_name
        if name is not None:
            names.add(name)
    if moved and member.sync:
        fsync_dir(member.spool_root)
    return names


def _current_spec(member: ClusterMember, name: str) -> tuple[Any, pb.JournalSpec | None] | None:
    """The journal's keyspace item and spec, both None if it was deleted; None if its spec
    does not decode (no deleted journal: its spools are neither dropped nor persisted)."""
    item = member.keyspace.get(member.layout.item_key(name)) if "#" not in name else None
    if item is None:
        return None, None
    try:
        return item, member.decoder.journal_spec(item)
    except KeyDecodeError as exc:
        log.warning(
            "spools of a journal whose spec does not decode stay",
            extra={"journal": name, "error": str(exc)},
        )
        return None


def _persist_aside(
    member: ClusterMember, spec: pb.JournalSpec, mod_revision: int, aside: Path
) -> None:
    """Persist the spools moved to `aside` (a journal's, that this broker does not serve).

    They are cut to the journal's confirmed frontier as it was when they were moved: a copy
    is kept beside them, in a frontier log of their own, taken from the broker's before it
    may be forgotten. The broker's may move on meanwhile: the journal may be served here
    again (an earlier run's leftover), and its live spools' frontier is no measure of these.
    """
    member._aside_in_progress.add(aside)
    frontiers = FrontierLog(aside / FRONTIER_FILE)
    frontiers.sync = member.sync
    if frontiers.get(spec.name) is None:
        moved_at = member.frontiers.get(spec.name)  # A leftover without its copy: the
        if moved_at is not None:  # broker's, which is then all there is to go by.
            frontiers.set(spec.name, moved_at)
    orphan = Replica(
        spec,
        mod_revision,
        spool_root=aside.parent,
        stores=member.stores,
        persister=member.persister,
        sync=member.sync,
        frontiers=frontiers,
    )
    orphan.spool_dir = aside
    orphan.keeps_registers = False  # Not served here: its registers are its route's business.
    # Closed spools too are cut to the confirmed frontier (content in doubt beyond it:
    # `Replica.recover_spools`), as on a restart: the route went on without us.
    orphan.recover_replicated()
    assert orphan.rspool is not None
    orphan.rspool.complete(primary=False)
    frontiers.close()
    own = spool_directory(member.spool_root, spec.name)
    if spec.name not in member.resolver.replicas and not (own.is_dir() and any(own.iterdir())):
        # A journal of its name served here starts afresh. Not while the journal's own spools
        # (a leftover's journal served here since, or stopping) may hold content beyond it.
        member.frontiers.forget(spec.name)


def _persist_left_aside(member: ClusterMember, aside: Path) -> None:
    """Persist what an earlier run moved to `aside` and stopped before it persisted: the
    spools were cut to their confirmed frontier before any was handed to the persister, so
    what is left is persisted whole (the frontier, if still recorded, says so too)."""
    dirname, _, stamp = aside.name.rpartition("-")
    name = _journal_of_directory(aside, dirname)
    if name is None or not stamp.isdigit():
        log.warning("not a directory of orphaned spools", extra={"path": str(aside)})
        member._aside_in_progress.add(aside)  # Left alone, and not looked at again.
        return
    current = _current_spec(member, name)
    if current is None:
        member._aside_in_progress.add(aside)  # Looked at again by the next run.
        return
    item, spec = current
    if item is None or spec is None:
        log.info("dropping spools of a deleted journal", extra={"journal": name})
        shutil.rmtree(aside, ignore_errors=True)
        return
    log.info("persisting orphaned spools an earlier run left", extra={"journal": name})
    _persist_aside(member, spec, item.mod_revision, aside)


def _adopt_legacy_aside(spool_root: Path, aside_root: Path) -> None:
    """Move what an earlier version left in LEGACY_ASIDE_DIR (directories of orphaned spools)
    under `aside_root`. Files there are the spools of a journal of that name: they stay."""
    legacy = spool_root / LEGACY_ASIDE_DIR
    try:
        entries = list(legacy.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return
    moved = [e for e in entries if e.is_dir()]
    if not moved:
        return
    aside_root.mkdir(exist_ok=True)
    for entry in moved:
        try:
            os.rename(entry, aside_root / entry.name)  # Fails over one holding files.
        except OSError as exc:
            log.warning(
                "cannot adopt orphaned spools", extra={"path": str(entry), "error": str(exc)}
            )
    with contextlib.suppress(OSError):
        legacy.rmdir()  # Unless it still holds something (a journal's spools, a failed move).


_SPOOL_FILE = re.compile(r"[0-9a-f]{16}\.(spool|log|held)")


def _journal_of_directory(directory: Path, dirname: str) -> str | None:
    """The journal whose spool directory's name is `dirname` (`replica.spool_directory`):
    `directory`, or the directory its spools were moved to. None for any other entry of the
    spool root (ours, such as ASIDE_DIR, or someone else's)."""
    if "~" in dirname:
        # A long name's directory: its spools' logs name the journal.
        names = {spool_log_journal(p) for p in directory.glob("*.log")}
        named = [n for n in names if n is not None and spool_directory_name(n) == dirname]
        name = named[0] if len(named) == 1 else ""
    else:
        name = unquote(dirname)
    if not name or spool_directory_name(name) != dirname or not _is_journal_name(name):
        return None
    return name


def _is_journal_name(name: str) -> bool:
    try:
        validate_journal_name(name, allow_meta=False)
    except ValidationError:
        return False
    return True


def _foreign_files(directory: Path) -> list[str]:
    """Names in a journal's spool directory that are no spool's (nor an earlier version's
    frontier file)."""
    return sorted(
        p.name
        for p in directory.iterdir()
        if not (_SPOOL_FILE.fullmatch(p.name) or p.name == LEGACY_FILE) or not p.is_file()
    )
