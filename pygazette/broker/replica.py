"""A replica: the runtime of one journal on this broker.

It owns the journal's spec, its open spool, its fragment index (local spools plus store
listings, refreshed every `refresh_interval`), its registers and its append pipeline (a lock:
appends to a journal are exclusive and never interleave). It decides when the open spool
rolls: at `fragment.length`, at a `flush_interval` boundary, or on a codec change.

Flush intervals are multiples of the interval since the Unix epoch, in whole seconds, as
Gazette computes them. Gazette rolls a spool past its boundary on the next append, or on the
primary's once-a-minute empty "pulse" append when none arrive; here a spool is rolled at the
boundary itself, so an idle journal's last appends persist on time: by the event loop's
shared `flush_timer` (single-node; no task or timer of a journal's own), or by the pulser's
sweep (cluster mode).

In cluster mode the cluster resolver also gives it a role (primary or replica) and the
journal's assignments; the open spool is then driven through `rspool` (a ReplicatedSpool,
owned by whoever holds `spool_lock`: the primary's replication pipeline, or a peer's
Replicate stream), and readers see content only up to `readable_end`.

The append paths see a replica only through the narrow interfaces of `journal_runtime`
(`LocalJournal` for single-node appends, `JournalRuntime` for the cluster's pipeline).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pygazette.broker.flow_control import RateLimiter
from pygazette.broker.flush_timer import FlushTimer
from pygazette.broker.fragment import kept_registers
from pygazette.broker.fragment.fragment_index import FragmentIndex
from pygazette.broker.fragment.frontier_log import FrontierLog
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.fragment.refresher import Refresher
from pygazette.broker.fragment.spool import PendingAppend, Spool, SpoolCorrupt, fsync_dir
from pygazette.broker.metrics import STORE_LISTING_SKIPPED
from pygazette.broker.pipeline import Pipeline, PipelineBroken
from pygazette.broker.replicated_spool import ReplicatedSpool, load_frontier, run_to_completion
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import parse_fragment_path, under_another_journal
from pygazette.protocol.path_name import path_name
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores.store import StoreRegistry

log = logging.getLogger(__name__)

_NONE_SKIPPED: frozenset[tuple[str, str]] = frozenset()

_DEFAULT_REFRESH_SECONDS = 300.0
FIRST_LISTING_ATTEMPTS = 5
# Failed listings retry on a backoff up to this (Gazette waits a whole refresh interval).
MAX_LISTING_RETRY_SECONDS = 10.0
# How long a stopping replica waits for an in-flight append or Replicate stream (past it,
# only for a write of theirs still running on a worker thread: `ReplicatedSpool.settle`).
STOP_WAIT_SECONDS = 10.0


# Beside a spool's log, a closed spool held in doubt (`Replica.hold_closed`) has a file of
# this suffix holding the frontier it was held at (8 bytes, little-endian).
HELD_SUFFIX = ".held"


def _held_mark_path(log_path: Path) -> Path:
    return log_path.with_suffix(HELD_SUFFIX)


def _write_held_mark(log_path: Path, frontier: int, *, sync: bool) -> None:
    """Mark a closed spool held back at `frontier` (with `sync`, durably: the file's bytes
    and its name, as --sync makes everything a restart relies on)."""
    path = _held_mark_path(log_path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, frontier.to_bytes(8, "little"))
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    if sync:
        fsync_dir(path.parent)


def _read_held_mark(mark_path: Path) -> int | None:
    try:
        data = mark_path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != 8:
        log.warning("ignoring a malformed held-spool mark", extra={"path": str(mark_path)})
        return None
    return int.from_bytes(data, "little")


def spool_directory_name(journal: str) -> str:
    """The name of `journal`'s spool directory in a spool root (`protocol.path_name`: for a
    long name, cut and told apart by a digest after a "~"; its spools' logs name it)."""
    return path_name(journal)


def spool_directory(root: Path, journal: str) -> Path:
    return root / spool_directory_name(journal)


