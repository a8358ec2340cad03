"""`stream_write.send`: a server's status survives a write racing the end of its stream."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest

from pygazette.protocol import stream_write
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.stream_write import CallEnded, send


class _Refusing(pb_grpc.JournalServicer):  # type: ignore[misc]
    async def Append(self, request_iterator: Any, context: Any) -> pb.AppendResponse:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "disk full")

    async def Replicate(self, request_iterator: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "disk full")
        yield pb.ReplicateResponse()  # Unreachable: makes this a generator.


async def _server() -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    pb_grpc.add_JournalServicer_to_server(_Refusing(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(details, requests)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(
        self, continuation: Any, details: Any, requests: Any
    ) -> Any:
        return await continuation(details, requests)


@pytest.mark.parametrize("intercepted", [False, True], ids=["plain", "intercepted"])
@pytest.mark.parametrize("method", ["Append", "Replicate"])
async def test_the_servers_status_survives_racing_writes(method: str, intercepted: bool) -> None:
    # Intercepted: as on an authorizing channel, whose calls relay writes to an inner call.
    server, address = await _server()
    interceptors = [_StreamUnary(), _StreamStream()] if intercepted else None
    try:
        async with grpc.aio.insecure_channel(address, interceptors=interceptors) as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            codes = set()
            ended = 0
            for _ in range(100):
                call = getattr(stub, method)()
                requests: list[Any]
                if method == "Append":
                    requests = [
                        pb.AppendRequest(journal="a/b"),
                        pb.AppendRequest(content=b"x" * 100),
                        pb.AppendRequest(),
                    ]
                else:
                    requests = [pb.ReplicateRequest(content=b"x" * 100)] * 3
                try:
                    for req in requests:
                        await send(call, req)
                except CallEnded:
                    ended += 1
                codes.add(await call.code())
            # Every call ends with the server's status, however the writes raced it (with
            # `call.write`, or without `send`'s care for intercepted calls, most don't).
            assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED}, (codes, ended)
    finally:
        await server.stop(None)


async def test_a_half_closed_call_is_ended_for_send() -> None:
    server, address = await _server()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Append()
            await call.done_writing()
            with pytest.raises(CallEnded):
                await send(call, pb.AppendRequest(journal="a/b"))
            assert await call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await server.stop(None)


class _Counting(pb_grpc.JournalServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.arrived = asyncio.Event()

    async def Replicate(self, request_iterator: Any, context: Any) -> Any:
        async for req in request_iterator:
            self.received.append(req.content)
            self.arrived.set()
            yield pb.ReplicateResponse()


@pytest.mark.skipif(stream_write._BUFFER_HINT is None, reason="grpc.aio has no write flags")
async def test_a_buffered_message_goes_out_with_the_next() -> None:
    # `buffered`: gRPC holds the message back until the next one is written, then both go.
    servicer = _Counting()
    server = grpc.aio.server()
    pb_grpc.add_JournalServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = pb_grpc.JournalStub(channel).Replicate()  # type: ignore[no-untyped-call]
            await send(call, pb.ReplicateRequest(content=b"first"), buffered=True)
            with pytest.raises(TimeoutError):  # Held back (its write completed, though).
                await asyncio.wait_for(servicer.arrived.wait(), 0.3)
            await send(call, pb.ReplicateRequest(content=b"second"))
            assert await call.read() is not None
            assert await call.read() is not None
            assert servicer.received == [b"first", b"second"]
            await call.done_writing()
    finally:
        await server.stop(None)
