"""RequestGuard on a real grpc.aio server: undecodable requests get INVALID_ARGUMENT and never
reach the handler, handler failures get INTERNAL, and either costs rate-limited log lines."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from pygazette.auth.request_guard import RequestGuard
from pygazette.protocol.pb import protocol_pb2 as pb

SERVICE = "test.Guarded"
# Field number 0 with wire type 7: no protobuf message decodes from this.
GARBAGE = b"\x07\xff\xfe\xfd"

Context = grpc.aio.ServicerContext  # type: ignore[type-arg]


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.changed.set()

    async def wait_for(self, count: int) -> None:
        while len(self.records) < count:
            self.changed.clear()
            await self.changed.wait()


class Service:
    """A small service of each RPC shape, recording the requests its handlers see."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.fail: Exception | None = None
        self.slow_started = asyncio.Event()

    async def unary(self, request: pb.ReadRequest, context: Context) -> pb.ReadResponse:
        self.seen.append(request)
        if self.fail is not None:
            raise self.fail
        if request.journal == "missing":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such journal")
        if request.journal == "slow":
            self.slow_started.set()
            await asyncio.sleep(30)
        return pb.ReadResponse(offset=request.offset)

    async def unary_stream(
        self, request: pb.ReadRequest, context: Context
    ) -> AsyncIterator[pb.ReadResponse]:
        self.seen.append(request)
        for i in range(3):
            if self.fail is not None and i == 2:
                raise self.fail
            yield pb.ReadResponse(offset=request.offset + i)

    async def stream_unary(
        self, requests: AsyncIterator[pb.AppendRequest], context: Context
    ) -> pb.AppendResponse:
        count = 0
        async for request in requests:
            self.seen.append(request)
            count += 1
        return pb.AppendResponse(total_chunks=count)

    async def stream_stream(
        self, requests: AsyncIterator[pb.AppendRequest], context: Context
    ) -> None:
        async for request in requests:
            self.seen.append(request)
            await context.write(pb.AppendResponse(total_chunks=1))


def _handlers(service: Service) -> grpc.GenericRpcHandler:
    read_de, read_ser = pb.ReadRequest.FromString, pb.ReadResponse.SerializeToString
    app_de, app_ser = pb.AppendRequest.FromString, pb.AppendResponse.SerializeToString
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(
                service.unary, request_deserializer=read_de, response_serializer=read_ser
            ),
            "UnaryStream": grpc.unary_stream_rpc_method_handler(
                service.unary_stream, request_deserializer=read_de, response_serializer=read_ser
            ),
            "StreamUnary": grpc.stream_unary_rpc_method_handler(
                service.stream_unary, request_deserializer=app_de, response_serializer=app_ser
            ),
            "StreamStream": grpc.stream_stream_rpc_method_handler(
                service.stream_stream, request_deserializer=app_de, response_serializer=app_ser
            ),
        },
    )


class Served:
    def __init__(self, service: Service, capture: Capture, channel: grpc.aio.Channel) -> None:
        self.service = service
        self.capture = capture
        self.channel = channel

    def lines(self) -> list[str]:
        return [r.getMessage() for r in self.capture.records]

    def raw(self, shape: str) -> Callable[..., Any]:
        method = f"/{SERVICE}/{shape}"
        kw: dict[str, Any] = {"request_serializer": None, "response_deserializer": None}
        if shape == "Unary":
            return self.channel.unary_unary(method, **kw)
        if shape == "UnaryStream":
            return self.channel.unary_stream(method, **kw)
        if shape == "StreamUnary":
            return self.channel.stream_unary(method, **kw)
        return self.channel.stream_stream(method, **kw)


@pytest.fixture
def logger() -> Iterator[tuple[logging.Logger, Capture]]:
    capture = Capture()
    named = logging.getLogger("tests.request_guard")
    named.addHandler(capture)
    named.setLevel(logging.DEBUG)
    named.propagate = False
    try:
        yield named, capture
    finally:
        named.removeHandler(capture)


