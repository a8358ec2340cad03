"""The spool prefaulter: pages ready ahead of the committed end, never visible as content."""

from __future__ import annotations

import hashlib
import os
import random
import time
from pathlib import Path

import pytest

from pygazette.broker.fragment import spool as spool_mod
from pygazette.broker.fragment.spool import Spool
from pygazette.protocol.fragment_name import sha1sum_from_digest
from pygazette.protocol.pb import protocol_pb2 as pb


@pytest.fixture(autouse=True)
def costly_page_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a VM whose host faults fresh pages in slowly: the prefaulter never pauses."""
    monkeypatch.setattr(spool_mod, "_PREFAULT_CHEAP_SECONDS_PER_BYTE", 0.0)


def _append(spool: Spool, data: bytes, chunk: int = 1 << 16) -> None:
    pending = spool.start_append()
    for i in range(0, len(data), chunk):
        pending.write(data[i : i + chunk])
    spool.commit(pending, None)


def _wait_for(cond: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.005)


def test_allocates_ahead_and_close_cuts_to_the_content(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path, "a/journal", 1000, pb.NONE, pb.LabelSet(), sync=False)
    data = os.urandom(300_000)
    _append(spool, data)
    want = len(data) + spool_mod._PREFAULT_APPENDS * len(data)
    _wait_for(lambda: spool.content_path.stat().st_size >= want)
    assert spool.read(1000, 1 << 20) == data  # Zeros past the end are never served.
    assert spool.fragment().end == 1000 + len(data)
    spool.close()
    assert spool.content_path.read_bytes() == data
    with pytest.raises(RuntimeError):
        spool.start_append()
    time.sleep(0.05)  # A prefaulter step racing close() must not have grown it again.
    assert spool.content_path.stat().st_size == len(data)


def test_appends_outrunning_the_prefaulter_lose_nothing(tmp_path: Path) -> None:
    rng = random.Random(7)
    spool = Spool.create(tmp_path, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    written = bytearray()
    for _ in range(40):
        # Up to 3 MiB an append, in chunks of varying size: writes land both in prefaulted
        # pages and past them while the prefaulter works.
        data = rng.randbytes(rng.randrange(1, 3 << 20))
        _append(spool, data, chunk=rng.choice([4096, 1 << 16, 1 << 20]))
        written += data
    assert spool.read(0, len(written)) == bytes(written)
    assert spool.fragment().sum == sha1sum_from_digest(hashlib.sha1(written).digest())
    spool.close()
    assert spool.content_path.read_bytes() == bytes(written)


def test_recovery_cuts_prefaulted_zeros_and_reports_only_content(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(spool, b"kept" * 100_000)
    torn = b"never committed" * 10
    spool.start_append().write(torn)
    _wait_for(lambda: spool.content_path.stat().st_size > 400_000 + spool_mod._PREFAULT_STEP)

    got, report = Spool.recover(spool.log_path, sync=False)
    assert (report.appends, report.cut_content_bytes) == (1, len(torn))
    assert got.content_path.read_bytes() == b"kept" * 100_000
    _append(got, b"more")
    assert got.read(0, 1 << 20) == b"kept" * 100_000 + b"more"


def test_without_fallocate_appends_write_fresh_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []  # Content fds the prefaulter tried to allocate.

    def unsupported(fd: int, _offset: int, _length: int) -> bool:
        calls.append(fd)
        return False

    monkeypatch.setattr(spool_mod, "_fallocate", unsupported)
    spool = Spool.create(tmp_path, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(spool, b"x" * 500_000)
    fd = spool.content_fd
    _wait_for(lambda: fd in calls)
    _append(spool, b"y" * 500_000)
    assert spool.read(0, 1 << 20) == b"x" * 500_000 + b"y" * 500_000
    assert spool.content_path.stat().st_size == 1_000_000
    assert calls.count(fd) == 1  # Tried once, then never again for this spool.


def test_small_appends_are_not_prefaulted(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    for _ in range(100):
        _append(spool, b"s" * 4096)
    big = Spool.create(tmp_path / "big", "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(big, b"b" * (1 << 20))
    # The prefaulter serves spools in turn: once it reached the big one, it passed the small.
    _wait_for(lambda: big.content_path.stat().st_size > 1 << 20)
    assert spool.content_path.stat().st_size == 100 * 4096


def test_pauses_while_fresh_pages_are_cheap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spool_mod, "_PREFAULT_CHEAP_SECONDS_PER_BYTE", 1.0)  # Always cheap.
    monkeypatch.setattr(spool_mod, "_PREFAULT_RECHECK", 4 << 20)
    spool = Spool.create(tmp_path, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    _append(spool, os.urandom(1 << 20))
    step = spool_mod._PREFAULT_STEP
    _wait_for(lambda: spool.content_path.stat().st_size == (1 << 20) + step)
    for _ in range(3):  # One step, then a pause: appends write past it into fresh pages.
        _append(spool, os.urandom(1 << 20))
    time.sleep(0.05)
    assert spool.content_path.stat().st_size == 4 << 20
    for _ in range(2):  # 4 MiB past the step's end: probe again, from the committed end.
        _append(spool, os.urandom(1 << 20))
    _wait_for(lambda: spool.content_path.stat().st_size == (6 << 20) + step)


def test_a_slow_write_ends_a_pause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool.create(tmp_path, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    spool._prefault_resume = 1 << 40  # Paused, as after a cheap step.
    _append(spool, b"s" * 4096)  # Small writes say nothing about fresh pages.
    assert spool._prefault_resume == 1 << 40
    monkeypatch.setattr(spool_mod, "_PREFAULT_CHEAP_SECONDS_PER_BYTE", 0.0)  # All slow.
    _append(spool, os.urandom(1 << 20), chunk=1 << 20)
    assert spool._prefault_resume == 0
    _wait_for(lambda: spool.content_path.stat().st_size > 4096 + (2 << 20))


def test_recycler_drops_pages_behind_the_window_and_content_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spool_mod, "_RECYCLE_WINDOW", 2 << 20)
    monkeypatch.setattr(spool_mod, "_RECYCLE_STEP", 1 << 20)
    rng = random.Random(3)
    spool = Spool.create(tmp_path, "a/journal", 0, pb.NONE, pb.LabelSet(), sync=False)
    written = bytearray()
    for _ in range(12):
        data = rng.randbytes(512 * 1024)
        _append(spool, data)
        written += data
    # Handed to writeback in steps of at least a MiB, and dropped once a window behind.
    _wait_for(lambda: spool._flushed > len(written) - (1 << 20))
    assert 0 < spool._dropped <= spool._flushed - (2 << 20)
    # Dropped pages are read back from disk: nothing is lost, sums still check out.
    assert spool.read(0, len(written)) == bytes(written)
    assert spool.fragment().sum == sha1sum_from_digest(hashlib.sha1(written).digest())
    spool.close()
    assert spool.content_path.read_bytes() == bytes(written)
