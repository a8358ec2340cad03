"""A Replicate stream that outlives its replica's stop must never reach a new replica's spool.

A replica stopping (its journal deleted, or its assignment moved away) waits at most
STOP_WAIT_SECONDS for the Replicate stream writing into its spool. A stream can outlast
that only inside a write of its content on a worker thread (a big chunk, or a commit with
--sync) that the disk is slow to finish. A new replica of the journal on the same broker
(the journal created again, or handed back) recovers the old replica's spool files and
appends to them: a stale write landing after that would overwrite what the new replica
committed there. So the stop waits for a write in flight, and the old spool refuses any
further request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc.aio
import pytest

from pygazette.broker import replica as replica_module
from pygazette.broker.replicated_spool import SpoolFinished
from pygazette.broker.server import Broker
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.in_process_brokers import start_brokers
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import append_once
from tests.support.etcd_process import EtcdProcess

JOURNAL = "stale/stream"
BIG = 256 * 1024  # A chunk the replica writes on a worker thread (`replicated_spool`).


async def _until(condition: Callable[[], bool], what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.02)


async def _append_until_ok(stub: pb_grpc.JournalStub, data: bytes) -> pb.AppendResponse:
    """Append, retrying while the journal is not served (assigned, or its replicas starting)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            resp = await append_once(stub, JOURNAL, data, within=5)
            if resp.status == pb.OK or time.monotonic() > deadline:
                return resp
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


def _replica_of(brokers: list[Broker], *, primary: bool) -> tuple[Broker, replica_module.Replica]:
    for b in brokers:
        r = b.resolver.replicas.get(JOURNAL)
        if r is not None and r.primary == primary:
            return b, r
    raise AssertionError(f"no {'primary' if primary else 'replica'} of {JOURNAL}")


@pytest.mark.slow
async def test_a_replicate_write_outliving_the_stop_never_reaches_the_new_replicas_spool(
    tmp_path: Path,
    etcd: EtcdProcess,
    etcd_root: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(replica_module, "STOP_WAIT_SECONDS", 0.3)
    caplog.set_level(logging.WARNING, logger="pygazette.broker")

    # A write of the peer's big chunk into the replica's spool that the disk holds up: as a
    # pwrite blocked in the kernel, it lands in the file it was issued to, once let go.
    real_pwrite = os.pwrite
    target: list[str] = []  # The replica's spool directory.
    stuck, gate, landed = threading.Event(), threading.Event(), threading.Event()

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if (
            target
            and not stuck.is_set()
            and len(data) >= BIG
            and os.readlink(f"/proc/self/fd/{fd}").startswith(target[0])
        ):
            held = os.dup(fd)
            stuck.set()
            try:
                gate.wait(60)
                return real_pwrite(held, data, offset)
            finally:
                os.close(held)
                landed.set()
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)

    brokers = await start_brokers(tmp_path, etcd, etcd_root, 2)
    big: asyncio.Task[pb.AppendResponse] | None = None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{brokers[0].port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            spec = journal_spec(JOURNAL, replication=2)
            assert (await apply_specs(stub, spec)).status == pb.OK
            # The journal's first write rolls its spool: the next goes to the spool that
            # is open when the journal leaves.
            assert (await _append_until_ok(stub, b"one\n")).status == pb.OK
            assert (await _append_until_ok(stub, b"two\n")).status == pb.OK
            member, old = _replica_of(brokers, primary=False)
            target.append(os.path.realpath(old.spool_dir) + "/")

            # The primary streams a big chunk; the replica's write of it is held up.
            big = asyncio.create_task(append_once(stub, JOURNAL, b"x" * BIG, chunk=BIG))
            assert await asyncio.to_thread(stuck.wait, 30)

            # The journal leaves the broker; its replica's stop gives up waiting for the
            # stream. The journal comes back before the write is over.
            delete = pb.ApplyRequest.Change(delete=JOURNAL, expect_mod_revision=-1)
            assert (await stub.Apply(pb.ApplyRequest(changes=[delete]))).status == pb.OK
            await _until(lambda: old.stopping, "the replica stops")
            await _until(
                lambda: any(
                    "replication still running at stop" in r.message for r in caplog.records
                ),
                "the stop gives up waiting for the stream",
            )
            assert (await apply_specs(stub, spec)).status == pb.OK
            appending = asyncio.create_task(_append_until_ok(stub, b"three\n"))
            # Either the new replica takes the spool files over (and the append commits to
            # them) before the stale write lands, or the stop waits for that write.
            await _until(
                lambda: (
                    appending.done()
                    or any("write still in flight" in r.message for r in caplog.records)
                ),
                "an append to the journal created again commits, or the stop waits",
            )
            gate.set()
            assert await asyncio.to_thread(landed.wait, 30)
            resp = await appending
            assert resp.status == pb.OK, resp
            assert (resp.commit.begin, resp.commit.end) == (8, 14)
            big_resp = await asyncio.gather(big, return_exceptions=True)
            assert not isinstance(big_resp[0], pb.AppendResponse) or big_resp[0].status != pb.OK

            # The new replica on that broker holds what was appended, and nothing else.
            new = member.resolver.replicas[JOURNAL]
            assert new is not old
            want = b"one\ntwo\nthree\n"
            for spool in new.index.local_spools():
                assert (
                    spool.read(spool.begin, spool.end - spool.begin)
                    == want[spool.begin : spool.end]
                ), (spool.begin, spool.end)
            assert max(s.end for s in new.index.local_spools()) == 14

            # The old spool takes no more requests, and creates no spool file.
            rs = old.rspool
            assert rs is not None
            files = sorted(p.name for p in new.spool_dir.iterdir())
            with pytest.raises(SpoolFinished):
                await rs.apply_content(b"late", rs.delta)
            with pytest.raises(SpoolFinished):
                await rs.apply_proposal(rs.fragment(), pb.LabelSet(), primary=False)
            assert sorted(p.name for p in new.spool_dir.iterdir()) == files
    finally:
        gate.set()
        if big is not None:
            await asyncio.gather(big, return_exceptions=True)
        for b in brokers:
            await b.stop()
