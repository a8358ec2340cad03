"""The persister: moves closed spools into their journal's first fragment store.

Each closed spool becomes a job queued on the store it is bound for, and each store is served
by its own workers, so a slow or unreachable store never holds back journals on other stores.
A job reads the journal's *current* spec at every attempt, as Gazette's persister does: the
store is its first store now (a job moves when an operator points the journal elsewhere, e.g.
away from a failed store) and the path postfix template is rendered then.

Compression reads the spool file in bounded chunks on the persister's own worker threads
(never the event loop, never the executor that appends write spools on); the compressed
file is kept across retries. A fragment already in the store (a restart after the upload but
before the spool's removal) is not uploaded again. A spool's local files are removed only
after the store holds the fragment durably; a failed attempt is retried on a backoff that
is cut short when the store's health check passes again, and the spool stays on disk — and
readable — meanwhile. Once the broker exits (`exit`), a spool its store refuses for want of
authorization (`StoreAuthError`) goes to the journal's next store, as Gazette's broker does.
Every store call of an attempt has a deadline (a put's is on its
progress, `put_deadline`: a slow store's put goes on while it reads its file): one that
hangs (a file store on a hung mount has no timeout of its own, an upload may sit on a dead
connection) is abandoned — cancelled, so it lands nothing it reads
after (`FragmentStore.put_file`) — and the attempt fails as on a store error. A stopped
replica's spools still waiting here are let go of when a new replica of the journal starts
(`release`, after an attempt in progress, so within its deadlines): it recovers them from its
spool directory. A journal without stores keeps its closed spools where they are, in its
fragment index, readable, as Gazette keeps them in its index (never persisted, so never
removed by retention; a restart recovers them); once its spec names a store, `unpark`
persists them.

The bytes of spools waiting for each store are its backlog. Past `backlog_limit`, appends
to journals persisting there are refused (FRAGMENT_STORE_UNHEALTHY, see `refusal`) until
the backlog drains, so an unreachable store cannot fill the local disk.

In a cluster, the primary persists its spools at once; replicas persist theirs a little
later and only if the store doesn't already hold fragments covering them (usually the
primary's one, which has the same name), so a fragment normally lands once, yet survives the
primary's loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pygazette.broker.fragment.cover_set import CoverSet
from pygazette.broker.fragment.path_postfix import TemplateError, evaluate_path_postfix
from pygazette.broker.metrics import SPOOL_COMPLETED, SPOOL_PERSISTED, STORE_PUT_BYTES
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import (
    fragment_content_path,
    parse_fragment_path,
    under_another_journal,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores import codecs
from pygazette.stores.store import FragmentStore, StoreAuthError, StoreError, StoreRegistry
from pygazette.stores.store_health import FIRST_CHECK_PENDING, StoreHealthMonitor

if TYPE_CHECKING:
    from pygazette.broker.fragment.fragment_index import FragmentIndex
    from pygazette.broker.fragment.spool import Spool

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_BACKLOG_LIMIT = 4 << 30
WORKERS_PER_STORE = 4
MAX_RETRY_SECONDS = 30.0
# The longest a job waits between attempts once the broker exits (within its persist deadline).
EXITING_RETRY_SECONDS = 1.0
_SCRATCH_PREFIX = "persist-"
# How long a replica leaves its primary to persist a fragment before checking for it.
REPLICA_PERSIST_DELAY_SECONDS = 5.0
# Deadlines of an attempt's store calls. A listing or existence check has
# STORE_CALL_DEADLINE_SECONDS. A put is abandoned once it went that long, plus a second for each
# PUT_DEADLINE_BYTES_PER_SECOND bytes a store may read ahead of what it sent (obstore's
# multipart upload reads up to 12 parts of 5 MiB ahead: PUT_READ_AHEAD_BYTES), without
# progress (reading its file): 60 s for a small put, 92 s of silence for a large one, however
# long a slow store takes while it keeps reading. A deadline on the whole put (as the size at
# some rate) abandoned a large fragment on a store slower than that rate at every attempt,
# each starting over: it never persisted.
STORE_CALL_DEADLINE_SECONDS = 60.0
PUT_DEADLINE_BYTES_PER_SECOND = 2 << 20
PUT_READ_AHEAD_BYTES = 64 << 20


class PersistTarget(Protocol):
    """What the persister needs of a journal: its current spec and its fragment index."""

    @property
    def spec(self) -> pb.JournalSpec: ...

    @property
    def index(self) -> FragmentIndex: ...


@dataclass(slots=True, eq=False)
class _Job:
    spool: Spool
    target: PersistTarget
    store: str  # The store URL whose queue holds the job ("" for none).
    size: int
    compressed: Path | None = None
    check_existing: bool = False  # A replica's spool: skip it if the store covers it.
    attempt: asyncio.Future[None] | None = None  # Done when the attempt in progress ends.
    finished: bool = False  # No longer counted (persisted, dropped or let go of).
    queued: bool = False  # Queued for its store, and counted in its backlog (`_put`).


def _keep_registers(target: PersistTarget, spool: Spool) -> None:
    """Before a persisted spool's files go: its journal keeps the registers at its end, if it
    keeps registers (`Replica.keep_registers`)."""
    keep = getattr(target, "keep_registers", None)
    if keep is not None:
        keep(spool)


class Persister:
    def __init__(
        self,
        stores: StoreRegistry,
        scratch_dir: Path,
        *,
        health: StoreHealthMonitor | None = None,
        backlog_limit: int = DEFAULT_BACKLOG_LIMIT,
        workers_per_store: int = WORKERS_PER_STORE,
    ) -> None:
        self.stores = stores
        self.scratch_dir = scratch_dir
        self.health = health or StoreHealthMonitor(stores, scratch_dir)
        self.backlog_limit = backlog_limit
        self.workers_per_store = workers_per_store
        self.call_deadline = STORE_CALL_DEADLINE_SECONDS
        self.put_bytes_per_second = PUT_DEADLINE_BYTES_PER_SECOND
        self._queues: dict[str, asyncio.Queue[_Job]] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._backlog: dict[str, int] = {}
        self._last_error: dict[str, str] = {}
        self._pending = 0
        # Closed spools of journals without stores, by journal, until a store is configured.
        self._parked: dict[str, list[_Job]] = {}
        self._delayed: dict[asyncio.TimerHandle, _Job] = {}
        # Unfinished jobs (queued, delayed, being attempted or waiting to retry), by journal.
        self._jobs_of: dict[str, set[_Job]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._compress_pool = ThreadPoolExecutor(
            max(1, os.cpu_count() or 1), thread_name_prefix="pygazette-compress"
        )
        self.persisted_count = 0
        self.persisted_bytes = 0
        self.uploaded_bytes = 0
        self.exiting = False  # The broker is exiting (`exit`).
        self._exited = asyncio.Event()

    def start(self) -> None:
        """Clear compression leftovers of an earlier run (spools themselves are recovered)."""
        if self.scratch_dir.is_dir():
            for leftover in self.scratch_dir.glob(_SCRATCH_PREFIX + "*"):
                leftover.unlink(missing_ok=True)

    async def stop(self) -> None:
        for handle in self._delayed:
            handle.cancel()
        self._delayed.clear()
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers.clear()
        for queue in self._queues.values():
            while not queue.empty():
                job = queue.get_nowait()
                self._discard_compressed(job)
        self._queues.clear()
        await self.health.stop()
        self._compress_pool.shutdown(wait=False, cancel_futures=True)

    # Queueing.
    def enqueue(
        self,
        spool: Spool,
        target: PersistTarget,
        *,
        check_existing: bool = False,
        recovered: bool = False,
    ) -> None:
        """Persist the closed `spool` of `target` to the journal's first store.

        With `check_existing` (a replica's spool), wait a little and skip the upload if the
        store already holds a fragment covering the spool. `recovered`: a spool completed
        before (by an earlier replica, or run, or parked here), not counted completed again.
        """
        stores = list(target.spec.fragment.stores)
        job = _Job(spool, target, stores[0] if stores else "", spool.end - spool.begin)
        job.check_existing = check_existing
        if job.size and not recovered:
            SPOOL_COMPLETED.inc()
        self._jobs_of.setdefault(spool.journal, set()).add(job)
        self._pending += 1
        self._idle.clear()
        if not check_existing:
            self._put(job)
            return

        def release() -> None:
            self._delayed.pop(handle, None)
            self._put(job)

        handle = asyncio.get_running_loop().call_later(REPLICA_PERSIST_DELAY_SECONDS, release)
        self._delayed[handle] = job

    def unpark(self, journal: str) -> None:
        """Persist `journal`'s spools kept while it had no store (its spec now names one)."""
        for job in self._parked.pop(journal, []):
            if not job.spool.deleted:
                self.enqueue(
                    job.spool, job.target, check_existing=job.check_existing, recovered=True
                )

    def expedite(self) -> None:
        """Stop delaying replicas' spools (the broker is shutting down)."""
        for handle, job in list(self._delayed.items()):
            handle.cancel()
            self._put(job)
        self._delayed.clear()

    def exit(self) -> None:
        """The broker is exiting: stop delaying replicas' spools, and persist a spool whose
        store refuses it for want of authorization (`StoreAuthError`: permission denied, no
        such bucket) to its journal's next store, as Gazette's broker does once it exits,
        rather than leave it on this broker's disk, which may not outlive the broker (a
        replica of a journal of replication 1 holds its only copy). Jobs waiting to retry
        try again now."""
        self.exiting = True
        self._exited.set()
        self.expedite()

    def _fallback(self, job: _Job, stores: list[str], exc: BaseException) -> str | None:
        """The store to move `job` to after `exc`, if the broker is exiting and its store
        refused it for want of authorization: the journal's next store (Gazette's Persist
        with isExiting)."""
        if not self.exiting or not isinstance(exc, StoreAuthError) or job.store not in stores:
            return None
        later = stores[stores.index(job.store) + 1 :]
        return later[0] if later else None

    async def _wait_to_retry(self, job: _Job, backoff: float) -> None:
        """`backoff` seconds (at most EXITING_RETRY_SECONDS once the broker exits), or less:
        until the store, unhealthy, checks healthy again, or the broker begins to exit (a job
        may then move to another store, `_fallback`).

        A failure against a store believed healthy asks for a check now; one known to be
        unhealthy is checked on its own back-off. Retrying at every check's end made a store
        that fails at once (a missing directory; or a journal's own path failing while the
        store checks healthy) a loop of ~500 attempts a second, each a warning, and so it
        was while exiting: the exit wakes a waiting job once, not every retry after it."""
        health = self.health.get(job.store)
        if health.healthy:
            health.check_soon()
        exiting = self.exiting
        if exiting:
            backoff = min(backoff, EXITING_RETRY_SECONDS)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + backoff
        while (remaining := deadline - loop.time()) > 0:
            was_healthy = health.healthy
            waits: list[asyncio.Future[Any]] = [
                asyncio.ensure_future(health.wait_change(remaining))
            ]
            if not exiting:
                waits.append(asyncio.ensure_future(self._exited.wait()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            if (self.exiting and not exiting) or (health.healthy and not was_healthy):
                return

    def _put(self, job: _Job) -> None:
        if job.finished:
            return
        queue = self._queues.get(job.store)
        if queue is None:
            queue = self._queues[job.store] = asyncio.Queue()
            for i in range(self.workers_per_store if job.store else 1):
                self._workers.append(
                    asyncio.create_task(self._work(queue), name=f"persist:{job.store}:{i}")
                )
            if job.store:
                self.health.get(job.store)  # Start checking the store's health.
        self._backlog[job.store] = self._backlog.get(job.store, 0) + job.size
        job.queued = True
        queue.put_nowait(job)

    def release(self, journal: str, directory: Path) -> asyncio.Future[None] | None:
        """Let go of `journal`'s spools in `directory` without persisting them, for a new
        replica of it to recover them there (and persist them) as a restart would: those of
        a stopped replica still waiting here share its files, which persisting removes.
        Each spool is closed, its files left in place, and its job ends. None once done;
        if one is being persisted (which may remove its files), nothing is let go of and
        this is a future done when that attempt ends (its store calls have deadlines): call
        again then. Let go of, they leave the backlog at once."""
        jobs = [j for j in self._jobs_of.get(journal, ()) if j.spool.directory == directory]
        for job in jobs:
            if job.attempt is not None:
                return job.attempt
        for job in jobs:
            job.spool.detach()  # Its worker drops it when it next looks (`spool.deleted`).
            # No longer counted now (its worker may wait out a retry backoff first): the new
            # replica counts its spools again as it recovers them.
            self._finish(job)
        for handle, job in list(self._delayed.items()):
            if job.finished:
                handle.cancel()
                del self._delayed[handle]
        parked = self._parked.get(journal, [])
        for job in parked:
            if job.spool.directory == directory:
                job.spool.detach()
        parked[:] = [j for j in parked if not j.spool.deleted]
        if not parked:
            self._parked.pop(journal, None)
        return None

    def persisting(self, journal: str, directory: Path) -> bool:
        """Whether spools of `journal` in `directory` wait here to persist (a stopped
        replica's: their jobs read and remove the files there)."""
        return any(
            j.spool.directory == directory and not j.spool.deleted
            for j in self._jobs_of.get(journal, ())
        )

    def _finish(self, job: _Job) -> None:
        if job.finished:
            return
        job.finished = True
        jobs = self._jobs_of.get(job.spool.journal)
        if jobs is not None:
            jobs.discard(job)
            if not jobs:
                del self._jobs_of[job.spool.journal]
        if job.queued:  # A replica's spool may be let go of before its delay ends.
            self._backlog[job.store] -= job.size
        self._discard_compressed(job)
        self._pending -= 1
        if self._pending == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Wait until everything queued has persisted."""
        await self._idle.wait()

    # Backpressure.
    def backlog_bytes(self, store: str) -> int:
        """Bytes of closed spools waiting to persist to `store`."""
        return self._backlog.get(store, 0)

    def backlogs(self) -> dict[str, int]:
        """Bytes of closed spools waiting to persist, by store URL ("": no store)."""
        return dict(self._backlog)

    def refusal(self, spec: pb.JournalSpec) -> str:
        """Why appends to `spec`'s journal must be refused now ("" if they need not be)."""
        if not spec.fragment.stores:
            return ""
        store = spec.fragment.stores[0]
        backlog = self._backlog.get(store, 0)
        if backlog <= self.backlog_limit:
            return ""
        health = self.health.get(store)
        reason = health.error if health.error not in (None, FIRST_CHECK_PENDING) else None
        reason = reason or self._last_error.get(store) or "persisting is falling behind"
        return (
            f"fragment store {store} unhealthy: {reason}; {backlog} bytes of spools await "
            f"persistence (limit {self.backlog_limit})"
        )

    # Work.
    async def _work(self, queue: asyncio.Queue[_Job]) -> None:
        while True:
            # In a call of its own: a worker waiting for the next job holds nothing of the
            # last one (its spool, and the journal's replica, stopped since maybe).
            await self._run(await queue.get())

    async def _run(self, job: _Job) -> None:
        try:
            moved = await self._attempt_until_done(job)
        except asyncio.CancelledError:
            self._discard_compressed(job)
            raise
        except Exception:  # A bug, not a store failure: never lose the worker.
            log.exception("persisting a spool failed unexpectedly; dropping the job")
            self._finish(job)
            return
        if moved is not None and not job.finished:
            self._backlog[job.store] -= job.size
            job.store = moved
            self._put(job)
        elif moved is None:
            self._finish(job)

    async def _attempt_until_done(self, job: _Job) -> str | None:
        """Persist `job`, retrying; returns another store URL if the job must move there."""
        backoff = 0.1
        while True:
            spool = job.spool
            if spool.deleted:
                return None  # Dropped meanwhile (a listing showed it persisted).
            spec = job.target.spec
            stores = list(spec.fragment.stores)
            if spool.end == spool.begin:
                job.target.index.remove_local(spool)
                _keep_registers(job.target, spool)
                spool.delete()
                return None
            if not stores:
                # Nowhere to persist: the spool stays local (and in the index) until a
                # store is configured. Dropping it would lose acknowledged content and move
                # the journal's write head back.
                parked = self._parked.setdefault(spool.journal, [])
                parked[:] = [j for j in parked if not j.spool.deleted]
                parked.append(
                    _Job(spool, job.target, "", job.size, check_existing=job.check_existing)
                )
                return None
            if stores[0] != job.store and not (self.exiting and job.store in stores):
                return stores[0]  # Not where it was moved on exiting (`_fallback`).
            # Seen by `release`, which must not let go of the spool while it is persisted.
            attempt = job.attempt = asyncio.get_running_loop().create_future()
            try:
                try:
                    await self.persist(job, spec)
                finally:
                    job.attempt = None
                    attempt.set_result(None)
                if self._last_error.pop(job.store, None) is not None:
                    # The store works again: re-check its health now rather than on the
                    # failure backoff, so FragmentStoreHealth stops reporting the outage.
                    self.health.get(job.store).check_soon()
                return None
            except (StoreError, TemplateError, OSError) as exc:
                if spool.deleted:
                    return None
                self._last_error[job.store] = str(exc)
                fallback = self._fallback(job, stores, exc)
                if fallback is not None:
                    log.warning(
                        "persist refused while exiting; persisting to the journal's next store",
                        extra={"journal": spool.journal, "begin": spool.begin, "error": str(exc)},
                    )
                    return fallback
                log.warning(
                    "persist failed; will retry",
                    extra={"journal": spool.journal, "begin": spool.begin, "error": str(exc)},
                )
                await self._wait_to_retry(job, backoff)
                backoff = min(backoff * 2, MAX_RETRY_SECONDS)

    def put_deadline(self, size: int) -> float:
        """Seconds a put of `size` bytes may go without progress before it is abandoned."""
        return self.call_deadline + min(size, PUT_READ_AHEAD_BYTES) / self.put_bytes_per_second

    async def _put_within(
        self,
        size: int,
        what: str,
        put: Callable[[Callable[[int], None]], Awaitable[None]],
    ) -> None:
        """`put(progress)`, a store's put, abandoned (cancelled) once it made no progress
        for `put_deadline(size)` seconds: a StoreError then. A put that keeps reading its
        file goes on, however slow the store (`FragmentStore.put_file`'s `progress`)."""
        stall = self.put_deadline(size)
        last = [time.monotonic()]

        def progress(_read: int) -> None:  # Any thread: one assignment.
            last[0] = time.monotonic()

        task = asyncio.ensure_future(put(progress))
        try:
            while (remaining := last[0] + stall - time.monotonic()) > 0:
                done, _ = await asyncio.wait([task], timeout=remaining)
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()  # Abandoned: it lands nothing it reads from now on.
                await asyncio.wait([task])  # Our own cancellation still propagates.
                if not task.cancelled():
                    task.exception()  # Retrieved: the attempt fails as abandoned.
        raise StoreError(f"{what} timed out after {stall:g}s without progress")

    @staticmethod
    async def _within(seconds: float, what: str, call: Awaitable[T]) -> T:
        """`call`, a store call, abandoned (cancelled) past `seconds`: a StoreError then."""
        try:
            async with asyncio.timeout(seconds):
                return await call
        except TimeoutError as exc:
            raise StoreError(f"{what} timed out after {seconds:g}s") from exc

    async def _in_pool(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._compress_pool, fn, *args)

    async def persist(self, job: _Job, spec: pb.JournalSpec) -> None:
        """One attempt at persisting `job` to `job.store`."""
        spool = job.spool
        frag = await self._in_pool(spool.fragment)  # Finishes hashing off the event loop.
        frag.backing_store = job.store
        frag.path_postfix = evaluate_path_postfix(spec, frag, spool.first_append_time)
        path = fragment_content_path(frag)
        store = self.stores.get(job.store)
        exists = await self._within(self.call_deadline, f"checking {path}", store.exists(path))
        if job.check_existing:
            # A replica's spool: usually its primary persisted the very same fragment (one
            # look at its path), else maybe others covering it (a listing of the journal).
            covering = (
                [frag]
                if exists
                else await self._within(
                    self.call_deadline,
                    f"listing {frag.journal}",
                    self._covering(store, frag, getattr(job.target, "is_journal", None)),
                )
            )
            if covering:
                index = job.target.index
                for other in covering:
                    other.backing_store = job.store
                    if other is frag:
                        frag.mod_time = int(time.time())
                    index.add_persisted(other)
                index.remove_local(spool)
                _keep_registers(job.target, spool)
                spool.delete()
                SPOOL_PERSISTED.inc()
                return
        if exists:
            log.info("fragment already persisted", extra={"journal": frag.journal, "path": path})
        else:
            encoding = "gzip" if frag.compression_codec == pb.GZIP_OFFLOAD_DECOMPRESSION else ""
            if frag.compression_codec == pb.NONE:
                # Read by its path: not reused if the spool is deleted meanwhile (`Spool`).
                # An abandoned put reads it no more (`FragmentStore.put_file`): the retry
                # reads it again, and a spool deleted since may be reused.
                with spool.open_content_path() as source:
                    size = source.stat().st_size
                    await self._put_within(
                        size,
                        f"put of {path}",
                        lambda progress: store.put_file(
                            path, source, content_encoding=encoding, progress=progress
                        ),
                    )
            else:
                if job.compressed is None:
                    job.compressed = await self._in_pool(self._compress, spool)
                # Kept for the retry if this put fails or is abandoned (`_finish` removes it).
                source = job.compressed
                size = source.stat().st_size
                await self._put_within(
                    size,
                    f"put of {path}",
                    lambda progress: store.put_file(
                        path, source, content_encoding=encoding, disposable=True, progress=progress
                    ),
                )
            self.uploaded_bytes += size
            STORE_PUT_BYTES.labels(job.store, encoding or "none").inc(size)  # As Gazette.
        frag.mod_time = int(time.time())
        index = job.target.index
        index.add_persisted(frag)
        index.remove_local(spool)
        _keep_registers(job.target, spool)
        spool.delete()
        self.persisted_count += 1
        SPOOL_PERSISTED.inc()
        self.persisted_bytes += frag.end - frag.begin
        log.info(
            "persisted fragment",
            extra={"journal": frag.journal, "begin": frag.begin, "end": frag.end, "path": path},
        )

    @staticmethod
    async def _covering(
        store: FragmentStore, frag: pb.Fragment, is_journal: Callable[[str], bool] | None = None
    ) -> list[pb.Fragment]:
        """Fragments in `store` that cover all of `frag` between them, one after another
        (empty if none do): as the fragment index drops a closed spool that a listing
        covers (`FragmentIndex.replace_persisted`), so a replica's spool is not uploaded
        beside what the cluster persisted over the same offsets either. Usually the run is
        the primary's one fragment of the same name; it is several where the primary's
        spools were cut at other offsets, and content the replica alone holds there (an
        append in doubt, confirmed here while the journal went on without this broker)
        would otherwise be persisted beside the journal's own content."""
        listed: list[pb.Fragment] = []
        for obj in await store.list_files(frag.journal + "/"):
            try:
                other = parse_fragment_path(frag.journal, obj.path)
            except ValidationError:
                continue
            if is_journal is not None and under_another_journal(frag.journal, other, is_journal):
                continue  # A nested journal's (`Replica.list_stores`).
            if other.end > frag.begin and other.begin < frag.end:
                other.mod_time = obj.mod_time
                listed.append(other)
        cover: CoverSet[pb.Fragment] = CoverSet()
        for other in sorted(listed, key=lambda f: (f.begin, -f.end)):
            cover.add(other)
        return cover.items() if cover.covers(frag.begin, frag.end) else []

    def _compress(self, spool: Spool) -> Path:
        """Worker thread: the spool's content compressed into a scratch file."""
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        # Our own descriptor: the spool's may be closed if it is dropped meanwhile (and its
        # file is then not reused, `Spool.open_content_path`, until this one is closed).
        with spool.open_content_path() as content:
            src = os.open(content, os.O_RDONLY)
            fd, tmp = tempfile.mkstemp(dir=self.scratch_dir, prefix=_SCRATCH_PREFIX)
            try:
                os.fchmod(fd, 0o644)  # A file store may link it in place: readable like a copy.
                with os.fdopen(fd, "wb") as out:
                    codecs.compress_file(spool.codec, src, spool.end - spool.begin, out)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            finally:
                os.close(src)
        return Path(tmp)

    @staticmethod
    def _discard_compressed(job: _Job) -> None:
        if job.compressed is not None:
            job.compressed.unlink(missing_ok=True)
            job.compressed = None
