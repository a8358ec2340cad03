"""Spool file reuse: a deleted spool's small files become the next spool's (no inode freed or
allocated), empty and recoverable; large ones are removed; nothing is left where recovery
looks."""

from __future__ import annotations

import os
from pathlib import Path

from pygazette.broker.fragment import spool_files
from pygazette.broker.fragment.spool import Spool
from pygazette.protocol.pb import protocol_pb2 as pb


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
