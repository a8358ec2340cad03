"""Rolling spools (by length, at UTC flush-interval boundaries even without appends, on codec
change) and the persister's handling of stores (moves, duplicates, templates, backlog)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pygazette.broker.fragment.persister import Persister
from pygazette.broker.fragment.spool import Spool
from pygazette.broker.replica import Replica
from pygazette.protocol.fragment_name import fragment_content_path
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores import codecs
from pygazette.stores.store import StoreRegistry
from tests.broker.rpc_helpers import journal_spec


async def _until(predicate, within: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _commit(replica: Replica, data: bytes) -> None:
    """Commit one append straight into the replica's spool (what the append RPC does)."""
    spool = replica.open_spool(replica.head)
    pending = spool.start_append()
    pending.write(data)
    spool.commit(pending, None)
    replica.index.spool_committed()
    if replica.spool_needs_roll(time.time()):
        replica.close_spool()


class Harness:
    def __init__(self, root: Path, backlog_limit: int = 1 << 30) -> None:
        self.root = root
        self.stores = StoreRegistry(root / "fragments")
        (root / "fragments").mkdir(parents=True, exist_ok=True)
        self.persister = Persister(self.stores, root / "scratch", backlog_limit=backlog_limit)
        self.replicas: list[Replica] = []

    def replica(self, spec: pb.JournalSpec) -> Replica:
        r = Replica(
            spec,
            1,
            spool_root=self.root / "spools",
            stores=self.stores,
            persister=self.persister,
            sync=False,
        )
        r.start()
        self.replicas.append(r)
        return r

    async def close(self) -> None:
        for r in self.replicas:
            await r.stop(persist=False)
        await self.persister.stop()


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        await h.close()


