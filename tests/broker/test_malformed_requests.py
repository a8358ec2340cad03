"""Corrupt protobuf requests against real `pygazette serve` and `pygazette consumer serve`
processes: each is answered INVALID_ARGUMENT, the process keeps serving, and a thousand of
them cost a few rate-limited log lines, never a traceback per call."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import consumer_pb2_grpc as cpb_grpc
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, append_once, read_range
from tests.support.consumer_process import ConsumerProcess
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

JOURNAL_METHODS = {
    "List": "unary_stream",
    "Apply": "unary_unary",
    "Read": "unary_stream",
    "ListFragments": "unary_unary",
    "FragmentStoreHealth": "unary_unary",
    "Append": "stream_unary",
    "Replicate": "stream_stream",
}
SHARD_METHODS = ["Stat", "List", "Apply", "GetHints", "Unassign"]
MAX_LOG_LINES = 50


def garbage(i: int) -> bytes:
    """Bytes no protobuf message decodes from (field number 0, wire type 7), varied."""
    return b"\x07" + os.urandom(1 + i % 64)


async def corrupt_call(channel: grpc.aio.Channel, method: str, shape: str, data: bytes) -> Any:
    """Send `data` as the request (or the first message of the request stream) of a raw call;
    the call's error, which the test expects."""
    raw: Callable[..., Any] = getattr(channel, shape)(
        method, request_serializer=None, response_deserializer=None
    )

    async def stream() -> AsyncIterator[bytes]:
        yield data

    request = stream() if shape.startswith("stream") else data
    try:
        call = raw(request, timeout=20)
        if shape.endswith("_stream"):
            async for _ in call:
                pass
        else:
            await call
    except grpc.aio.AioRpcError as exc:
        return exc
    raise AssertionError(f"{method}: a corrupt request was served")


async def flood(
    channel: grpc.aio.Channel, calls: list[tuple[str, str]], count: int, batch: int = 50
) -> None:
    """`count` corrupt requests, cycling over `calls` (method, shape), `batch` at a time."""
    for start in range(0, count, batch):
        n = min(batch, count - start)
        results = await asyncio.gather(
            *(
                corrupt_call(channel, *calls[(start + i) % len(calls)], garbage(start + i))
                for i in range(n)
            )
        )
        for (method, _), err in zip(
            (calls[(start + i) % len(calls)] for i in range(n)), results, strict=True
        ):
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err)
            assert f"{method}: malformed request: " in (err.details() or ""), err.details()


async def cancel_mid_call(channel: grpc.aio.Channel) -> None:
    """Cancel a blocking read waiting at the write head, and an append holding the journal."""
    read = channel.unary_stream(
        "/protocol.Journal/Read",
        request_serializer=pb.ReadRequest.SerializeToString,
        response_deserializer=pb.ReadResponse.FromString,
    )(pb.ReadRequest(journal="bad/requests", offset=-1, block=True), timeout=20)
    await asyncio.sleep(0.2)  # Let the broker take the read in (nothing to observe).
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read.read()

    holding = asyncio.Event()
    send_more = asyncio.Event()

    async def unfinished() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal="bad/requests")
        yield pb.AppendRequest(content=b"abandoned\n")
        holding.set()
        await send_more.wait()  # Never: the call is cancelled first.

    append = channel.stream_unary(
        "/protocol.Journal/Append",
        request_serializer=pb.AppendRequest.SerializeToString,
        response_deserializer=pb.AppendResponse.FromString,
    )(unfinished(), timeout=20)
    await holding.wait()
    await asyncio.sleep(0.2)  # Let the broker take the chunk in (no condition to observe).
    append.cancel()
    with pytest.raises(asyncio.CancelledError):
        await append


def assert_quiet_log(log: str, methods: int) -> None:
    lines = log.splitlines()
    assert len(lines) < MAX_LOG_LINES, log
    assert "Traceback" not in log and "UNKNOWN" not in log, log
    warned = [line for line in lines if "msg=\"malformed request\"" in line]
    assert 1 <= len(warned) <= methods, log


async def test_a_thousand_corrupt_requests_to_a_broker(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    # A cluster member (so Replicate is served), at the default log level: the subcommand's
    # --log-level beats the root level the cluster helper sets through the environment.
    cluster = Cluster(tmp_path, etcd, etcd_root, broker_args=["--log-level", "warning"])
    broker = cluster.add("zone-a", "broker-1")
    try:
        await cluster.start()
        stub = cluster.stub(broker)
        assert (await apply_specs(stub, journal_spec("bad/requests"))).status == pb.OK
        await cluster.wait_ready(["bad/requests"], 1)
        async with grpc.aio.insecure_channel(broker.address) as channel:
            calls = [(f"/protocol.Journal/{m}", shape) for m, shape in JOURNAL_METHODS.items()]
            await flood(channel, calls, 1000)

            # A corrupt message in the middle of an append: nothing of it commits.
            append = channel.stream_unary(
                "/protocol.Journal/Append", request_serializer=None, response_deserializer=None
            )

            async def torn() -> AsyncIterator[bytes]:
                yield pb.AppendRequest(journal="bad/requests").SerializeToString()
                yield pb.AppendRequest(content=b"never committed\n").SerializeToString()
                yield garbage(0)

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await append(torn(), timeout=20)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

            # Clients going away mid-call are expected, and logged at most as one line each:
            # a blocking read and an unfinished append, cancelled.
            await cancel_mid_call(channel)

        # The broker still serves: an append and a read work, with no trace of the torn one.
        resp = await append_once(stub, "bad/requests", b"still serving\n")
        assert resp.status == pb.OK
        content, _ = await read_range(stub, "bad/requests")
        assert content == b"still serving\n"
        assert broker.running()
        assert_quiet_log(broker.log(), len(JOURNAL_METHODS))
    finally:
        await cluster.close()


async def test_corrupt_requests_to_a_consumer_process(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    cluster = Cluster(tmp_path, etcd, etcd_root, broker_args=["--log-level", "warning"])
    broker = cluster.add("zone-a", "broker-1")
    consumer = ConsumerProcess(
        tmp_path / "consumer",
        app="tests.consumer.apps:Counter",
        broker=broker.url,
        extra_args=["--log-level", "warning"],
    )
    try:
        await cluster.start()
        await asyncio.to_thread(consumer.start)
        async with grpc.aio.insecure_channel(consumer.address) as channel:
            calls = [(f"/consumer.Shard/{m}", "unary_unary") for m in SHARD_METHODS]
            await flood(channel, calls, 250)
            # It still serves.
            listed = await cpb_grpc.ShardStub(channel).List(cpb.ListRequest(), timeout=20)
            assert listed.status == cpb.Status.OK
        assert consumer.running()
        assert_quiet_log(consumer.log(), len(SHARD_METHODS))
    finally:
        consumer.kill()
        await cluster.close()
