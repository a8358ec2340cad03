"""Spool commit and crash recovery: what was committed survives, a torn tail is cut."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from pygazette.broker.fragment.spool import Spool, SpoolCorrupt
from pygazette.protocol.fragment_name import sha1sum_from_digest
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb


def _append(spool: Spool, data: bytes, registers: pb.LabelSet | None = None) -> None:
    pending = spool.start_append()
    for i in range(0, len(data), 1000):
        pending.write(data[i : i + 1000])
    spool.commit(pending, registers)


def test_commit_and_read(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path, "a/journal", 100, pb.SNAPPY, pb.LabelSet(), sync=False)
    _append(spool, b"hello ")
    _append(spool, b"world")
    assert (spool.begin, spool.end) == (100, 111)
    assert spool.read(100, 1 << 20) == b"hello world"
    assert spool.read(106, 3) == b"wor"
    assert spool.read(111, 10) == b""
    frag = spool.fragment()
    assert frag.sum == sha1sum_from_digest(hashlib.sha1(b"hello world").digest())
    assert frag.compression_codec == pb.SNAPPY


def test_uncommitted_append_is_invisible_and_overwritten(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(spool, b"one")
    pending = spool.start_append()
    pending.write(b"rolled back, longer")
    assert spool.read(0, 100) == b"one"  # Not committed.
    _append(spool, b"two")
    assert spool.read(0, 100) == b"onetwo"
    spool.close()
    assert spool.content_path.read_bytes() == b"onetwo"  # Garbage past end was cut.


@pytest.mark.parametrize("sync", [False, True])
def test_recover_keeps_commits_and_registers(tmp_path: Path, sync: bool) -> None:
    spool = Spool.create(tmp_path, "a/journal", 7, pb.GZIP, label_set({"a": "1"}), sync=sync)
    _append(spool, b"x" * 5000)
    _append(spool, b"y" * 3000, label_set({"a": "2", "b": "3"}))
    _append(spool, b"z" * 10)
    spool.start_append().write(b"never committed" * 100)
    want = spool.fragment()
    spool.detach()  # The process is gone: its files stay as they are.

    got, report = Spool.recover(spool.log_path, sync=sync)
    assert report.appends == 3
    assert report.cut_content_bytes == len(b"never committed" * 100)
    assert got.fragment() == want
    assert got.registers == label_set({"a": "2", "b": "3"})
    assert got.read(7, 1 << 20) == b"x" * 5000 + b"y" * 3000 + b"z" * 10
    # The torn append is cut; past the content, the recovered spool's prefaulter may
    # already have allocated zeros again.
    content = got.content_path.read_bytes()
    assert content[:8010] == b"x" * 5000 + b"y" * 3000 + b"z" * 10
    assert not content[8010:].strip(b"\0")


def test_recover_cuts_torn_log_record(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path, "j/1", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(spool, b"a" * 100)
    _append(spool, b"b" * 100)
    size = spool.log_path.stat().st_size
    os.truncate(spool.log_path, size - 5)  # The last commit record is half-written.
    got, report = Spool.recover(spool.log_path, sync=False)
    assert got.end == 100
    assert got.read(0, 1000) == b"a" * 100
    assert report.cut_content_bytes == 100
    assert report.cut_log_bytes > 0
    # The recovered spool keeps working.
    _append(got, b"c" * 10)
    again, _ = Spool.recover(got.log_path, sync=False)
    assert again.read(0, 1000) == b"a" * 100 + b"c" * 10


def test_recover_cuts_torn_content(tmp_path: Path) -> None:
    """Content lost before it reached the disk (power loss) fails its SHA-1 and is cut."""
    spool = Spool.create(tmp_path, "j/1", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(spool, b"a" * 100)
    _append(spool, b"b" * 100)
    _append(spool, b"c" * 100)
    with open(spool.content_path, "r+b") as f:
        f.seek(150)
        f.write(b"\0" * 10)
    got, report = Spool.recover(spool.log_path, sync=False)
    assert got.end == 100
    assert report.appends == 1
    assert got.fragment().sum == sha1sum_from_digest(hashlib.sha1(b"a" * 100).digest())


def test_recover_rejects_garbage_header(tmp_path: Path) -> None:
    path = tmp_path / "0000000000000000.log"
    path.write_bytes(b"garbage")
    with pytest.raises(SpoolCorrupt):
        Spool.recover(path, sync=False)
