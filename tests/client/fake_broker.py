"""A scripted in-process Journal service for client unit tests.

Each Read RPC plays the next script from `read_scripts`: a list of ReadResponses to send, where
an `Abort(code)` item aborts the RPC with that gRPC status and a `Hang()` item blocks until the
client goes away. Append RPCs record their requests and answer from `append_responses` (by
default: the commit of what they received, at the journal's write head). The server runs on its
own event loop thread, so that both the async client (on the test's loop) and the sync facade
(on its own thread) can use it.

Responses are sent as scripted: the client checks each with Gazette's rules, so scripts build
valid ones with the builders below (`committed`, `refused`, `listing`, ...), and a test of an
invalid response scripts that response itself.
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
from google.protobuf import duration_pb2

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
        # Unary RPCs answer the next scripted response (UNIMPLEMENTED when there is none).
        self.apply_responses: list[pb.ApplyResponse] = []
        self.fragments_responses: list[pb.FragmentsResponse] = []
        self.health_responses: list[pb.FragmentStoreHealthResponse] = []
        # Write heads of the journals appended to by default (unscripted) commits.
        self.write_heads: dict[str, int] = {}
        # Set whenever a Read RPC arrives (waitable from any thread).
        self.read_started = threading.Event()
        # When set, Append answers only once the event is set (from any thread), and sets
        # `append_at_gate` as it begins to wait (`append_cancelled` if the client goes away
        # meanwhile).
        self.append_gate: threading.Event | None = None
        self.append_at_gate = threading.Event()
        self.append_cancelled = threading.Event()

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
        heads = self.write_heads
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
        if self.append_gate is not None:
            self.append_at_gate.set()
            try:
                await asyncio.to_thread(self.append_gate.wait)
            except asyncio.CancelledError:
                self.append_cancelled.set()
                raise
        if self.append_responses:
            resp = self.append_responses.pop(0)
        else:
            journal = call.requests[0].journal if call.requests else "a/journal"
            begin = heads.get(journal, 0)
            end = begin + sum(len(r.content) for r in call.requests[1:])
            resp = committed(journal, begin, end)
        if isinstance(resp, Abort):
            await context.abort(resp.code, resp.details)
        if not call.committed:
            await context.abort(grpc.StatusCode.ABORTED, "append aborted by client")
        if resp.status == pb.OK and resp.HasField("commit"):
            heads[resp.commit.journal] = max(heads.get(resp.commit.journal, 0), resp.commit.end)
        return resp

    async def List(
        self, request: pb.ListRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ListResponse]:
        script = self.list_responses.pop(0) if self.list_responses else [listing()]
        for resp in script:
            yield resp


    async def Apply(
        self, request: pb.ApplyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ApplyResponse:
        return await _next(self.apply_responses, context)

    async def ListFragments(
        self, request: pb.FragmentsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.FragmentsResponse:
        return await _next(self.fragments_responses, context)

    async def FragmentStoreHealth(
        self, request: pb.FragmentStoreHealthRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.FragmentStoreHealthResponse:
        return await _next(self.health_responses, context)


async def _next(script: list[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    if not script:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "nothing scripted")
    return script.pop(0)


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


def header() -> pb.Header:
    """A valid response Header (a journal without a route, at etcd revision 1)."""
    return pb.Header(
        process_id=pb.ProcessSpec.ID(zone="local", suffix="fake-broker"),
        route=pb.Route(primary=-1),
        etcd=pb.Header.Etcd(cluster_id=1, member_id=1, revision=1, raft_term=1),
    )


def committed(journal: str, begin: int, end: int) -> pb.AppendResponse:
    """An OK AppendResponse committing [begin, end) of `journal`."""
    return pb.AppendResponse(
        status=pb.OK,
        header=header(),
        commit=pb.Fragment(journal=journal, begin=begin, end=end, compression_codec=pb.NONE),
        registers=pb.LabelSet(),
    )


def refused(status: int, registers: pb.LabelSet | None = None) -> pb.AppendResponse:
    """An AppendResponse refusing the append with `status` (REGISTER_MISMATCH carries the
    journal's `registers`)."""
    resp = pb.AppendResponse(status=status, header=header())  # type: ignore[arg-type]
    if registers is not None or status == pb.REGISTER_MISMATCH:
        resp.registers.CopyFrom(registers or pb.LabelSet())
    return resp


def listed(*names: str) -> list[pb.ListResponse.Journal]:
    """Listing entries of journals with valid (default) specs."""
    return [
        pb.ListResponse.Journal(
            spec=pb.JournalSpec(
                name=name,
                replication=1,
                fragment=pb.JournalSpec.Fragment(
                    length=1 << 20,
                    compression_codec=pb.NONE,
                    refresh_interval=duration_pb2.Duration(seconds=60),
                ),
            ),
            mod_revision=1,
            route=pb.Route(primary=-1),
        )
        for name in names
    ]


def listing(*names: str, status: int = pb.OK) -> pb.ListResponse:
    """A snapshot's first ListResponse (with its Header) listing `names`."""
    return pb.ListResponse(status=status, header=header(), journals=listed(*names))  # type: ignore[arg-type]
