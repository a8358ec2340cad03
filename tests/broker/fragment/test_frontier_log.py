"""The broker's frontier log: frontiers survive a reload, a torn tail loses only the newest
records (a frontier comes back older, never newer), tombstones forget, compaction bounds the
file."""

from __future__ import annotations

import gc
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.broker.fragment import frontier_log as fl
from pygazette.broker.fragment.frontier_log import FrontierLog, parse_records
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.fragment.spool import Spool
from pygazette.broker.replica import Replica, spool_directory
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores.store import StoreRegistry
from tests.broker.rpc_helpers import journal_spec


def test_frontiers_survive_a_reload(tmp_path: Path) -> None:
    log = FrontierLog(tmp_path / fl.FILE_NAME)
    log.set("a/one", 10)
    log.set("b/two", 7)
    log.set("a/one", 25)
    log.close()
    again = FrontierLog(tmp_path / fl.FILE_NAME)
    assert (again.get("a/one"), again.get("b/two"), again.get("c/none")) == (25, 7, None)


def test_a_torn_tail_loses_only_the_newest_records(tmp_path: Path) -> None:
    path = tmp_path / fl.FILE_NAME
    log = FrontierLog(path)
    log.set("a/one", 10)
    log.set("a/one", 20)
    log.close()
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])  # The last record torn (a power loss mid-write).
    again = FrontierLog(path)
    assert again.get("a/one") == 10
    # Compacted at load: the torn bytes are gone, and later records parse.
    again.set("b/two", 5)
    again.close()
    frontiers, count, valid = parse_records(path.read_bytes())
    assert frontiers == {"a/one": 10, "b/two": 5} and count == 2
    assert valid == len(path.read_bytes())


def test_a_record_a_full_disk_cut_short_loses_no_later_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / fl.FILE_NAME
    log = FrontierLog(path)
    log.set("a/one", 10)
    real_write = os.write
    monkeypatch.setattr(fl.os, "write", lambda fd, data: real_write(fd, bytes(data)[:5]))
    with pytest.raises(OSError):
        log.set("b/two", 7)  # The disk filled up mid-record.
    monkeypatch.setattr(fl.os, "write", real_write)
    log.set("c/three", 4)  # Space again.
    log.close()
    again = FrontierLog(path)  # c/three's record must not be lost behind a torn one: its
    # spool's end would then be trusted as confirmed.
    assert (again.get("a/one"), again.get("c/three")) == (10, 4)
    assert again.get("b/two") in (None, 7)


def test_forgetting_and_starting_again_lower(tmp_path: Path) -> None:
    log = FrontierLog(tmp_path / fl.FILE_NAME)
    log.set("a/one", 1000)
    log.forget("a/one")
    assert log.get("a/one") is None
    log.set("a/one", 3)  # A journal of the same name, served here again.
    log.close()
    assert FrontierLog(tmp_path / fl.FILE_NAME).get("a/one") == 3


def test_compaction_bounds_the_file(tmp_path: Path) -> None:
    path = tmp_path / fl.FILE_NAME
    log = FrontierLog(path)
    for i in range(3 * fl.COMPACT_MIN_RECORDS):
        log.set(f"journal/{i % 10}", i)
    log.close()
    _, count, _ = parse_records(path.read_bytes())
    assert count < fl.COMPACT_MIN_RECORDS
    again = FrontierLog(path)
    n = 3 * fl.COMPACT_MIN_RECORDS
    assert [again.get(f"journal/{k}") for k in range(10)] == [
        max(i for i in range(n) if i % 10 == k) for k in range(10)
    ]


def test_one_log_per_spool_root_while_it_is_used(tmp_path: Path) -> None:
    first = FrontierLog.at(tmp_path / "spools")
    assert FrontierLog.at(tmp_path / "spools" / ".." / "spools") is first
    first.set("a/one", 4)
    del first
    gc.collect()
    reopened = FrontierLog.at(tmp_path / "spools")  # Closed once unused: loaded again.
    assert reopened.get("a/one") == 4


NAMES = ("a/one", "b/two", "c/three")
_names = st.sampled_from(NAMES)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), _names, st.integers(0, 1 << 40)),
        st.tuples(st.just("forget"), _names, st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=_ops, cut=st.integers(0, 4000))
def test_a_reload_gives_a_state_the_log_went_through(
    ops: list[tuple[str, str, int]], cut: int
) -> None:
    """Whatever prefix of the file survives, a reload gives the frontiers as they were after
    some prefix of the operations: never a frontier that was not recorded."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / fl.FILE_NAME
        log = FrontierLog(path)
        model: dict[str, int] = {}
        states = [dict(model)]
        for op, name, offset in ops:
            if op == "set":
                offset = max(offset, model.get(name, 0))  # Callers move it only forward.
                log.set(name, offset)
                model[name] = offset
            else:
                log.forget(name)
                model.pop(name, None)
            states.append(dict(model))
        log.close()
        data = path.read_bytes() if path.exists() else b""  # Before a reload compacts it.
        whole = FrontierLog(path)
        assert {n: v for n in NAMES if (v := whole.get(n)) is not None} == model
        whole.close()
        path.write_bytes(data[: min(cut, len(data))])
        got = FrontierLog(path)
        assert {n: v for n in NAMES if (v := got.get(n)) is not None} in states
        got.close()


def test_the_log_is_no_journals_spool_directory(tmp_path: Path) -> None:
    # ".frontiers" is a valid journal name: its spool directory is not the log's file.
    root = tmp_path / "spools"
    log = FrontierLog.at(root)
    log.set("a/one", 1)
    for name in (".frontiers", ".frontiers.tmp"):
        spool = Spool.create(
            spool_directory(root, name), name, 0, pb.NONE, pb.LabelSet(), sync=False
        )
        spool.delete()
    log.set("a/one", 2)
    log.close()
    assert FrontierLog(log.path).get("a/one") == 2


def test_with_sync_each_record_is_synced_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker run with --sync: a frontier is as durable as the appends it covers (a power
    loss can't bring back an older one). Without, records are not synced."""
    synced: list[tuple[str, int]] = []
    real_fdatasync, real_fsync = os.fdatasync, os.fsync

    def fdatasync(fd: int) -> None:
        synced.append(("file", os.fstat(fd).st_size))
        real_fdatasync(fd)

    def fsync(fd: int) -> None:
        synced.append(("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file", -1))
        real_fsync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "fsync", fsync)
    plain = FrontierLog(tmp_path / "plain" / fl.FILE_NAME)
    plain.set("a/one", 10)
    assert synced == []

    log = FrontierLog(tmp_path / "synced" / fl.FILE_NAME)
    log.sync = True
    log.set("a/one", 10)
    size = (tmp_path / "synced" / fl.FILE_NAME).stat().st_size
    assert synced == [("dir", -1), ("file", size)]  # Its creation, then the record.
    log.forget("a/one")
    assert synced[-1] == ("file", 2 * size)


async def test_a_replica_run_with_sync_syncs_its_frontiers(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir(exist_ok=True)  # A file store's directory must exist.
    stores = StoreRegistry(tmp_path / "store")
    persister = Persister(stores, tmp_path / "scratch")
    replicas = [
        Replica(
            journal_spec(f"a/journal-{sync}"),
            1,
            spool_root=tmp_path / f"spools-{sync}",
            stores=stores,
            persister=persister,
            sync=sync,
        )
        for sync in (False, True)
    ]
    assert [r.frontiers.sync for r in replicas] == [False, True]
    await persister.stop()
