"""Spool file reuse: a deleted spool's small files become the next spool's (no inode freed or
allocated), empty and recoverable; large ones are removed; nothing is left where recovery
looks."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from pygazette.broker.fragment import spool_files
from pygazette.broker.fragment.persister import Persister, _Job
from pygazette.broker.fragment.spool import Spool, SpoolCorrupt
from pygazette.broker.replica import spool_directory
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores.store import StoreRegistry
from tests.broker.rpc_helpers import journal_spec


def _append(spool: Spool, data: bytes) -> None:
    pending = spool.start_append()
    pending.write(data)
    spool.commit(pending, None)


def _inodes(spool: Spool) -> set[int]:
    return {os.stat(spool.content_path).st_ino, os.stat(spool.log_path).st_ino}


def test_a_deleted_spools_files_are_the_next_spools(tmp_path: Path) -> None:
    journal_dir = tmp_path / "spools" / "a%2Fjournal"
    first = Spool.create(journal_dir, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(first, b"persisted elsewhere")
    first.close()
    used = _inodes(first)
    first.delete()
    assert not list(journal_dir.iterdir())  # Nothing for recovery to find.
    pooled = list((tmp_path / "spools" / spool_files.POOL_DIR).iterdir())
    assert {p.stat().st_ino for p in pooled} == used
    assert all(p.stat().st_size == 0 and p.stat().st_blocks == 0 for p in pooled)  # No data.

    other_dir = tmp_path / "spools" / "b%2Fjournal"  # Any journal of the same root.
    second = Spool.create(other_dir, "b/journal", 40, pb.NONE, pb.LabelSet(), sync=True)
    assert _inodes(second) == used
    assert second.read(40, 100) == b""
    _append(second, b"fresh")
    second.detach()  # Killed: recovered from its own log, not the one it reused.
    got, report = Spool.recover(second.log_path, sync=False)
    assert (got.journal, got.begin, got.end, report.appends) == ("b/journal", 40, 45, 1)
    assert got.read(40, 100) == b"fresh"
    got.delete()


def test_large_files_are_removed(tmp_path: Path) -> None:
    journal_dir = tmp_path / "spools" / "a%2Fjournal"
    spool = Spool.create(journal_dir, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(spool, b"x" * (spool_files.MAX_BYTES + 1))
    spool.close()
    content = os.stat(spool.content_path).st_ino
    spool.delete()
    pool = tmp_path / "spools" / spool_files.POOL_DIR
    assert content not in {os.stat(p).st_ino for p in pool.iterdir()}
    assert len(list(pool.iterdir())) == 1  # The log was small: kept.


def test_a_pool_whose_directory_went_away_removes_files(tmp_path: Path) -> None:
    journal_dir = tmp_path / "spools" / "a%2Fjournal"
    spool = Spool.create(journal_dir, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(spool, b"x")
    (tmp_path / "spools" / spool_files.POOL_DIR).rmdir()  # Still empty: nothing deleted yet.
    spool.delete()
    assert not list(journal_dir.iterdir())


class _InterruptedStore:
    """A store whose put reads its file in two parts, calling `midway` between them (an
    upload in progress)."""

    def __init__(self) -> None:
        self.midway = lambda: None
        self.stored = b""

    async def exists(self, path: str) -> bool:
        return False

    async def put_file(
        self,
        path: str,
        local: Path,
        *,
        content_encoding: str = "",
        disposable: bool = False,
        progress: object = None,
    ) -> None:
        with open(local, "rb") as f:
            head = f.read(4)
            self.midway()
            self.stored = head + f.read()


async def test_a_file_being_persisted_is_not_reused_when_its_spool_is_deleted(
    tmp_path: Path,
) -> None:
    # A replica's persister uploads a closed spool while a store listing shows it persisted
    # (by the primary): `Replica.refresh` deletes it. The upload must still read the
    # spool's bytes, not those of the next spool (any journal's) that reuses its file.
    root = tmp_path / "spools"
    spool = Spool.create(root / "a%2Fjournal", "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(spool, b"the spool's own content")
    spool.close()
    store = _InterruptedStore()
    others: list[Spool] = []

    def delete_and_roll_another() -> None:
        spool.delete()
        other = Spool.create(
            root / "b%2Fjournal", "b/journal", 0, pb.NONE, pb.LabelSet(), sync=False
        )
        _append(other, b"another journal's bytes, longer")
        others.append(other)

    store.midway = delete_and_roll_another
    (tmp_path / "store").mkdir(exist_ok=True)  # A file store's directory must exist.
    persister = Persister(StoreRegistry(tmp_path / "store"), tmp_path / "scratch")
    persister.stores = SimpleNamespace(get=lambda url: store)  # type: ignore[assignment]
    index = SimpleNamespace(add_persisted=lambda frag: None, remove_local=lambda s: None)
    job = _Job(spool, SimpleNamespace(index=index), "file:///", 0)  # type: ignore[arg-type]
    with contextlib.suppress(FileNotFoundError):  # Its file is gone once the put returns.
        await persister.persist(job, journal_spec("a/journal"))
    assert store.stored == b"the spool's own content"
    assert others[0].read(0, 100) == b"another journal's bytes, longer"


def test_a_crash_while_a_spool_takes_pooled_files_leaves_no_other_spool_to_recover(
    tmp_path: Path,
) -> None:
    root = tmp_path / "spools"
    first = Spool.create(root / "a%2Fjournal", "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(first, b"journal a's content")
    first.close()
    first.delete()  # Persisted: its files are pooled.

    # Journal b's first spool (at 0, as journal a's was) takes them, as `Spool.create`
    # does, and the broker is killed before the spool writes its own header.
    _b_takes_the_pool_and_recovers_no_spool_of_a(root)


def test_files_a_killed_broker_left_in_the_pool_are_emptied_before_they_are_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Killed between `give`'s rename into the pool and its truncation: a next run must not
    # rename that file, a's log, into journal b's directory as it is.
    root = tmp_path / "spools"
    first = Spool.create(root / "a%2Fjournal", "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(first, b"journal a's content")
    first.close()
    first.detach()
    pool = root / spool_files.POOL_DIR
    for n, path in enumerate((first.log_path, first.content_path)):
        path.rename(pool / f"left-{n}")
    monkeypatch.setattr(spool_files, "_pools", {})  # The next run: pools are listed afresh.

    _b_takes_the_pool_and_recovers_no_spool_of_a(root)


def test_the_pool_is_no_journals_spool_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ".free" is a valid journal name: its spools must never be taken as pooled files.
    root = tmp_path / "spools"
    dotted = Spool.create(
        spool_directory(root, ".free"), ".free", 0, pb.NONE, pb.LabelSet(), sync=False
    )
    _append(dotted, b"acknowledged")
    dotted.detach()
    monkeypatch.setattr(spool_files, "_pools", {})  # A restart: pools are listed afresh.
    other = Spool.create(
        spool_directory(root, "b/journal"), "b/journal", 0, pb.NONE, pb.LabelSet(), sync=False
    )
    got, report = Spool.recover(dotted.log_path, sync=False)  # As the journal's replica.
    assert (got.journal, got.end, report.appends) == (".free", 12, 1)
    assert got.read(0, 100) == b"acknowledged"
    other.delete()
    got.delete()


def _b_takes_the_pool_and_recovers_no_spool_of_a(root: Path) -> None:
    """Journal b's first spool takes two pooled files (journal a's), as `Spool.create` does,
    and the broker is killed before it writes its header: recovering b's directory
    (`Replica.recover_spools`) finds no spool of a, and b's content file is empty."""
    b_dir = root / "b%2Fjournal"
    b_dir.mkdir()
    b = Spool(b_dir, "b/journal", 0, pb.NONE, sync=False)
    assert spool_files.take(b_dir, b.content_path) and spool_files.take(b_dir, b.log_path)
    with pytest.raises(SpoolCorrupt):
        Spool.recover(b.log_path, sync=False)
    assert b.content_path.stat().st_size == 0
