"""The persister's store calls have deadlines: a put that hangs is abandoned (cancelled, and
it lands nothing it reads after), the attempt fails and is retried from the same spool file,
and a new replica waiting for the attempt (`Persister.release`) waits no longer than that.
A job let go of leaves its store's backlog at once, so each pending byte counts once."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import obstore.store
import pytest

from pygazette.broker.fragment import persister as persister_module
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.fragment.spool import Spool
from pygazette.broker.metrics import SPOOL_COMPLETED
from pygazette.protocol.fragment_name import fragment_content_path
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores import object_store
from pygazette.stores.file_store import FileStore
from pygazette.stores.interface import FragmentStore
from pygazette.stores.object_store import ObjectStore
from pygazette.stores.store import StoreError, StoreRegistry
from pygazette.stores.store_url import parse_store_url
from tests.broker.rpc_helpers import journal_spec

JOURNAL = "a/journal"
STORE = "file:///"


async def _until(predicate: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def _closed_spool(directory: Path, data: bytes, begin: int = 0) -> Spool:
    spool = Spool.create(directory, JOURNAL, begin, pb.NONE, pb.LabelSet(), sync=False)
    pending = spool.start_append()
    pending.write(data)
    spool.commit(pending, None)
    spool.close()
    return spool


class _Target:
    """A journal as the persister sees it: its spec and (a stand-in for) its index."""

    def __init__(self) -> None:
        self.spec = journal_spec(JOURNAL, stores=[STORE])
        self.persisted: list[pb.Fragment] = []
        self.index = SimpleNamespace(
            add_persisted=self.persisted.append, remove_local=lambda spool: None
        )


class _HangingStore:
    """A file store whose first `hangs` puts wait for an event never set (a hung mount);
    `failing` puts fail as an unreachable store's do."""

    def __init__(self, store: FragmentStore, *, hangs: int = 0, failing: bool = False) -> None:
        self.store = store
        self.hangs = hangs
        self.failing = failing
        self.puts = 0
        self.abandoned = 0

    async def exists(self, path: str) -> bool:
        return await self.store.exists(path)

    async def put_file(self, path: str, local: Path, **kwargs: Any) -> None:
        self.puts += 1
        if self.failing:
            raise StoreError("store unreachable")
        if self.puts <= self.hangs:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.abandoned += 1
                raise
        await self.store.put_file(path, local, **kwargs)


def _persister(tmp_path: Path, store: _HangingStore) -> Persister:
    (tmp_path / "store").mkdir(exist_ok=True)  # A file store's directory must exist.
    persister = Persister(StoreRegistry(tmp_path / "store"), tmp_path / "scratch")
    persister.stores = SimpleNamespace(get=lambda url: store)  # type: ignore[assignment]
    persister.call_deadline = 0.3
    return persister


def _file_store(tmp_path: Path) -> FileStore:
    (tmp_path / "store").mkdir(exist_ok=True)
    return FileStore(parse_store_url(STORE), tmp_path / "store")


async def test_a_hung_put_is_abandoned_and_retried_from_the_same_file(tmp_path: Path) -> None:
    store = _HangingStore(_file_store(tmp_path), hangs=1)
    persister = _persister(tmp_path, store)
    spool = _closed_spool(tmp_path / "spools" / "a%2Fjournal", b"persisted at last")
    target = _Target()
    try:
        persister.enqueue(spool, target)  # type: ignore[arg-type]
        async with asyncio.timeout(10):
            await persister.wait_idle()
        # The hung put was abandoned and the attempt retried. (Under heavy load a retry's
        # real put can itself pass the 0.3 s deadline without progress, and is retried too.)
        assert store.abandoned == 1 and store.puts >= 2, (store.puts, store.abandoned)
        (frag,) = target.persisted
        stored = tmp_path / "store" / fragment_content_path(frag)
        assert stored.read_bytes() == b"persisted at last"
        assert spool.deleted and not spool.content_path.exists()
    finally:
        await persister.stop()


