"""A journal deleted and created again (or handed back to a broker) while its old replica's
spools still wait to persist: the new replica must not share those files with the old one's
persister jobs, which remove them (into the spool file pool, emptied) once persisted."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from pygazette.broker.replica import spool_directory
from pygazette.broker.server import Broker, BrokerConfig
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.in_process_brokers import start_brokers
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all
from tests.support.cluster import append_once, read_range
from tests.support.etcd_process import EtcdProcess

JOURNAL = "recreated/one"


async def _append_when_served(stub: pb_grpc.JournalStub, data: bytes) -> pb.AppendResponse:
    """Append, retrying while the journal has no replica here yet (its spec is there)."""
    deadline = time.monotonic() + 30
    while True:
        resp = await append(stub, JOURNAL, data)
        if resp.status != pb.JOURNAL_NOT_FOUND or time.monotonic() > deadline:
            return resp
        await asyncio.sleep(0.05)


async def test_a_journal_created_again_while_its_old_spools_await_a_store_loses_nothing(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    config = BrokerConfig(data_dir=tmp_path / "data", port=0, file_root=store)
    # An outage of the journal's store, for its fragments only: a file where its directory
    # goes (puts fail; listings find nothing and succeed; the store's health check passes).
    blocker = store / JOURNAL.split("/")[0]
    blocker.write_bytes(b"")
    broker = Broker(config)
    await broker.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
            # The journal's first write rolls its spool; the second opens the next one.
            assert (await append(stub, JOURNAL, b"one\n")).status == pb.OK
            assert (await append(stub, JOURNAL, b"two\n")).status == pb.OK
            delete = pb.ApplyRequest.Change(delete=JOURNAL, expect_mod_revision=-1)
            assert (await stub.Apply(pb.ApplyRequest(changes=[delete]))).status == pb.OK
            # Its stopped replica's spools wait for the store; the journal comes back.
            assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
            # Appended to the new replica while the old one's spools still wait (or, if it
            # waits for them, once the store is back).
            third = asyncio.ensure_future(_append_when_served(stub, b"three\n"))
            await asyncio.wait([third], timeout=5)
            blocker.unlink()  # The store is back.
            resp = await third
            assert resp.status == pb.OK, resp
            assert (resp.commit.begin, resp.commit.end) == (8, 14)
            async with asyncio.timeout(60):
                await broker.persister.wait_idle()  # Every closed spool persisted.
            want = b"one\ntwo\nthree\n"
            assert (await read_all(stub, JOURNAL))[0] == want
        await broker.stop()  # Persists the open spool.
        broker = Broker(config)
        await broker.start()  # Reads only the store now.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            assert (await read_all(stub, JOURNAL))[0] == want
        for path in (store / JOURNAL).rglob("*"):
            if path.is_file():
                begin, end = (int(x, 16) for x in path.name.split("-")[:2])
                assert path.read_bytes() == want[begin:end], path.name
    finally:
        await broker.stop()


async def test_a_journal_created_again_while_its_old_spools_are_persisted_waits_for_them(
    tmp_path: Path,
) -> None:
    # The old replica's spools are being put to the store (slow) when the journal comes
    # back: its new replica waits until those puts ended (and removed the spools' files),
    # then starts from the store's fragments.
    store = tmp_path / "store"
    config = BrokerConfig(data_dir=tmp_path / "data", port=0, file_root=store)
    broker = Broker(config)
    await broker.start()
    fragments = broker.persister.stores.get("file:///")
    put_file = fragments.put_file
    gate = asyncio.Event()
    puts = 0

    async def slow_put(path: str, local: Path, **kwargs: Any) -> None:
        nonlocal puts
        if JOURNAL in path:
            puts += 1
            await gate.wait()
        await put_file(path, local, **kwargs)

    fragments.put_file = slow_put  # type: ignore[method-assign]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
            assert (await append(stub, JOURNAL, b"one\n")).status == pb.OK
            assert (await append(stub, JOURNAL, b"two\n")).status == pb.OK
            delete = pb.ApplyRequest.Change(delete=JOURNAL, expect_mod_revision=-1)
            assert (await stub.Apply(pb.ApplyRequest(changes=[delete]))).status == pb.OK
            for _ in range(600):  # Both of its spools are being put.
                if puts == 2:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError(f"{puts} spools are being put, not 2")
            assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
            third = asyncio.ensure_future(_append_when_served(stub, b"three\n"))
            early, _ = await asyncio.wait([third], timeout=1)
            gate.set()
            resp = await third
            assert resp.status == pb.OK, resp
            assert (resp.commit.begin, resp.commit.end) == (8, 14)
            want = b"one\ntwo\nthree\n"
            assert (await read_all(stub, JOURNAL))[0] == want
            assert not early  # Not served while the old spools were being put.
        await broker.stop()  # Persists the open spool.
        broker = Broker(config)
        await broker.start()  # Reads only the store now.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            assert (await read_all(stub, JOURNAL))[0] == want
        for path in (store / JOURNAL).rglob("*"):
            if path.is_file():
                begin, end = (int(x, 16) for x in path.name.split("-")[:2])
                assert path.read_bytes() == want[begin:end], path.name
    finally:
        gate.set()
        await broker.stop()


async def test_a_journal_created_again_while_its_old_spools_puts_hang_is_served_in_time(
    tmp_path: Path,
) -> None:
    # The old replica's spools are being put to the store when the journal comes back, and
    # those puts hang for ever (a hung mount). The new replica waits for them no longer than
    # the persister's put deadline: they are abandoned, land nothing, and the new replica
    # recovers the spools and persists them itself.
    store = tmp_path / "store"
    config = BrokerConfig(data_dir=tmp_path / "data", port=0, file_root=store)
    broker = Broker(config)
    await broker.start()
    broker.persister.call_deadline = 1.0  # A put of a few bytes: abandoned after a second.
    fragments = broker.persister.stores.get("file:///")
    put_file = fragments.put_file
    hung = 0

    async def hanging_put(path: str, local: Path, **kwargs: Any) -> None:
        nonlocal hung
        if JOURNAL in path and hung < 2:  # The old replica's two spools.
            hung += 1
            await asyncio.Event().wait()
        await put_file(path, local, **kwargs)

    fragments.put_file = hanging_put  # type: ignore[method-assign]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
            assert (await append(stub, JOURNAL, b"one\n")).status == pb.OK
            assert (await append(stub, JOURNAL, b"two\n")).status == pb.OK
            delete = pb.ApplyRequest.Change(delete=JOURNAL, expect_mod_revision=-1)
            assert (await stub.Apply(pb.ApplyRequest(changes=[delete]))).status == pb.OK
            for _ in range(600):  # Both of its spools are being put.
                if hung == 2:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError(f"{hung} spools are being put, not 2")
            assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
            async with asyncio.timeout(15):  # Unbounded without put deadlines.
                resp = await _append_when_served(stub, b"three\n")
            assert resp.status == pb.OK, resp
            assert (resp.commit.begin, resp.commit.end) == (8, 14)
            want = b"one\ntwo\nthree\n"
            assert (await read_all(stub, JOURNAL))[0] == want
        await broker.stop()  # Persists the open spool.
        broker = Broker(config)
        await broker.start()  # Reads only the store now.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            assert (await read_all(stub, JOURNAL))[0] == want
        for path in (store / JOURNAL).rglob("*"):
            if path.is_file():
                begin, end = (int(x, 16) for x in path.name.split("-")[:2])
                assert path.read_bytes() == want[begin:end], path.name
    finally:
        await broker.stop()


async def _append_until_ok(stub: pb_grpc.JournalStub, data: bytes) -> pb.AppendResponse:
    """Append, retrying while the journal is not served yet (assigned, or its replica
    starting)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            resp = await append_once(stub, JOURNAL, data, within=5)
            if resp.status == pb.OK or time.monotonic() > deadline:
                return resp
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_a_journal_handed_back_while_its_old_spools_await_a_store_reads_right(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    # The cluster resolver's counterpart: the journal leaves this broker (deleted) and comes
    # back (created again, assigned here) while its stopped replica's spools wait to persist
    # to store A. Its new spec names store B, down too; A comes back first.
    store = tmp_path / "store"
    blocker_a, blocker_b = (store / x / JOURNAL.split("/")[0] for x in ("a", "b"))
    for blocker in (blocker_a, blocker_b):
        blocker.parent.mkdir(parents=True)
        blocker.write_bytes(b"")
    (broker,) = await start_brokers(tmp_path, etcd, etcd_root, 1)
    running = True
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            spec_a = journal_spec(JOURNAL, stores=["file:///a/"])
            assert (await apply_specs(stub, spec_a)).status == pb.OK
            assert (await _append_until_ok(stub, b"one\n")).status == pb.OK
            assert (await _append_until_ok(stub, b"two\n")).status == pb.OK
            delete = pb.ApplyRequest.Change(delete=JOURNAL, expect_mod_revision=-1)
            assert (await stub.Apply(pb.ApplyRequest(changes=[delete]))).status == pb.OK
            spec_b = journal_spec(JOURNAL, stores=["file:///b/"])
            assert (await apply_specs(stub, spec_b)).status == pb.OK
            for _ in range(600):  # Assigned here again.
                if broker.resolver.replicas.get(JOURNAL) is not None:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the journal never came back to the broker")
            assert (await read_range(stub, JOURNAL, within=10))[0] == b"one\ntwo\n"
            blocker_a.unlink()  # Store A is back: whatever still waited for it persists.
            for _ in range(1200):
                if not broker.persister.backlog_bytes("file:///a/"):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the spools bound for store A never left the backlog")
            assert (await read_range(stub, JOURNAL, within=10))[0] == b"one\ntwo\n"
            blocker_b.unlink()
            resp = await _append_until_ok(stub, b"three\n")
            assert resp.status == pb.OK, resp
            assert (resp.commit.begin, resp.commit.end) == (8, 14)
            want = b"one\ntwo\nthree\n"
            assert (await read_range(stub, JOURNAL))[0] == want
        running = False
        await broker.stop()  # Persists the open spool.
        for path in store.rglob("*.raw"):
            begin, end = (int(x, 16) for x in path.name.split("-")[:2])
            assert path.read_bytes() == want[begin:end], path
    finally:
        if running:
            await broker.stop()


@pytest.mark.slow
async def test_the_orphan_sweep_leaves_spools_still_waiting_to_persist_alone(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    # The journal leaves this broker (deleted) while its stopped replica's spools wait for
    # the store. The orphan sweep must leave them to their persister jobs: it moved them
    # away (and, the journal being deleted, removed them) under those jobs, which then
    # retried for ever on files that were gone, their backlog never drained.
    store = tmp_path / "store"
    blocker = store / "a" / JOURNAL.split("/")[0]
    blocker.parent.mkdir(parents=True)
    blocker.write_bytes(b"")
    (broker,) = await start_brokers(tmp_path, etcd, etcd_root, 1)
    member = broker.member
    assert member is not None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            spec = journal_spec(JOURNAL, stores=["file:///a/"])
            assert (await apply_specs(stub, spec)).status == pb.OK
            assert (await _append_until_ok(stub, b"one\n")).status == pb.OK
            assert (await _append_until_ok(stub, b"two\n")).status == pb.OK
            delete = pb.ApplyRequest.Change(delete=JOURNAL, expect_mod_revision=-1)
            assert (await stub.Apply(pb.ApplyRequest(changes=[delete]))).status == pb.OK
            for _ in range(600):  # Its replica stopped; its spools wait for the store.
                if JOURNAL not in {*broker.resolver.replicas, *member.resolver.stopping_journals}:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the journal's replica never stopped")
            assert broker.persister.backlog_bytes("file:///a/") == 8
            member.sweep_orphans_once()
            blocker.unlink()  # The store is back.
            async with asyncio.timeout(60):
                await broker.persister.wait_idle()
        stored = {}
        for path in (store / "a" / JOURNAL).rglob("*.raw"):
            begin, end = (int(x, 16) for x in path.name.split("-")[:2])
            stored[begin, end] = path.read_bytes()
        assert stored == {(0, 4): b"one\n", (4, 8): b"two\n"}
    finally:
        await broker.stop()


async def test_a_journal_created_again_has_none_of_the_deleted_ones_registers(
    tmp_path: Path,
) -> None:
    """Registers kept for a journal whose spools are all persisted (`kept_registers`) are
    the journal's: a journal deleted and created again starts without registers, as
    Gazette's (and as before they were kept), though its old fragments give it the same
    write head. The deleted journal's persisted spool kept its registers, and the new
    replica took them back at its first listing: a fence of the old journal's writer."""
    store = tmp_path / "store"
    store.mkdir()
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data", port=0, file_root=store))
    await broker.start()
    fence = pb.LabelSet(labels=[pb.Label(name="owner", value="old-writer")])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
            resp = await _append_when_served(stub, b"x")  # Rolls the spool (first write).
            assert resp.status == pb.OK
            resp = await append(stub, JOURNAL, b"one\n", union_registers=fence)
            assert resp.status == pb.OK and resp.registers == fence
            end = resp.commit.end
            delete = pb.ApplyRequest.Change(delete=JOURNAL, expect_mod_revision=-1)
            assert (await stub.Apply(pb.ApplyRequest(changes=[delete]))).status == pb.OK
            # Its stopped replica persists its spool (all of the content is in the store).
            deadline = time.monotonic() + 30
            while not any(
                p.name.endswith(".raw") and f"-{end:016x}-" in p.name for p in store.rglob("*")
            ):
                assert time.monotonic() < deadline, "the deleted journal's spool persisted"
                await asyncio.sleep(0.05)
            assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
            resp = await _append_when_served(stub, b"two\n")
            assert resp.status == pb.OK
            assert resp.commit.begin == end  # Its old fragments are its history.
            assert resp.registers == pb.LabelSet()
    finally:
        await broker.stop()


def _open_files_under(root: Path) -> list[str]:
    """What this process's descriptors of files under `root` name."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            found.append(target)
    return found


@pytest.mark.slow
async def test_a_deleted_journal_without_stores_leaves_no_spool_open(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    # A journal without stores keeps its closed spools on the broker (nowhere to persist
    # them). Deleted, its stopped replica's spools stayed in the persister's keeping, files
    # open, after the orphan sweep removed them: with three brokers and 300 such journals
    # deleted, each broker held 400 descriptors of deleted files (and their disk space)
    # and 200 stopped replicas, for as long as it ran; journals created and deleted over
    # time (per-run journals) ran it out of descriptors.
    (broker,) = await start_brokers(tmp_path, etcd, etcd_root, 1)
    member = broker.member
    assert member is not None
    spools = tmp_path / "broker-0"
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            assert (await apply_specs(stub, journal_spec(JOURNAL, stores=[]))).status == pb.OK
            # The first write rolls its spool (closed, kept for want of a store); the
            # second opens the next one.
            assert (await _append_until_ok(stub, b"one\n")).status == pb.OK
            assert (await _append_until_ok(stub, b"two\n")).status == pb.OK
            assert len(_open_files_under(spools)) >= 4  # Two spools: content and log each.
            delete = pb.ApplyRequest.Change(delete=JOURNAL, expect_mod_revision=-1)
            assert (await stub.Apply(pb.ApplyRequest(changes=[delete]))).status == pb.OK
            for _ in range(600):  # Its replica stopped.
                if JOURNAL not in {*broker.resolver.replicas, *member.resolver.stopping_journals}:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the journal's replica never stopped")
            member.sweep_orphans_once()  # Drops the deleted journal's spools.
            assert not spool_directory(spools / "spools", JOURNAL).exists()
            assert [p for p in _open_files_under(spools) if "recreated" in p] == []
            assert [p for p in _open_files_under(spools) if p.endswith(" (deleted)")] == []
    finally:
        await broker.stop()
