"""Spool unit tests of a full disk, with ENOSPC injected at each write the spool makes.

The integration test (`test_full_disk.py`) fills a real tmpfs; these reach the failures it
cannot aim at: a commit record torn half-way, a header that does not fit.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import pygazette.broker.fragment.spool as spool_mod
from pygazette.broker.fragment.spool import InsufficientStorage, Spool, is_disk_full
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.support.small_fs import mounted_tmpfs


def _append(spool: Spool, data: bytes) -> None:
    pending = spool.start_append()
    pending.write(data)
    spool.commit(pending, None)


def _torn_write(fd: int, data: bytes) -> None:
    """Write half of `data`, then fail as a full disk does."""
    os.write(fd, data[: len(data) // 2])
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("sync", [False, True])
def test_torn_commit_record_is_cut_and_later_commits_recover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: bool
) -> None:
    spool = Spool.create(tmp_path, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=sync)
    _append(spool, b"one,")
    log_size = spool.log_path.stat().st_size
    with monkeypatch.context() as m:
        m.setattr(spool_mod, "_write_all", _torn_write)
        pending = spool.start_append()
        pending.write(b"refused,")
        with pytest.raises(InsufficientStorage, match="insufficient storage") as raised:
            spool.commit(pending, None)
    assert is_disk_full(raised.value)
    assert spool.end == 4 and spool.read(0, 100) == b"one,"
    assert spool.log_path.stat().st_size == log_size  # The torn record was cut.
    assert os.path.getsize(spool.content_path) == 4  # And the refused bytes.
    _append(spool, b"two")
    spool.detach()

    got, report = Spool.recover(spool.log_path, sync=sync)
    assert report.appends == 2 and report.cut_log_bytes == 0
    assert got.read(0, 100) == b"one,two"


def test_content_write_failure_rolls_the_append_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool.create(tmp_path, "a/journal", 10, pb.NONE, pb.LabelSet(), sync=False)
    _append(spool, b"kept")
    pending = spool.start_append()
    pending.write(b"partly written ")

    def full(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(spool_mod.os, "pwrite", full)
        with pytest.raises(InsufficientStorage):
            pending.write(b"does not fit")
    assert os.path.getsize(spool.content_path) == 4  # Given back to the file system.
    _append(spool, b"+next")
    assert spool.read(10, 100) == b"kept+next"


def test_header_that_does_not_fit_leaves_no_spool(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "fs", size="64k") as fs:
        fs.fill(leave=0)
        spool_dir = fs.root / "spools"
        with pytest.raises(InsufficientStorage):
            Spool.create(spool_dir, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
        assert list(spool_dir.iterdir()) == []
        fs.free()
        spool = Spool.create(spool_dir, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
        _append(spool, b"fits now")
        assert spool.read(0, 100) == b"fits now"
        spool.delete()


def test_real_full_tmpfs_refuses_whole_appends(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "fs", size="1m") as fs:
        spool = Spool.create(fs.root, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=True)
        fs.fill(leave=64 * 1024)
        committed = 0
        with pytest.raises(InsufficientStorage):
            for _ in range(100):
                _append(spool, b"r" * 8000)
                committed += 8000
        assert spool.end == committed > 0
        fs.free()
        _append(spool, b"after")
        spool.detach()
        got, report = Spool.recover(spool.log_path, sync=True)
        assert got.end == committed + 5 and report.cut_log_bytes == 0
        got.delete()