async def test_a_new_replica_waits_for_a_hung_put_no_longer_than_its_deadline(
    tmp_path: Path,
) -> None:
    store = _HangingStore(_file_store(tmp_path), hangs=1_000)  # Every put hangs.
    persister = _persister(tmp_path, store)
    directory = tmp_path / "spools" / "a%2Fjournal"
    spool = _closed_spool(directory, b"x" * 1000)
    try:
        persister.enqueue(spool, _Target())  # type: ignore[arg-type]
        await _until(lambda: store.puts == 1)
        # The journal's new replica asks for its spools: the put in progress is waited for.
        wait = persister.release(JOURNAL, directory)
        assert wait is not None
        started = time.monotonic()
        async with asyncio.timeout(5):  # Without a deadline it never ends.
            await wait
        assert time.monotonic() - started < persister.put_deadline(1000) + 1
        assert store.abandoned == 1
        assert persister.release(JOURNAL, directory) is None  # Let go of, now.
        assert not persister.persisting(JOURNAL, directory)
        assert persister.backlog_bytes(STORE) == 0
        # The files are left where they were, whole, for the new replica to recover.
        recovered, _report = Spool.recover(spool.log_path, sync=False)
        assert recovered.read(0, 2000) == b"x" * 1000
        recovered.detach()
        # The persister's failure says why, as a failed put's does.
        assert "timed out after 0.3" in persister._last_error[STORE]
    finally:
        await persister.stop()


async def test_a_released_job_leaves_the_backlog_at_once(tmp_path: Path) -> None:
    store = _HangingStore(_file_store(tmp_path), failing=True)
    persister = _persister(tmp_path, store)
    directory = tmp_path / "spools" / "a%2Fjournal"
    spool = _closed_spool(directory, b"y" * 700)
    try:
        persister.enqueue(spool, _Target())  # type: ignore[arg-type]
        assert persister.backlog_bytes(STORE) == 700
        await _until(lambda: STORE in persister._last_error)  # Failed: retried on a backoff.
        while (attempt := persister.release(JOURNAL, directory)) is not None:
            await attempt  # Let go of between attempts, as a new replica's resolver does.
        assert persister.backlog_bytes(STORE) == 0  # Was 700 until the retry wait ended.
        # The new replica recovers the spool and queues it: its bytes count once.
        recovered, _report = Spool.recover(spool.log_path, sync=False)
        recovered.close()
        persister.enqueue(recovered, _Target())  # type: ignore[arg-type]
        assert persister.backlog_bytes(STORE) == 700  # Was 1400.
        # The old job's retry wait ends: the figure stays.
        persister.health.get(STORE).check_soon()
        await asyncio.sleep(0.3)
        assert persister.backlog_bytes(STORE) == 700
        store.failing = False
        async with asyncio.timeout(10):
            await persister.wait_idle()
        assert persister.backlog_bytes(STORE) == 0
        assert persister.persisted_count == 1
    finally:
        await persister.stop()


async def test_a_replica_spool_let_go_of_before_its_delay_ends_was_never_counted(
    tmp_path: Path,
) -> None:
    """A replica's spool waits REPLICA_PERSIST_DELAY_SECONDS before it is queued (and counted
    in the backlog); a new replica may let go of it before then."""
    store = _HangingStore(_file_store(tmp_path))
    persister = _persister(tmp_path, store)
    directory = tmp_path / "spools" / "a%2Fjournal"
    spool = _closed_spool(directory, b"z" * 300)
    try:
        persister.enqueue(spool, _Target(), check_existing=True)  # type: ignore[arg-type]
        assert persister.backlog_bytes(STORE) == 0  # Not queued yet.
        assert persister.release(JOURNAL, directory) is None
        assert persister.backlog_bytes(STORE) == 0
        async with asyncio.timeout(1):
            await persister.wait_idle()  # Its job ended.
        assert store.puts == 0
        assert spool.log_path.exists()  # Left for the new replica to recover.
    finally:
        await persister.stop()


