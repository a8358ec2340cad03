"""Fault test: kill -9 the broker under concurrent appends; nothing acknowledged is lost.

Writers append whole, self-describing records. After each SIGKILL the broker restarts on the
same data directory, and the journal must hold every acknowledged append at the offsets its
commit reported, consist only of whole appends that some writer sent (an append committed
just before the kill may be there without its acknowledgement, but never a part of one), and
its write head must not move backwards.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.support.broker_process import BrokerProcess

JOURNAL = "crash/test"
WRITERS = 4


def _spec() -> pb.JournalSpec:
    spec = pb.JournalSpec(name=JOURNAL, replication=1)
    spec.labels.labels.add(name="app", value="crash")
    spec.fragment.length = 256 * 1024  # Rolls and persists often.
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 60
    return spec


def _record(writer: int, seq: int, rng: random.Random) -> bytes:
    body = f"w{writer}-{seq}:".encode()
    pad = rng.randint(0, 20_000)
    return body + b"." * pad + b"\n"


async def _append(stub: pb_grpc.JournalStub, data: bytes) -> pb.AppendResponse:
    async def requests():  # type: ignore[no-untyped-def]
        yield pb.AppendRequest(journal=JOURNAL)
        for i in range(0, len(data), 8192):
            yield pb.AppendRequest(content=data[i : i + 8192])
        yield pb.AppendRequest()

    return await stub.Append(requests(), timeout=10)


async def _writer(
    addr: str,
    writer: int,
    acked: dict[bytes, tuple[int, int]],
    sent: set[bytes],
    stop: asyncio.Event,
    progress: asyncio.Condition,
) -> None:
    rng = random.Random(writer)
    seq = 0
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.JournalStub(channel)
        while not stop.is_set():
            data = _record(writer, seq, rng)
            seq += 1
            sent.add(data)
            try:
                resp = await _append(stub, data)
            except (TimeoutError, grpc.aio.AioRpcError):
                return  # The broker died under us.
            if resp.status == pb.OK:
                acked[data] = (resp.commit.begin, resp.commit.end)
                async with progress:
                    progress.notify_all()


async def _read_all(addr: str) -> tuple[bytes, int]:
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.JournalStub(channel)
        out = bytearray()
        head = 0
        async for resp in stub.Read(pb.ReadRequest(journal=JOURNAL, offset=0, block=False)):
            if resp.content:
                assert resp.offset == len(out)
                out += resp.content
            else:
                head = resp.write_head
                if resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
                    break
                assert resp.status == pb.OK, pb.Status.Name(resp.status)
        return bytes(out), head


async def _apply(addr: str) -> None:
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.JournalStub(channel)
        req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=_spec())])
        resp = await stub.Apply(req)
        assert resp.status == pb.OK


@pytest.mark.slow
@pytest.mark.parametrize("extra_args", [[], ["--sync"]], ids=["page-cache", "fsync"])
async def test_kill9_under_concurrent_appends(tmp_path: Path, extra_args: list[str]) -> None:
    broker = BrokerProcess(tmp_path / "data", extra_args=extra_args)
    broker.start()
    try:
        await _apply(broker.address)
        acked: dict[bytes, tuple[int, int]] = {}
        sent: set[bytes] = set()
        last_head = 0
        progress = asyncio.Condition()
        for round_ in range(3):
            stop = asyncio.Event()
            writers = [
                asyncio.create_task(_writer(broker.address, w, acked, sent, stop, progress))
                for w in range(WRITERS)
            ]
            target = len(acked) + 150
            async with progress:
                await progress.wait_for(lambda t=target: len(acked) >= t)
            broker.kill()  # Mid-flight: writers are streaming appends right now.
            stop.set()
            await asyncio.gather(*writers)
            broker.start()

            content, head = await _read_all(broker.address)
            assert head >= last_head, f"write head moved backwards in round {round_}"
            last_head = head
            assert head == len(content)
            for data, (begin, end) in acked.items():
                assert content[begin:end] == data, f"lost acknowledged append at {begin}"
            # Every byte belongs to a whole append that a writer sent.
            pos = 0
            for line in content.splitlines(keepends=True):
                assert line in sent, f"unknown or partial append at offset {pos}"
                pos += len(line)
    finally:
        broker.kill()
