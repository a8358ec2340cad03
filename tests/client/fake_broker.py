"""A scripted in-process Journal service for client unit tests.

Each Read RPC plays the next script from `read_scripts`: a list of ReadResponses to send, where
an `Abort(code)` item aborts the RPC with that gRPC status and a `Hang()` item blocks until the
client goes away. Append RPCs record their requests and answer from `append_responses`. The
server runs on its own event loop thread, so that both the async client (on the test's loop)
and the sync facade (on its own thread) can use it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc


@dataclass
class Abort:
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    details: str = "scripted failure"


@dataclass
class Hang:
    pass


ReadItem = pb.ReadResponse | Abort | Hang


@dataclass
class AppendCall:
    requests: list[pb.AppendRequest] = field(default_factory=list)
    committed: bool = False  # The stream ended with an empty (commit) chunk.


class ScriptedJournal(pb_grpc.JournalServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.read_scripts: list[list[ReadItem]] = []
        self.read_requests: list[pb.ReadRequest] = []
        self.append_responses: list[pb.AppendResponse | Abort] = []
        self.append_calls: list[AppendCall] = []
        # When set, Append answers this right after the preamble, without reading content.
        self.append_refusal: pb.AppendResponse | None = None
        self.list_responses: list[list[pb.ListResponse]] = []
        # Set whenever a Read RPC arrives (waitable from any thread).
        self.read_started = threading.Event()

    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ReadResponse]:
        copy = pb.ReadRequest()
        copy.CopyFrom(request)
        self.read_requests.append(copy)
        self.read_started.set()
        script = self.read_scripts.pop(0) if self.read_scripts else [Hang()]
        for item in script:
            if isinstance(item, Abort):
                await context.abort(item.code, item.details)
            elif isinstance(item, Hang):
                await asyncio.sleep(3600)
            else:
                yield item

    async def Append(
        self,
        request_iterator: AsyncIterator[pb.AppendRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.AppendResponse:
        call = AppendCall()
        self.append_calls.append(call)
        if self.append_refusal is not None:
            async for req in request_iterator:
                call.requests.append(req)
                return self.append_refusal
        async for req in request_iterator:
            copy = pb.AppendRequest()
            copy.CopyFrom(req)
            call.requests.append(copy)
        call.committed = len(call.requests) >= 2 and not call.requests[-1].content
        resp = self.append_responses.pop(0) if self.append_responses else pb.AppendResponse()
        if isinstance(resp, Abort):
            await context.abort(resp.code, resp.details)
        if not call.committed:
            await context.abort(grpc.StatusCode.ABORTED, "append aborted by client")
        return resp

    async def List(
        self, request: pb.ListRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ListResponse]:
        script = self.list_responses.pop(0) if self.list_responses else [pb.ListResponse()]
        for resp in script:
            yield resp


class FakeBroker:
    """Runs a ScriptedJournal on 127.0.0.1 on a private event loop thread."""

    def __init__(self, port: int = 0) -> None:
        self.journal = ScriptedJournal()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server: grpc.aio.Server | None = None
        self.port = self._call(self._start(port))

    def _call(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(30)

    async def _start(self, port: int) -> int:
        server = grpc.aio.server()
        pb_grpc.add_JournalServicer_to_server(self.journal, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        self._server = server
        return port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._call(self._server.stop(None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def fake_broker() -> Iterator[FakeBroker]:
    broker = FakeBroker()
    try:
        yield broker
    finally:
        broker.stop()


# Response builders --------------------------------------------------------------------------


def metadata(
    offset: int,
    *,
    begin: int,
    end: int,
    write_head: int | None = None,
    journal: str = "a/journal",
    url: str = "",
    codec: int = pb.NONE,
    status: int = pb.OK,
) -> pb.ReadResponse:
    return pb.ReadResponse(
        status=status,  # type: ignore[arg-type]
        offset=offset,
        write_head=end if write_head is None else write_head,
        fragment=pb.Fragment(
            journal=journal,
            begin=begin,
            end=end,
            compression_codec=codec,  # type: ignore[arg-type]
        ),
        fragment_url=url,
    )


def content(offset: int, data: bytes) -> pb.ReadResponse:
    return pb.ReadResponse(offset=offset, content=data)