async def test_a_replica_spool_its_primary_persisted_is_found_by_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica's spool is skipped when the store holds the same fragment (its primary's):
    one look at the fragment's path, not a listing of the journal's fragments."""
    monkeypatch.setattr(persister_module, "REPLICA_PERSIST_DELAY_SECONDS", 0.0)
    files = _file_store(tmp_path)
    store = _HangingStore(files)
    listings: list[str] = []

    async def list_files(prefix: str) -> Any:
        listings.append(prefix)
        return await files.list_files(prefix)

    store.list_files = list_files  # type: ignore[attr-defined]
    persister = _persister(tmp_path, store)
    primary = _closed_spool(tmp_path / "primary" / "a%2Fjournal", b"w" * 200)
    replica = _closed_spool(tmp_path / "replica" / "a%2Fjournal", b"w" * 200)
    target = _Target()
    try:
        persister.enqueue(primary, target)  # type: ignore[arg-type]
        async with asyncio.timeout(10):
            await persister.wait_idle()
        persister.enqueue(replica, target, check_existing=True)  # type: ignore[arg-type]
        async with asyncio.timeout(10):
            await persister.wait_idle()
        assert store.puts == 1  # The primary's only.
        assert listings == []
        assert replica.deleted
        assert [(f.begin, f.end) for f in target.persisted] == [(0, 200), (0, 200)]
    finally:
        await persister.stop()


class _SlowStore:
    """A file store on a slow link: a put reads its file `chunk` bytes at a time, `pause`
    seconds apart (reporting its progress, as the stores do), then stores what it read."""

    def __init__(self, store: FragmentStore, scratch: Path, chunk: int, pause: float) -> None:
        self.store = store
        self.scratch = scratch
        self.chunk = chunk
        self.pause = pause
        self.puts = 0

    async def exists(self, path: str) -> bool:
        return await self.store.exists(path)

    async def put_file(
        self, path: str, local: Path, *, progress: Any = None, **kwargs: Any
    ) -> None:
        self.puts += 1
        copy = self.scratch / f"upload-{self.puts}"
        with open(local, "rb") as src, open(copy, "wb") as out:
            while chunk := src.read(self.chunk):
                await asyncio.sleep(self.pause)
                out.write(chunk)
                if progress is not None:
                    progress(out.tell())
        await self.store.put_file(path, copy)


async def test_a_slow_put_that_keeps_going_is_not_abandoned(tmp_path: Path) -> None:
    """A put is abandoned when it stalls, not when it is slow: a large fragment on a store
    slower than PUT_DEADLINE_BYTES_PER_SECOND was abandoned at its deadline at every attempt,
    each starting over, and never persisted (the persister never idle, its backlog held)."""
    (tmp_path / "scratch").mkdir()
    # 512 KiB at 160 KiB/s: 3.2 s, where a whole put had 0.3 s + 512 KiB / 256 KiB/s = 2.3 s.
    store = _SlowStore(_file_store(tmp_path), tmp_path / "scratch", 16 << 10, 0.1)
    persister = _persister(tmp_path, store)  # type: ignore[arg-type]
    persister.put_bytes_per_second = 256 << 10
    data = os.urandom(512 << 10)
    spool = _closed_spool(tmp_path / "spools" / "a%2Fjournal", data)
    target = _Target()
    try:
        persister.enqueue(spool, target)  # type: ignore[arg-type]
        async with asyncio.timeout(15):
            await persister.wait_idle()
        assert store.puts == 1
        (frag,) = target.persisted
        assert (tmp_path / "store" / fragment_content_path(frag)).read_bytes() == data
        assert persister.backlog_bytes(STORE) == 0
    finally:
        await persister.stop()


async def test_the_stores_report_a_put_s_progress(tmp_path: Path) -> None:
    source = tmp_path / "spool"
    source.write_bytes(os.urandom(3 << 20))
    files: list[int] = []
    await _file_store(tmp_path).put_file("j/frag", source, progress=files.append)
    assert files and files[-1] == 3 << 20
    (tmp_path / "bucket").mkdir()
    local = obstore.store.LocalStore(str(tmp_path / "bucket"))
    objects = ObjectStore(parse_store_url("s3://bucket/"), local)  # type: ignore[arg-type]
    uploaded: list[int] = []
    await objects.put_file("j/frag", source, progress=uploaded.append)
    assert uploaded and uploaded[-1] == 3 << 20


def _fifo(tmp_path: Path) -> Path:
    """A named pipe: a put reading it blocks until bytes are written into it."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _feed(fifo: Path, data: bytes) -> None:
    """Write `data` into `fifo` and close it, from a thread (opening blocks for a reader)."""

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(data)

    threading.Thread(target=write, daemon=True).start()


