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
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.support.broker_process import BrokerProcess

JOURNAL = "crash/test"
WRITERS = 4


@dataclass(frozen=True)
class Shape:
    """The appends a test round streams."""

    pad: tuple[int, int]  # Record length range.
    chunk: int  # Content bytes per AppendRequest.
    fragment_length: int
    per_round: int  # Acknowledged appends before each kill.


# Small appends in 8 KiB chunks; fragments roll and persist often.
SMALL = Shape(pad=(0, 20_000), chunk=8192, fragment_length=256 * 1024, per_round=150)
# Large appends in 1 MiB chunks into a spool that outgrows its page-cache window: the
# append's running sum folds on a worker past the acknowledgement, the prefaulter allocates
# zeros past the committed end, and the recycler writes back and drops pages behind it.
LARGE = Shape(pad=(256 * 1024, 1536 * 1024), chunk=1 << 20, fragment_length=1 << 30, per_round=60)


def _spec(shape: Shape) -> pb.JournalSpec:
    spec = pb.JournalSpec(name=JOURNAL, replication=1)
    spec.labels.labels.add(name="app", value="crash")
    spec.fragment.length = shape.fragment_length
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 60
    return spec


def _record(writer: int, seq: int, rng: random.Random, shape: Shape) -> bytes:
    body = f"w{writer}-{seq}:".encode()
    pad = rng.randint(*shape.pad)
    return body + b"." * pad + b"\n"


async def _append(stub: pb_grpc.JournalStub, data: bytes, shape: Shape) -> pb.AppendResponse:
    async def requests():  # type: ignore[no-untyped-def]
        yield pb.AppendRequest(journal=JOURNAL)
        for i in range(0, len(data), shape.chunk):
            yield pb.AppendRequest(content=data[i : i + shape.chunk])
        yield pb.AppendRequest()

    return await stub.Append(requests(), timeout=10)


async def _writer(
    addr: str,
    writer: int,
    acked: dict[bytes, tuple[int, int]],
    sent: set[bytes],
    stop: asyncio.Event,
    progress: asyncio.Condition,
    shape: Shape,
) -> None:
    rng = random.Random(writer)
    seq = 0
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.JournalStub(channel)
        while not stop.is_set():
            data = _record(writer, seq, rng, shape)
            seq += 1
            sent.add(data)
            try:
                resp = await _append(stub, data, shape)
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


async def _apply(addr: str, shape: Shape) -> None:
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.JournalStub(channel)
        req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=_spec(shape))])
        resp = await stub.Apply(req)
        assert resp.status == pb.OK


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra_args", "shape"),
    [([], SMALL), (["--sync"], SMALL), ([], LARGE), (["--sync"], LARGE)],
    ids=["page-cache", "fsync", "page-cache-large-appends", "fsync-large-appends"],
)
async def test_kill9_under_concurrent_appends(
    tmp_path: Path, extra_args: list[str], shape: Shape
) -> None:
    broker = BrokerProcess(tmp_path / "data", extra_args=extra_args)
    broker.start()
    try:
        await _apply(broker.address, shape)
        acked: dict[bytes, tuple[int, int]] = {}
        sent: set[bytes] = set()
        last_head = 0
        progress = asyncio.Condition()
        for round_ in range(3):
            stop = asyncio.Event()
            writers = [
                asyncio.create_task(
                    _writer(broker.address, w, acked, sent, stop, progress, shape)
                )
                for w in range(WRITERS)
            ]
            target = len(acked) + shape.per_round
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