_MAX_COMPONENT = 255  # Bytes in a path component (the file systems a spool root is on).


def adopt_quoted_directory(root: Path, journal: str) -> bool:
    """Move spools an earlier version kept under `journal`'s whole quoted name (it did not
    cut long names; one of up to 255 bytes was a directory) to its spool directory. True if
    moved. Costs nothing for a name `spool_directory_name` does not cut."""
    quoted = quote(journal, safe="")
    new = spool_directory(root, journal)
    if quoted == new.name or len(quoted.encode()) > _MAX_COMPONENT:
        return False
    old = root / quoted
    if not old.is_dir() or new.exists():
        return False
    os.rename(old, new)
    return True


class Replica:
    def __init__(
        self,
        spec: pb.JournalSpec,
        mod_revision: int,
        *,
        spool_root: Path,
        stores: StoreRegistry,
        persister: Persister,
        sync: bool,
        frontiers: FrontierLog | None = None,
    ) -> None:
        self.name = spec.name
        self.spec = spec
        self.mod_revision = mod_revision
        self.spool_dir = spool_directory(spool_root, spec.name)
        if adopt_quoted_directory(spool_root, spec.name) and sync:
            fsync_dir(spool_root)
        # Confirmed frontiers (cluster mode) of this spool root's journals.
        self.frontiers = frontiers if frontiers is not None else FrontierLog.at(spool_root)
        if sync:
            self.frontiers.sync = True  # Confirmations as durable as the appends they cover.
        self.stores = stores
        self.persister = persister
        self.sync = sync
        self.index = FragmentIndex(spec.name)
        self.spool: Spool | None = None
        self.registers = pb.LabelSet()
        # Registers kept for a restart once every spool is persisted (`keep_registers`):
        # their file, the end of the last ones kept, and (single-node) those found at
        # recovery, taken once the first listing shows the write head they were kept at.
        self.kept_registers_path = kept_registers.path_of(spool_root, self.spool_dir.name)
        self._kept_end = -1
        self._kept_found: tuple[int, pb.LabelSet] | None = None
        self.keeps_registers = True  # Not the replica persisting a journal's orphaned spools.
        self.pipeline = asyncio.Lock()
        self.limiter = RateLimiter(spec.max_append_rate)
        self._refresher: Refresher | None = None  # Lists its stores (shared, see `start`).
        self._refresh_backoff = 0.1
        self.refresh_error = ""  # Why the last store listing failed ("" once one succeeds).
        self._refresh_failures = 0  # Failed listings in a row.
        self._refresh_failed = asyncio.Event()  # Set on each failed listing.
        # (store, path) of the objects the last listing left out (not fragments), logged
        # once each: when a listing first finds them.
        self._skipped: frozenset[tuple[str, str]] = _NONE_SKIPPED
        # Single-node: the shared timer that rolls the spool at flush boundaries (`start`),
        # and a roll it started, while it runs.
        self._flush_timer: FlushTimer | None = None
        self._roll_task: asyncio.Task[None] | None = None
        # Cluster mode (see the module docstring).
        self.clustered = False
        self.primary = False
        self.assignments: list[Any] = []  # allocator.state.Assignment, in key order.
        self.invalidated = asyncio.Event()  # Set (and replaced) when assignments change.
        self.spool_lock = asyncio.Lock()
        self.rspool: ReplicatedSpool | None = None
        self.replication: Pipeline | None = None  # The primary's pipeline, if open.
        self.replicated_whole_at = float("-inf")  # Its last append replicated whole.
        # Whether a journal of a name exists (its resolver's keyspace): a store lists the
        # files of a journal nested under this one's name too (`list_stores`).
        self.is_journal: Callable[[str], bool] = lambda _name: False
        self.readable_end: int | None = None
        # Closed spools whose end lies beyond `readable_end` (content in doubt a roll kept:
        # `ReplicatedSpool`), with whether the persister checks the store first: held back
        # at the frontier, and not persisted, until it reaches their end (`hold_closed`).
        self._held_closed: list[tuple[Spool, bool]] = []
        self.stopping = False

    # Lifecycle.
    def start(self) -> None:
        self._flush_timer = FlushTimer.of_running_loop()
        self.recover_spools()
        self._start_listing()
        self._schedule_flush()

    def _start_listing(self) -> None:
        """List the stores now and every refresh interval (by the loop's shared refresher:
        no task of this replica's own)."""
        self._refresher = Refresher.of_running_loop()
        self._refresher.add(self)

    async def stop(self, *, persist: bool) -> None:
        """Stop serving; with `persist`, hand the open spool to the persister first."""
        if self._refresher is not None:
            self._refresher.remove(self)
        if self._flush_timer is not None:
            self._flush_timer.remove(self)
            self._flush_timer = None
        if self._roll_task is not None:
            self._roll_task.cancel()
            await asyncio.wait([self._roll_task])  # Our own cancellation still propagates.
        if self.clustered:
            await self._stop_clustered()
            return
        # Reads blocked at the head end, to resolve the journal again (deleted, or a new
        # replica of it), rather than wait on this one forever.
        self.invalidate()
        if persist and self.spool is not None:
            async with self.pipeline:
                self.close_spool()

    async def _stop_clustered(self) -> None:
        """Close the pipeline (confirming what it can), then complete and persist the spool.

        In-flight appends and Replicate streams see the replica stopping and end; if one
        doesn't within STOP_WAIT_SECONDS, it is cut off: the spool takes nothing more from
        it (`SpoolFinished`), once a write of its still running on a worker thread is over.
        Only then may a new replica of the journal here recover the spool's files.
        """
        self.stopping = True
        self.invalidate()
        holds_pipeline = False
        try:
            async with asyncio.timeout(STOP_WAIT_SECONDS):
                await self.pipeline.acquire()
                holds_pipeline = True
        except TimeoutError:
            log.warning("append still running at stop", extra={"journal": self.name})
        try:
            await self.close_replication(graceful=holds_pipeline)
            holds_spool = False
            try:
                async with asyncio.timeout(STOP_WAIT_SECONDS):
                    await self.spool_lock.acquire()
                    holds_spool = True
            except TimeoutError:
                log.warning("replication still running at stop", extra={"journal": self.name})
            try:
                if self.rspool is not None:
                    await self.rspool.settle()
                    self.rspool.complete(primary=self.primary)
                self._release_held_closed()
            finally:
                if holds_spool:
                    self.spool_lock.release()
        finally:
            if holds_pipeline:
                self.pipeline.release()

    def update_spec(self, spec: pb.JournalSpec, mod_revision: int) -> None:
        stores_changed = list(spec.fragment.stores) != list(self.spec.fragment.stores)
        self.spec = spec
        self.mod_revision = mod_revision
        self.limiter.set_rate(spec.max_append_rate)
        if stores_changed:
            self.request_refresh()
            if spec.fragment.stores:
                self.persister.unpark(self.name)
        self._schedule_flush()  # A new codec or flush interval may roll the spool now.

    def append_refusal(self) -> str:
        """Why appends must be refused now (FRAGMENT_STORE_UNHEALTHY), or ""."""
        return self.persister.refusal(self.spec)

    def recover_spools(self, confirmed: int | None = None) -> None:
        """Reopen spools left by an earlier run: all but the newest are closed and persisted.

        A closed spool this broker held in doubt when it stopped (`hold_closed` marked it) is
        persisted only up to what was confirmed of it: the frontier it was held at, or
        `confirmed`, the journal's frontier as this broker left it (cluster mode), if that
        reached further. A restart forgets what is in doubt, as it does for the open spool.
        An unmarked spool is persisted whole, whatever `confirmed` says: the frontier's file
        is not synced, and a stale one must not cut acknowledged content."""
        try:
            entries = list(self.spool_dir.iterdir())  # One listing: logs and marks.
        except FileNotFoundError:
            return
        marks = {p.stem: p for p in entries if p.suffix == HELD_SUFFIX}
        recovered: list[Spool] = []
        for log_path in sorted(p for p in entries if p.suffix == ".log"):
            try:
                spool, report = Spool.recover(log_path, sync=self.sync)
            except (SpoolCorrupt, OSError, ValueError) as exc:
                log.error("unrecoverable spool", extra={"path": str(log_path), "error": str(exc)})
                continue
            if report.cut_content_bytes or report.cut_log_bytes:
                log.warning(
                    "cut torn spool tail",
                    extra={
                        "journal": self.name,
                        "begin": spool.begin,
                        "content_bytes": report.cut_content_bytes,
                        "log_bytes": report.cut_log_bytes,
                    },
                )
            if spool.end == spool.begin:
                self.keep_registers(spool)  # Its header's registers: the journal's at its end.
                spool.delete()
                continue
            recovered.append(spool)
        for spool in recovered:
            self.index.add_local(spool)
        if recovered:
            self.registers = recovered[-1].registers
        else:
            self._kept_found = kept_registers.load(self.kept_registers_path, self.name)
            if self._kept_found is not None:
                self._kept_end = self._kept_found[0]
        for spool in recovered[:-1]:
            mark_path = marks.get(spool.log_path.stem)
            mark = None if mark_path is None else _read_held_mark(mark_path)
            if mark is not None:
                keep = max(mark, -1 if confirmed is None else confirmed)
                if spool.end > keep:
                    cut = self._cut_closed(spool, keep)
                    if cut is None:
                        continue
                    spool = cut
            spool.close()
            self.persister.enqueue(spool, self, recovered=True)
        if recovered:
            # The newest is the open spool again (held in doubt or not: its content beyond
            # the frontier is held back, and a new pipeline cuts it, `ReplicatedSpool`).
            self.spool = recovered[-1]
            self._schedule_flush()
        for mark_path in marks.values():
            mark_path.unlink(missing_ok=True)  # Used, or left by a spool removed since.

    def recover_replicated(self) -> None:
        """Cluster mode: recover the spools and put them under a `ReplicatedSpool`, both
        with the journal's confirmed frontier as this broker last recorded it."""
        self.clustered = True
        confirmed = load_frontier(self)
        self.recover_spools(confirmed=confirmed)
        if self._kept_found is not None:
            # No spool: the replica starts at the confirmed frontier (`ReplicatedSpool`), the
            # head its registers were kept at if they are the journal's there.
            end, registers = self._kept_found
            self._kept_found = None
            if confirmed is not None and end == confirmed and self.spool is None:
                self.registers = registers
        self.rspool = ReplicatedSpool(self, confirmed)

    def start_clustered(self) -> None:
        """Start in cluster mode: recover spools, then put the open one under replication."""
        self.recover_replicated()
        assert self.rspool is not None
        self.readable_end = self.rspool.confirmed
        self._start_listing()

    def set_assignments(self, primary: bool, assignments: list[Any]) -> bool:
        """Take the journal's current assignments; wake waiters if anything changed."""
        before = [(a.kv.key, a.kv.mod_revision) for a in self.assignments]
        after = [(a.kv.key, a.kv.mod_revision) for a in assignments]
        changed = before != after or primary != self.primary
        self.primary = primary
        self.assignments = list(assignments)
        if changed:
            self.invalidate()
            # Peers may have persisted fragments this broker's index hasn't listed yet.
            self.request_refresh()
        return changed

    def request_refresh(self) -> None:
        """List the stores again soon (the index signals `changed` when it has)."""
        if self._refresher is not None:
            self._refresher.now(self)

    def invalidate(self) -> None:
        self.invalidated.set()
        self.invalidated = asyncio.Event()
        self.index.spool_committed()  # Wakes blocking reads, which end if resolved before.

    async def close_replication(self, *, graceful: bool = True) -> None:
        """Close the primary's pipeline, giving the spool back (the caller holds
        `pipeline`). Gracefully, what every peer acknowledged is confirmed first. A
        confirmation it sent that not every peer acknowledged leaves content in doubt
        (`ReplicatedSpool.in_doubt`): no later pipeline cuts below it."""
        pln = self.replication
        if pln is None:
            return
        self.replication = None
        rs = self.rspool
        try:
            if graceful and pln.ok:
                if rs is not None and rs.end > max(pln.confirmed, 0):
                    with contextlib.suppress(PipelineBroken):
                        await pln.confirm(rs.end)
                await pln.close()
        finally:
            # Closed, or not gracefully, or cut short (the append or pulse closing it was
            # cancelled while a peer was slow to answer): either way it is gone, and its
            # spool is given back (nothing else would: the journal has no pipeline now).
            pln.abort()
            if rs is not None:
                rs.rollback()
                rs.note_in_doubt(pln.confirm_sent, pln.confirmed)
            if self.spool_lock.locked():
                self.spool_lock.release()

    def confirm_through(self, offset: int) -> None:
        """Every member of the route holds the journal up to `offset`: confirm it here and
        let readers see it."""
        if self.rspool is not None:
            self.rspool.set_confirmed(offset)
        self.set_readable(offset)

    def persist_spool(self, spool: Spool, *, check_existing: bool = False) -> None:
        """Hand a closed spool to the persister."""
        self.persister.enqueue(spool, self, check_existing=check_existing)

    def hold_closed(self, spool: Spool, *, check_existing: bool) -> None:
        """Keep a closed spool that ends in content in doubt held back at `readable_end`,
        showing readers more of it only as `set_readable` moves on, and persist it only once
        all of it is confirmed. Persisted earlier, its fragment would show the store (and so
        every broker) content the route may never confirm, and may continue with other bytes
        at the same offsets; if the journal leaves this broker first, only its confirmed part
        is persisted (`_release_held_closed`)."""
        if self.readable_end is not None:
            spool.set_readable(self.readable_end)
        if spool.readable_end >= spool.end:
            self.persist_spool(spool, check_existing=check_existing)
            return
        self._held_closed.append((spool, check_existing))
        # Marked on disk, so that a restart persists only its confirmed part too.
        _write_held_mark(spool.log_path, spool.readable_end, sync=self.sync)

    def set_readable(self, offset: int) -> None:
        """Let readers see content up to `offset` (cluster mode; it never moves back)."""
        if self.readable_end is None or offset > self.readable_end:
            self.readable_end = offset
            if self.spool is not None:
                self.spool.set_readable(offset)
            if self._held_closed:
                self._show_held_closed(offset)
            self.index.spool_committed()

    def _show_held_closed(self, offset: int) -> None:
        held = []
        for spool, check_existing in self._held_closed:
            if spool.deleted:
                continue  # Dropped: the store holds a fragment covering it (`refresh`).
            try:
                spool.set_readable(offset)
            except OSError:
                continue  # Removed meanwhile (its content file is gone).
            if spool.readable_end < spool.end:
                held.append((spool, check_existing))
            else:
                _held_mark_path(spool.log_path).unlink(missing_ok=True)
                self.persist_spool(spool, check_existing=check_existing)  # Confirmed now.
        self._held_closed = held

    def _release_held_closed(self) -> None:
        """The journal leaves this broker with closed spools still in doubt: the route may
        go on without it, so each is cut to what was confirmed of it (what readers saw) and
        only that is persisted. Whoever took the rest as confirmed holds it and persists it."""
        held, self._held_closed = self._held_closed, []
        for spool, check_existing in held:
            if spool.deleted:
                continue
            cut = self._cut_closed(spool, spool.readable_end)
            _held_mark_path(spool.log_path).unlink(missing_ok=True)
            if cut is not None:
                cut.close()
                self.persist_spool(cut, check_existing=check_existing)

    def _cut_closed(self, spool: Spool, keep: int) -> Spool | None:
        """A spool (in the index) cut to end at `keep`, replacing it there; None if nothing
        is left of it (or it can't be cut: then it is dropped, as `cut_unconfirmed` does)."""
        log.warning(
            "cutting a closed spool's content in doubt",
            extra={"journal": self.name, "begin": spool.begin, "kept": keep, "end": spool.end},
        )
        log_path = spool.log_path
        self.index.remove_local(spool)
        spool.detach()
        try:
            cut, _report = Spool.recover(log_path, sync=self.sync, end_limit=keep)
        except (SpoolCorrupt, OSError, ValueError) as exc:
            log.error(
                "cannot cut spool; dropping it", extra={"journal": self.name, "error": str(exc)}
            )
            return None
        if cut.end == cut.begin:
            cut.delete()
            return None
        self.index.add_local(cut)
        return cut

    # Offsets.
    @property
    def head(self) -> int:
        """The journal's write head: the offset the next append begins at.

        In cluster mode, the head readers see: `readable_end`, the frontier every replica
        has confirmed (the open spool's content beyond it is not shown yet, see
        `Spool.hold_back`), or the end of a persisted fragment beyond it (persisted content
        was confirmed by the broker that persisted it; a member learns of it from a listing
        before its own frontier catches up). Every fragment a reader is shown ends at or
        below it.
        """
        if self.readable_end is not None:
            return max(self.readable_end, self.index.persisted_end)
        return max(self.index.end_offset, self.spool.end if self.spool else 0)

    def holds_unconfirmed(self, offset: int) -> bool:
        """Whether this broker holds committed content at `offset` that readers may not see
        yet (cluster mode: not every replica has confirmed it)."""
        rs = self.rspool
        return rs is not None and self.readable_end is not None and self.head <= offset < rs.end

    # Spool rolling (callers hold the pipeline).
    def flush_interval(self) -> int:
        """The flush interval in whole seconds (0: none), as Gazette truncates it."""
        return max(0, int(self.spec.fragment.flush_interval.seconds))

    def spool_needs_roll(self, now: float) -> bool:
        spool = self.spool
        if spool is None:
            return False
        frag = self.spec.fragment
        if spool.codec != frag.compression_codec:
            return True  # Even an empty spool: it must be recreated with the new codec.
        if spool.end == spool.begin:
            return False
        # As Gazette: a spool rolls once it holds more than fragment.length (an append that
        # reaches the length exactly still shares it), and the spool holding the journal's
        # first write rolls after it, so a recovering broker can tell the journal was written.
        if frag.length > 0 and spool.end - spool.begin > frag.length:
            return True
        if spool.begin == self.index.begin_offset:
            return True
        interval = self.flush_interval()
        if interval > 0 and spool.first_append_time is not None:
            return int(spool.first_append_time) // interval != int(now) // interval
        return False

    def flush_deadline(self, now: float) -> float | None:
        """When the open spool next crosses a flush boundary (None: no interval or spool).

        An empty spool's first append comes after `now`, so the boundary after `now` is the
        earliest its content can need flushing.
        """
        interval = self.flush_interval()
        if interval <= 0 or self.spool is None:
            return None
        first = self.spool.first_append_time
        since = int(first if first is not None else now)
        return float((since // interval + 1) * interval)

    def _schedule_flush(self) -> None:
        """Single-node: have the flush timer look at the open spool when it may need rolling
        (now, if it does already; at its next flush boundary; or never)."""
        if self._flush_timer is not None and self._roll_task is None:
            now = time.time()
            when = now if self.spool_needs_roll(now) else self.flush_deadline(now)
            self._flush_timer.set(self, when)

    def flush_check(self, now: float) -> float | None:
        """(`FlushTimer`) Start rolling the spool if it needs it (the roll has the next look
        scheduled once done); else the time of the next look."""
        if self._roll_task is not None:
            return None
        if not self.spool_needs_roll(now):
            return self.flush_deadline(now)
        self._roll_task = asyncio.create_task(self._roll(), name=f"flush:{self.name}")
        return None

    async def _roll(self) -> None:
        """Roll the spool past a flush boundary (or of an old codec), holding the pipeline."""
        try:
            async with self.pipeline:
                if self.spool_needs_roll(time.time()):
                    log.info("rolling spool", extra={"journal": self.name})
                    self.close_spool()
        finally:
            self._roll_task = None
        self._schedule_flush()

    def close_spool(self) -> None:
        """Close the open spool and queue it for persistence."""
        spool = self.spool
        if spool is None:
            return
        self.spool = None
        spool.close()
        self.persister.enqueue(spool, self)

    def open_spool(self, begin: int) -> Spool:
        """A spool to append at `begin`, rolling the current one if it doesn't fit."""
        if self.spool is not None and (
            self.spool.end != begin or self.spool_needs_roll(time.time())
        ):
            self.close_spool()
        if self.spool is None:
            self.spool = Spool.create(
                self.spool_dir,
                self.name,
                begin,
                self.spec.fragment.compression_codec,
                self.registers,
                sync=self.sync,
            )
            self.index.add_local(self.spool)
            self._schedule_flush()
        return self.spool

    # Single-node appends (callers hold the pipeline).
    def start_append(self) -> tuple[Spool, PendingAppend, hashlib._Hash]:
        """The spool to append to at the write head, the append, and the spool's running
        SHA-1 (of everything before the append; extend a copy chunk by chunk)."""
        spool = self.open_spool(self.head)
        return spool, spool.start_append(), spool.running_sha()

    async def commit_append(
        self,
        spool: Spool,
        pending: PendingAppend,
        running: hashlib._Hash,
        summing: concurrent.futures.Future[None] | None,
        registers: pb.LabelSet,
    ) -> None:
        """Commit the append with the journal's new registers; roll the spool if due."""
        changed = registers if registers != self.registers else None
        cancelled = None
        if spool.sync:
            # Waited for even if cancelled: the thread commits all the same, and the next
            # append (the pipeline is released on the cancellation) must follow it.
            cancelled = await run_to_completion(spool.commit, pending, changed, running, summing)
        else:
            spool.commit(pending, changed, running, summing)
        self.registers = registers
        self.index.spool_committed()
        if self.spool_needs_roll(spool.last_append_time or 0.0):
            self.close_spool()
        if cancelled is not None:
            raise cancelled

    def drop_empty_append(self, spool: Spool) -> None:
        """An empty append commits nothing: drop a spool opened for it alone."""
        if spool.end == spool.begin and self.spool is spool:
            self.spool = None
            self.index.remove_local(spool)
            spool.delete()

    # Store listings.
    async def list_stores(self) -> list[pb.Fragment]:
        """The fragments of the journal's stores. An object that is not a fragment (its name
        does not parse as one: a stray file beside them) is left out, as Gazette's listing
        leaves it out (WalkAllStores); it is logged and counted once, when a listing first
        finds it (Gazette warns on every listing), not on every refresh."""
        frags: list[pb.Fragment] = []
        skipped: set[tuple[str, str]] = set()
        for url in self.spec.fragment.stores:
            store = self.stores.get(url)
            for obj in await store.list_files(self.name + "/"):
                try:
                    frag = parse_fragment_path(self.name, obj.path)
                except ValidationError as exc:
                    skipped.add((url, obj.path))
                    if (url, obj.path) not in self._skipped:
                        self._skipped_object(url, obj.path, obj.mod_time, exc)
                    continue
                if under_another_journal(self.name, frag, self.is_journal):
                    continue  # Another journal's (`a/b/c`'s, listed under `a/b/`).
                frag.backing_store = url
                frag.mod_time = obj.mod_time
                frags.append(frag)
        self._skipped = frozenset(skipped) if skipped else _NONE_SKIPPED
        return frags

    def _skipped_object(self, url: str, path: str, mod_time: int, exc: ValidationError) -> None:
        STORE_LISTING_SKIPPED.inc()
        log.warning(
            "skipping an object of the fragment store that is not a fragment",
            extra={
                "journal": self.name,
                "store": url.split("?", 1)[0],
                # A file name's undecodable bytes as \xNN (JSON logs cannot hold them).
                "path": path.encode(errors="surrogateescape").decode(errors="backslashreplace"),
                "modTime": mod_time,
                "error": str(exc),
            },
        )

    def keep_registers(self, spool: Spool) -> None:
        """`spool`'s files go, its content being in a store (or none): keep the registers at
        its end for a restart that finds no spool of the journal (`kept_registers`), unless
        later ones are kept already. Nothing is written for a journal that never had any."""
        if not self.keeps_registers or spool.end < self._kept_end:
            return
        if self._kept_end < 0 and not spool.registers.labels:
            return
        try:
            kept_registers.save(
                self.kept_registers_path, self.name, spool.end, spool.registers, sync=self.sync
            )
        except OSError as exc:
            log.warning(
                "cannot keep the journal's registers",
                extra={"journal": self.name, "error": str(exc)},
            )
            return
        self._kept_end = spool.end

    def forget_kept_registers(self) -> None:
        """The journal leaves this broker (or is deleted): its kept registers go too."""
        kept_registers.forget(self.kept_registers_path)
        self._kept_end = -1

    def refresh_interval(self) -> float:
        ri = self.spec.fragment.refresh_interval
        seconds = ri.seconds + ri.nanos / 1e9
        return seconds if seconds > 0 else _DEFAULT_REFRESH_SECONDS

    async def refresh(self) -> None:
        started = self.index.listing_started()
        listing = await self.list_stores()
        for spool in self.index.replace_persisted(listing, started):
            self.keep_registers(spool)
            spool.delete()  # Already persisted (by an earlier run, or another broker).
        if self._kept_found is not None and self.index.first_refresh_done.is_set():
            # Single-node, no spool recovered: the registers kept at the write head the first
            # listing shows are the journal's (kept at another end, they are not).
            end, registers = self._kept_found
            self._kept_found = None
            if self.spool is None and not self.registers.labels and self.index.end_offset == end:
                self.registers = registers

    async def await_first_listing(self, failures: int = FIRST_LISTING_ATTEMPTS) -> str:
        """Wait for the first store listing; "" once it landed, else why it keeps failing.

        Appends need it (the stores may hold a larger write head than local spools) and so
        do reads beyond local spools; rather than hang while a store is unreachable, give up
        once `failures` listings in a row have failed (a few seconds: they retry on a
        backoff), and at once while that is still the case.
        """
        done = self.index.first_refresh_done
        if not done.is_set() and self._refresher is not None:
            self._refresher.hurry(self)  # Someone waits for it: before idle journals.
        while self._refresh_failures < failures:
            if done.is_set():
                return ""
            failed = asyncio.ensure_future(self._refresh_failed.wait())
            succeeded = asyncio.ensure_future(done.wait())
            try:
                await asyncio.wait([failed, succeeded], return_when=asyncio.FIRST_COMPLETED)
            finally:
                failed.cancel()
                succeeded.cancel()
        if done.is_set():
            return ""
        return f"cannot list fragments of {self.name}: {self.refresh_error}"

    async def refresh_once(self) -> float:
        """List the stores once (for the refresher); the seconds until the next listing:
        the refresh interval, or a growing backoff after a failure."""
        try:
            await self.refresh()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("store listing failed", extra={"journal": self.name, "error": str(exc)})
            self.refresh_error = str(exc)
            self._refresh_failures += 1
            self._refresh_failed.set()
            self._refresh_failed = asyncio.Event()
            delay = self._refresh_backoff
            self._refresh_backoff = min(delay * 2, MAX_LISTING_RETRY_SECONDS)
            return delay
        self.refresh_error = ""
        self._refresh_failures = 0
        self._refresh_backoff = 0.1
        return self.refresh_interval()