def test_flush_boundaries_are_utc_multiples_of_whole_seconds(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    spec = journal_spec("roll/utc")
    spec.fragment.flush_interval.seconds = 3600
    spec.fragment.flush_interval.nanos = 900_000_000  # Truncated, as Gazette does.
    r = Replica(spec, 1, spool_root=tmp_path, stores=h.stores, persister=h.persister, sync=False)
    assert r.flush_interval() == 3600
    # The spool holding the journal's first write rolls right after it (Gazette's rule), so
    # flush boundaries are checked on the spool after it.
    first = r.open_spool(0)
    pending = first.start_append()
    pending.write(b"x")
    first.commit(pending, None)
    first.first_append_time = 3600.0
    assert r.spool_needs_roll(3600.0)
    first.close()
    r.spool = None  # Rolled (not queued for persistence: this replica has no event loop).
    r.spool = r.open_spool(1)
    assert r.flush_deadline(7000.0) == 7200.0  # Empty: the boundary after now.
    r.spool.first_append_time = 3599.9
    assert r.flush_deadline(7000.0) == 3600.0
    pending = r.spool.start_append()
    pending.write(b"x")
    r.spool.commit(pending, None)
    r.spool.first_append_time = 3599.9
    assert r.spool_needs_roll(3600.0)
    r.spool.first_append_time = 3600.0
    assert not r.spool_needs_roll(7199.99) and r.spool_needs_roll(7200.0)
    r.spool.delete()
    first.delete()


async def test_idle_spool_rolls_at_the_flush_boundary(harness: Harness) -> None:
    spec = journal_spec("roll/flush", codec=pb.GZIP)
    spec.fragment.flush_interval.seconds = 1  # Below Apply's minimum; fine in-process.
    r = harness.replica(spec)
    await r.index.first_refresh_done.wait()
    # The journal's first write rolls right after it (Gazette's rule): flush on a later spool.
    _commit(r, b"first\n")
    assert r.spool is None
    await _until(lambda: harness.persister.persisted_count == 1)
    _commit(r, b"one line\n")
    assert r.spool is not None
    # No more appends: the timer rolls the spool at the next whole second, and it persists.
    await _until(lambda: harness.persister.persisted_count == 2)
    assert r.spool is None
    [_, frag] = r.index.persisted()
    assert (frag.begin, frag.end, frag.compression_codec) == (6, 15, pb.GZIP)
    path = harness.root / "fragments" / fragment_content_path(frag)
    assert codecs.decompress(pb.GZIP, path.read_bytes()) == b"one line\n"
    assert path.stat().st_mode & 0o777 == 0o644  # Hard-linked from scratch, yet readable.
    assert abs(path.stat().st_mtime - time.time()) < 60
    # The next append opens a new spool after the persisted fragment.
    _commit(r, b"two\n")
    assert r.spool is not None and r.spool.begin == 15


async def test_roll_by_length_and_on_codec_change(harness: Harness) -> None:
    spec = journal_spec("roll/codec", codec=pb.SNAPPY, length=1024)
    r = harness.replica(spec)
    await r.index.first_refresh_done.wait()
    _commit(r, b"a" * 1500)  # Past the length: rolls right after the commit.
    assert r.spool is None
    _commit(r, b"b" * 100)
    new = pb.JournalSpec()
    new.CopyFrom(spec)
    new.fragment.compression_codec = pb.ZSTANDARD
    r.update_spec(new, 2)  # The open spool rolls at once, keeping its codec.
    await _until(lambda: harness.persister.persisted_count == 2)
    _commit(r, b"c" * 10)
    assert r.spool is not None and r.spool.codec == pb.ZSTANDARD
    assert [f.compression_codec for f in r.index.persisted()] == [pb.SNAPPY, pb.SNAPPY]


async def test_persister_moves_jobs_to_the_current_first_store(harness: Harness) -> None:
    # The first store is a file store outside every root: unwritable.
    broken = "file:///broken/"
    (harness.root / "fragments" / "broken").write_text("a file, not a directory")
    spec = journal_spec("roll/move", stores=[broken], length=1024)
    r = harness.replica(spec)
    await r.index.first_refresh_done.wait()
    _commit(r, b"x" * 2000)
    await _until(lambda: harness.persister.backlog_bytes(broken) == 2000)
    await _until(lambda: bool(harness.persister._last_error.get(broken)))
    assert harness.persister.persisted_count == 0
    moved = pb.JournalSpec()
    moved.CopyFrom(spec)
    moved.fragment.stores[:] = ["file:///fixed/"]
    (harness.root / "fragments" / "fixed").mkdir()  # A store's directory must exist.
    r.update_spec(moved, 2)
    await _until(lambda: harness.persister.persisted_count == 1)
    assert harness.persister.backlog_bytes(broken) == 0
    assert list((harness.root / "fragments" / "fixed" / "roll" / "move").iterdir())


def _count_persists(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the persister's attempts: a one-item list, incremented by each."""
    attempts = [0]
    persist = Persister.persist

    async def counting(self: Persister, *args: object, **kwargs: object) -> None:
        attempts[0] += 1
        await persist(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Persister, "persist", counting)
    return attempts


async def _refused_persist(harness: Harness, journal: str, store: str) -> None:
    """Commit past `journal`'s fragment length (its only store `store`), and wait for the
    persist of the rolled spool to fail."""
    r = harness.replica(journal_spec(journal, stores=[store], length=1024))
    await r.index.first_refresh_done.wait()
    _commit(r, b"x" * 2000)
    await _until(lambda: bool(harness.persister._last_error.get(store)))


@pytest.mark.parametrize("blocked", ["store", "journal"])
async def test_a_store_failing_at_once_is_retried_with_a_back_off(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, blocked: str
) -> None:
    # A put refused at once: the store's directory missing (the store is unhealthy), or the
    # journal's directory in it blocked by a file (the store checks healthy). Each failed
    # attempt asked for an immediate health check, which ended as fast and woke the attempt
    # again: ~500 attempts a second, each logging a warning. Retries now back off; a store
    # that checks healthy again is retried at once.
    store_dir = harness.root / "fragments" / "missing"
    if blocked == "journal":
        (store_dir / "roll").mkdir(parents=True)
        (store_dir / "roll" / "refused").write_text("a file where the journal's directory goes")
    attempts = _count_persists(monkeypatch)
    await _refused_persist(harness, "roll/refused", "file:///missing/")
    await asyncio.sleep(2.0)  # A rate: attempts in this time.
    assert attempts[0] < 20, attempts[0]
    assert harness.persister.persisted_count == 0
    if blocked == "store":
        store_dir.mkdir()  # Mounted: persisted once a check finds it healthy.
        await _until(lambda: harness.persister.persisted_count == 1, within=30)


async def test_backlog_past_the_bound_refuses_with_the_store_error(tmp_path: Path) -> None:
    h = Harness(tmp_path, backlog_limit=3000)
    try:
        (h.root / "fragments" / "broken").write_text("not a directory")
        spec = journal_spec("roll/bound", stores=["file:///broken/"], length=1024)
        r = h.replica(spec)
        await r.index.first_refresh_done.wait()
        _commit(r, b"x" * 2000)
        assert r.append_refusal() == ""
        _commit(r, b"y" * 2000)
        refusal = r.append_refusal()
        assert refusal.startswith("fragment store file:///broken/ unhealthy: ")
        assert "4000 bytes of spools await persistence (limit 3000)" in refusal
        # Without stores the spools are dropped: a journal without stores keeps no history.
        dropped = pb.JournalSpec()
        dropped.CopyFrom(spec)
        del dropped.fragment.stores[:]
        r.update_spec(dropped, 2)
        await _until(lambda: h.persister.backlog_bytes("file:///broken/") == 0)
        assert r.append_refusal() == ""
    finally:
        await h.close()


async def test_fragment_already_in_the_store_is_not_uploaded_again(harness: Harness) -> None:
    spec = journal_spec("roll/dupe", length=1024)
    r = harness.replica(spec)
    await r.index.first_refresh_done.wait()
    _commit(r, b"z" * 1024)
    await _until(lambda: harness.persister.persisted_count == 1)
    assert harness.persister.uploaded_bytes == 1024
    # The same spool again (as if a crash came after the upload, before its removal).
    spool = r.open_spool(0)
    pending = spool.start_append()
    pending.write(b"z" * 1024)
    spool.commit(pending, None)
    r.close_spool()
    await _until(lambda: harness.persister.persisted_count == 2)
    assert harness.persister.uploaded_bytes == 1024


async def test_a_synced_commit_cut_short_still_takes_its_registers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Single node, --sync: an append's commit runs on a worker thread, which goes on when
    the append is cancelled (its client went away) during the fdatasync. The append is then
    in the spool's log: the journal's registers must be the ones it set (as a restart finds
    them), or a later append's check_registers is checked against registers of the past."""
    h = Harness(tmp_path)
    r = Replica(
        journal_spec("roll/cancelled"),
        1,
        spool_root=tmp_path / "spools",
        stores=h.stores,
        persister=h.persister,
        sync=True,
    )
    release, entered = threading.Event(), threading.Event()
    original = Spool.commit

    def slow_commit(self: Spool, *args: object, **kwargs: object) -> None:
        entered.set()
        release.wait(10)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Spool, "commit", slow_commit)
    spool, pending, running = r.start_append()
    pending.write(b"record\n")
    running.update(b"record\n")
    fenced = label_set({"owner": "new"})
    commit = asyncio.ensure_future(r.commit_append(spool, pending, running, None, fenced))
    assert await asyncio.to_thread(entered.wait, 10)
    commit.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await commit
    await _until(lambda: spool.end == 7)  # The worker thread went on: the append is in.
    assert r.registers == fenced

    restarted = Replica(
        journal_spec("roll/cancelled"),
        1,
        spool_root=tmp_path / "spools",
        stores=h.stores,
        persister=h.persister,
        sync=True,
    )
    restarted.recover_spools()
    assert restarted.registers == fenced
    spool.delete()
    await h.persister.stop()


async def test_a_store_failing_at_once_is_retried_with_a_back_off_while_exiting(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Exiting, a job's retries were woken by every health check's end: the store checks
    # healthy, the journal's own path fails at once (not an authorization refusal, so no
    # next store), and each failure asked for a check that passed as fast: a loop of
    # attempts, each a warning, for the whole of the broker's persist deadline. The exit
    # itself wakes a waiting job once; its retries then back off.
    store_dir = harness.root / "fragments" / "blocked"
    (store_dir / "roll").mkdir(parents=True)
    (store_dir / "roll" / "exiting").write_text("a file where the journal's directory goes")
    attempts = _count_persists(monkeypatch)
    await _refused_persist(harness, "roll/exiting", "file:///blocked/")
    harness.persister.exit()
    woken = attempts[0]
    await _until(lambda: attempts[0] > woken)  # The exit wakes the waiting job at once.
    await asyncio.sleep(2.0)  # A rate: attempts in this time.
    assert attempts[0] - woken < 20, attempts[0] - woken
    assert harness.persister.persisted_count == 0