async def _serve(
    logger: tuple[logging.Logger, Capture], log_interval: float = 30.0
) -> tuple[grpc.aio.Server, Served]:
    service = Service()
    server = grpc.aio.server(
        interceptors=[RequestGuard(log_interval=log_interval, logger=logger[0])]
    )
    server.add_generic_rpc_handlers((_handlers(service),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return server, Served(service, logger[1], channel)


async def _call(served: Served, shape: str, messages: list[bytes]) -> list[bytes]:
    """Call a method with raw request bytes; the raw responses."""
    call = served.raw(shape)
    if shape == "Unary":
        return [await call(messages[0], timeout=10)]
    if shape == "UnaryStream":
        return [r async for r in call(messages[0], timeout=10)]

    async def requests() -> AsyncIterator[bytes]:
        for m in messages:
            yield m

    if shape == "StreamUnary":
        return [await call(requests(), timeout=10)]
    return [r async for r in call(requests(), timeout=10)]


@pytest.mark.parametrize("shape", ["Unary", "UnaryStream", "StreamUnary", "StreamStream"])
async def test_undecodable_request_is_invalid_argument_and_never_handled(
    logger: tuple[logging.Logger, Capture], shape: str
) -> None:
    server, served = await _serve(logger)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(served, shape, [GARBAGE])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = err.value.details() or ""
        assert details.startswith(f"/{SERVICE}/{shape}: malformed request: ")
        assert served.service.seen == []
        [record] = served.capture.records
        assert record.levelno == logging.WARNING
        assert record.getMessage() == "malformed request"
        assert record.method == f"/{SERVICE}/{shape}"  # type: ignore[attr-defined]
        assert record.peer.startswith("ipv4:127.0.0.1:")  # type: ignore[attr-defined]
        assert record.exc_info is None
        # A good request is served as before.
        good = pb.ReadRequest(journal="a/b", offset=5).SerializeToString()
        if shape.startswith("Stream"):
            good = pb.AppendRequest(content=b"x").SerializeToString()
        assert await _call(served, shape, [good, good][: 1 if shape[0] == "U" else 2])
    finally:
        await served.channel.close()
        await server.stop(0)


@pytest.mark.parametrize("shape", ["StreamUnary", "StreamStream"])
async def test_a_bad_message_mid_stream_ends_the_stream(
    logger: tuple[logging.Logger, Capture], shape: str
) -> None:
    server, served = await _serve(logger)
    try:
        first = pb.AppendRequest(journal="a/b").SerializeToString()
        after = pb.AppendRequest(content=b"never seen").SerializeToString()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(served, shape, [first, GARBAGE, after])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert served.service.seen == [pb.AppendRequest(journal="a/b")]
        assert served.lines() == ["malformed request"]
    finally:
        await served.channel.close()
        await server.stop(0)


async def test_malformed_requests_cost_one_line_then_a_summary_per_interval(
    logger: tuple[logging.Logger, Capture],
) -> None:
    server, served = await _serve(logger, log_interval=0.5)
    try:
        for shape in ("Unary", "StreamUnary"):
            for _ in range(100):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await _call(served, shape, [GARBAGE])
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await asyncio.wait_for(served.capture.wait_for(4), 10)
        lines = sorted((r.method, r.getMessage()) for r in served.capture.records)  # type: ignore[attr-defined]
        assert lines == [
            (f"/{SERVICE}/StreamUnary", "99 more malformed requests suppressed"),
            (f"/{SERVICE}/StreamUnary", "malformed request"),
            (f"/{SERVICE}/Unary", "99 more malformed requests suppressed"),
            (f"/{SERVICE}/Unary", "malformed request"),
        ]
        # Once the interval passed with no more events, the next is logged in full again.
        await asyncio.sleep(0.6)
        with pytest.raises(grpc.aio.AioRpcError):
            await _call(served, "Unary", [GARBAGE])
        assert served.lines()[-1] == "malformed request"
    finally:
        await served.channel.close()
        await server.stop(0)


@pytest.mark.parametrize("shape", ["Unary", "UnaryStream"])
async def test_an_unexpected_exception_is_internal_and_logged_once_with_its_traceback(
    logger: tuple[logging.Logger, Capture], shape: str
) -> None:
    server, served = await _serve(logger)
    try:
        served.service.fail = ZeroDivisionError("boom")
        good = pb.ReadRequest(journal="a/b").SerializeToString()
        for _ in range(20):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _call(served, shape, [good])
            assert err.value.code() == grpc.StatusCode.INTERNAL
            assert "ZeroDivisionError: boom" in (err.value.details() or "")
        [record] = served.capture.records
        assert record.levelno == logging.ERROR
        assert record.exc_info is not None and record.exc_info[0] is ZeroDivisionError
        assert record.error_type == "ZeroDivisionError"  # type: ignore[attr-defined]
        # Another exception type on the same method is a new key: logged too.
        served.service.fail = KeyError("k")
        with pytest.raises(grpc.aio.AioRpcError):
            await _call(served, shape, [good])
        assert len(served.capture.records) == 2
    finally:
        await served.channel.close()
        await server.stop(0)


async def test_aborts_and_cancellations_pass_through_unlogged(
    logger: tuple[logging.Logger, Capture],
) -> None:
    server, served = await _serve(logger)
    try:
        missing = pb.ReadRequest(journal="missing").SerializeToString()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(served, "Unary", [missing])
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.details() == "no such journal"

        slow = served.raw("Unary")(pb.ReadRequest(journal="slow").SerializeToString())
        await asyncio.wait_for(served.service.slow_started.wait(), 10)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        await asyncio.sleep(0.1)
        assert served.capture.records == []
    finally:
        await served.channel.close()
        await server.stop(0)