async def _abandon_a_put_then_let_it_read(store: FragmentStore, tmp_path: Path) -> None:
    fifo = _fifo(tmp_path)
    put = asyncio.ensure_future(store.put_file("j/frag", fifo))
    await asyncio.sleep(0.2)  # Its thread is blocked reading.
    put.cancel()
    await asyncio.gather(put, return_exceptions=True)
    _feed(fifo, b"bytes read after the put was abandoned")  # E.g. a reused spool file's.


async def test_an_abandoned_file_store_put_lands_nothing(tmp_path: Path) -> None:
    store = _file_store(tmp_path)
    await _abandon_a_put_then_let_it_read(store, tmp_path)
    target = tmp_path / "store" / "j"
    await _until(lambda: target.is_dir() and not any(target.iterdir()))  # Its temp file gone.
    await asyncio.sleep(0.2)
    assert not (target / "frag").exists()


async def test_an_abandoned_object_store_put_lands_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bucket").mkdir()
    local = obstore.store.LocalStore(str(tmp_path / "bucket"))
    store = ObjectStore(parse_store_url("s3://bucket/"), local)  # type: ignore[arg-type]
    source = tmp_path / "spool"
    source.write_bytes(b"the spool's content")
    # Its first read hangs (a slow disk, a stalled upload) until the put was abandoned.
    reading, abandoned = threading.Event(), threading.Event()
    readinto = object_store._PutSource.readinto

    def slow_readinto(self: object_store._PutSource, buffer: Any) -> int:
        reading.set()
        abandoned.wait(10)
        return readinto(self, buffer)

    monkeypatch.setattr(object_store._PutSource, "readinto", slow_readinto)
    put = asyncio.ensure_future(store.put_file("j/frag", source))
    await asyncio.to_thread(reading.wait, 10)
    put.cancel()
    await asyncio.gather(put, return_exceptions=True)
    source.write_bytes(b"another spool's bytes, reusing the file")
    abandoned.set()
    await asyncio.sleep(0.5)
    assert not list((tmp_path / "bucket").rglob("frag"))
    # Not abandoned, the same put lands.
    await store.put_file("j/frag", source)
    assert (tmp_path / "bucket" / "j" / "frag").read_bytes() == source.read_bytes()


async def test_a_spool_counts_as_completed_once(tmp_path: Path) -> None:
    """gazette_spool_completed counts a spool when it completes: not again when a new
    replica recovers it, nor when it is queued again once its journal has a store."""
    store = _HangingStore(_file_store(tmp_path))
    persister = _persister(tmp_path, store)

    def completed() -> float:
        return SPOOL_COMPLETED._value.get()  # type: ignore[attr-defined]

    directory = tmp_path / "spools" / "a%2Fjournal"
    spool = _closed_spool(directory, b"v" * 100)
    storeless = _Target()
    storeless.spec.fragment.ClearField("stores")
    try:
        before = completed()
        persister.enqueue(spool, storeless)  # type: ignore[arg-type]
        await _until(lambda: JOURNAL in persister._parked)  # No store: kept for later.
        assert completed() == before + 1
        storeless.spec.fragment.stores.append(STORE)
        persister.unpark(JOURNAL)
        async with asyncio.timeout(10):
            await persister.wait_idle()
        assert completed() == before + 1
        again = _closed_spool(tmp_path / "other" / "a%2Fjournal", b"u" * 100, begin=100)
        persister.enqueue(again, _Target(), recovered=True)  # type: ignore[arg-type]
        async with asyncio.timeout(10):
            await persister.wait_idle()
        assert completed() == before + 1
        assert store.puts == 2
    finally:
        await persister.stop()
