"""A replica: the runtime of one journal on this broker.

It owns the journal's spec, its open spool, its fragment index (local spools plus store
listings, refreshed every `refresh_interval`), its registers and its append pipeline (a lock:
appends to a journal are exclusive and never interleave). It decides when the open spool
rolls: at `fragment.length`, at a `flush_interval` boundary, or on a codec change.

In cluster mode the cluster resolver also gives it a role (primary or replica) and the
journal's assignments; the open spool is then driven through `rspool` (a ReplicatedSpool,
owned by whoever holds `spool_lock`: the primary's replication pipeline, or a peer's
Replicate stream), and readers see content only up to `readable_end`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pygazette.broker.flow_control import RateLimiter
from pygazette.broker.fragment_index import FragmentIndex
from pygazette.broker.persister import Persister
from pygazette.broker.spool import Spool, SpoolCorrupt
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import parse_fragment_path
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores.store import StoreRegistry

if TYPE_CHECKING:
    from pygazette.broker.replicated_spool import ReplicatedSpool

log = logging.getLogger(__name__)

_DEFAULT_REFRESH_SECONDS = 300.0
# How long a stopping replica waits for an in-flight append or Replicate stream.
STOP_WAIT_SECONDS = 10.0


def spool_directory(root: Path, journal: str) -> Path:
    return root / quote(journal, safe="")


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
    ) -> None:
        self.name = spec.name
        self.spec = spec
        self.mod_revision = mod_revision
        self.spool_dir = spool_directory(spool_root, spec.name)
        self.stores = stores
        self.persister = persister
        self.sync = sync
        self.index = FragmentIndex(spec.name)
        self.spool: Spool | None = None
        self.registers = pb.LabelSet()
        self.pipeline = asyncio.Lock()
        self.limiter = RateLimiter(spec.max_append_rate)
        self._refresh_task: asyncio.Task[None] | None = None
        self._refresh_now = asyncio.Event()
        # Cluster mode (see the module docstring).
        self.clustered = False
        self.primary = False
        self.assignments: list[Any] = []  # allocator.state.Assignment, in key order.
        self.invalidated = asyncio.Event()  # Set (and replaced) when assignments change.
        self.spool_lock = asyncio.Lock()
        self.rspool: ReplicatedSpool | None = None
        self.replication: Any = None  # The primary's broker.pipeline.Pipeline, if open.
        self.readable_end: int | None = None
        self.stopping = False

    # Lifecycle.
    def start(self) -> None:
        self.recover_spools()
        self._refresh_task = asyncio.create_task(self._refresh_loop(), name=f"refresh:{self.name}")

    async def stop(self, *, persist: bool) -> None:
        """Stop serving; with `persist`, hand the open spool to the persister first."""
        if self._refresh_task is not None:
            self._refresh_task.cancel()
            await asyncio.wait([self._refresh_task])  # Our own cancellation still propagates.
        if self.clustered:
            await self._stop_clustered()
            return
        if persist and self.spool is not None:
            async with self.pipeline:
                self.close_spool()

    async def _stop_clustered(self) -> None:
        """Close the pipeline (confirming what it can), then complete and persist the spool.

        In-flight appends and Replicate streams see the replica stopping and end; if one
        doesn't within STOP_WAIT_SECONDS, it is cut off.
        """
        from pygazette.broker.append_fsm import close_replication

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
            await close_replication(self, graceful=holds_pipeline)
            holds_spool = False
            try:
                async with asyncio.timeout(STOP_WAIT_SECONDS):
                    await self.spool_lock.acquire()
                    holds_spool = True
            except TimeoutError:
                log.warning("replication still running at stop", extra={"journal": self.name})
            try:
                if self.rspool is not None:
                    self.rspool.complete(primary=self.primary)
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
            self._refresh_now.set()

    def recover_spools(self) -> None:
        """Reopen spools left by an earlier run: all but the newest are closed and persisted."""
        if not self.spool_dir.is_dir():
            return
        recovered: list[Spool] = []
        for log_path in sorted(self.spool_dir.glob("*.log")):
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
                spool.delete()
                continue
            recovered.append(spool)
        for spool in recovered:
            self.index.add_local(spool)
        if recovered:
            self.registers = recovered[-1].registers
        for spool in recovered[:-1]:
            spool.close()
            self.persister.enqueue(spool, list(self.spec.fragment.stores), self.index)
        if recovered:
            self.spool = recovered[-1]

    def start_clustered(self) -> None:
        """Start in cluster mode: recover spools, then put the open one under replication."""
        from pygazette.broker.replicated_spool import ReplicatedSpool

        self.clustered = True
        self.recover_spools()
        self.rspool = ReplicatedSpool(self)
        self.readable_end = self.rspool.confirmed
        self._refresh_task = asyncio.create_task(self._refresh_loop(), name=f"refresh:{self.name}")

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
        self._refresh_now.set()

    def invalidate(self) -> None:
        self.invalidated.set()
        self.invalidated = asyncio.Event()

    def set_readable(self, offset: int) -> None:
        """Let readers see content up to `offset` (cluster mode; it never moves back)."""
        if self.readable_end is None or offset > self.readable_end:
            self.readable_end = offset
            self.index.spool_committed()

    # Offsets.
    @property
    def head(self) -> int:
        """The journal's write head: the offset the next append begins at.

        In cluster mode, the head readers see: `readable_end`, the frontier every replica
        has confirmed (content beyond it, local or persisted, is not shown yet).
        """
        if self.readable_end is not None:
            return self.readable_end
        return max(self.index.end_offset, self.spool.end if self.spool else 0)

    def readable_limit(self, frag_end: int) -> int:
        """How far readers may read a fragment (or spool) ending at `frag_end`."""
        if self.readable_end is None:
            return frag_end
        return min(frag_end, self.readable_end)

    # Spool rolling (callers hold the pipeline).
    def spool_needs_roll(self, now: float) -> bool:
        spool = self.spool
        if spool is None:
            return False
        frag = self.spec.fragment
        if spool.codec != frag.compression_codec:
            return True
        if frag.length > 0 and spool.end - spool.begin >= frag.length:
            return True
        interval = frag.flush_interval.seconds + frag.flush_interval.nanos / 1e9
        if interval > 0 and spool.first_append_time is not None:
            return int(spool.first_append_time // interval) != int(now // interval)
        return False

    def close_spool(self) -> None:
        """Close the open spool and queue it for persistence."""
        spool = self.spool
        if spool is None:
            return
        self.spool = None
        spool.close()
        self.persister.enqueue(spool, list(self.spec.fragment.stores), self.index)

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
        return self.spool

    # Store listings.
    async def list_stores(self) -> list[pb.Fragment]:
        frags: list[pb.Fragment] = []
        for url in self.spec.fragment.stores:
            store = self.stores.get(url)
            for obj in await store.list_files(self.name + "/"):
                try:
                    frag = parse_fragment_path(self.name, obj.path)
                except ValidationError:
                    continue  # Not a fragment file (e.g. a stray file in the store).
                frag.backing_store = url
                frag.mod_time = obj.mod_time
                frags.append(frag)
        return frags

    def refresh_interval(self) -> float:
        ri = self.spec.fragment.refresh_interval
        seconds = ri.seconds + ri.nanos / 1e9
        return seconds if seconds > 0 else _DEFAULT_REFRESH_SECONDS

    async def refresh(self) -> None:
        self.index.begin_listing()
        self.index.replace_persisted(await self.list_stores())

    async def _refresh_loop(self) -> None:
        backoff = 0.1
        while True:
            try:
                await self.refresh()
                backoff = 0.1
                delay = self.refresh_interval()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("store listing failed", extra={"journal": self.name, "error": str(exc)})
                delay = backoff
                backoff = min(backoff * 2, 30.0)
            self._refresh_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._refresh_now.wait(), delay)
