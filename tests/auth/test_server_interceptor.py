"""AuthServerInterceptor on a real grpc.aio server: a token's expiry bounds the RPC it started
(as Gazette binds it to the RPC's deadline), whatever the RPC's shape, and nothing else does.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from pygazette.auth.capability import Capability
from pygazette.auth.claims import Claims
from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.auth.server_interceptor import EXPIRED, AuthServerInterceptor
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc

KEYS = base64.b64encode(b"interceptor-test-key".ljust(32, b"k")).decode()
Context = grpc.aio.ServicerContext  # type: ignore[type-arg]


class Journal(pb_grpc.JournalServicer):  # type: ignore[misc]
    """Read streams one response and then waits (a read at the head); Append waits for its
    requests to end; Apply sleeps as long as its request's journal name says (or raises a
    TimeoutError of its own)."""

    async def Read(self, request: pb.ReadRequest, context: Context) -> AsyncIterator[Any]:
        yield pb.ReadResponse(offset=request.offset)
        await asyncio.sleep(3600)

    async def Append(self, request_iterator: Any, context: Context) -> pb.AppendResponse:
        async for _ in request_iterator:
            pass
        return pb.AppendResponse()

    async def Apply(self, request: pb.ApplyRequest, context: Context) -> pb.ApplyResponse:
        name = request.changes[0].delete
        if name == "own/timeout":
            async with asyncio.timeout(0.01):
                await asyncio.sleep(1)
        await asyncio.sleep(float(name.rsplit("/", 1)[1]))
        return pb.ApplyResponse()


@pytest.fixture
async def served() -> AsyncIterator[tuple[Any, KeyedAuth]]:
    auth = KeyedAuth(KEYS)
    auth.leeway = 0.0  # Tokens end at their `exp`, to the second.
    server = grpc.aio.server(interceptors=[AuthServerInterceptor(auth)])
    pb_grpc.add_JournalServicer_to_server(Journal(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield pb_grpc.JournalStub(channel), auth  # type: ignore[no-untyped-call]
    finally:
        await channel.close()
        await server.stop(None)


def _md(auth: KeyedAuth, ttl: float) -> tuple[tuple[str, str], ...]:
    return (("authorization", "Bearer " + auth.sign(Claims(Capability.ALL), ttl)),)


def _expires_at(auth: KeyedAuth, md: tuple[tuple[str, str], ...]) -> float:
    claims = auth.verify(md[0][1], 0)
    assert claims.expires_at is not None
    return claims.expires_at


async def test_a_read_ends_when_its_token_expires(served: tuple[Any, KeyedAuth]) -> None:
    stub, auth = served
    md = _md(auth, 2.0)  # `exp` is in whole seconds: it expires in 1-2 s.
    exp = _expires_at(auth, md)
    call = stub.Read(pb.ReadRequest(journal="a/b", offset=7), metadata=md)
    first = await call.read()
    assert first.offset == 7  # The read ran...
    # ...until its token expired, not before, and then its stream ended cleanly (as
    # Gazette's Read ends at its deadline: SuppressCancellationError).
    assert await call.read() is grpc.aio.EOF
    assert time.time() >= exp - 0.05
    assert await call.code() == grpc.StatusCode.OK


async def test_an_append_ends_when_its_token_expires(served: tuple[Any, KeyedAuth]) -> None:
    stub, auth = served
    md = _md(auth, 2.0)
    exp = _expires_at(auth, md)
    call = stub.Append(metadata=md)
    await call.write(pb.AppendRequest(journal="a/b"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert time.time() >= exp - 0.05
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_a_unary_rpc_runs_to_its_end_within_its_token(
    served: tuple[Any, KeyedAuth],
) -> None:
    stub, auth = served
    resp = await stub.Apply(
        pb.ApplyRequest(changes=[pb.ApplyRequest.Change(delete="sleep/0.2")]),
        metadata=_md(auth, 60.0),
    )
    assert resp == pb.ApplyResponse()
    md = _md(auth, 2.0)
    exp = _expires_at(auth, md)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Apply(
            pb.ApplyRequest(changes=[pb.ApplyRequest.Change(delete="sleep/5")]), metadata=md
        )
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.time() < exp + 1.0  # Ended at expiry, not at 5 s.


async def test_a_handlers_own_timeout_is_not_an_expiry(served: tuple[Any, KeyedAuth]) -> None:
    stub, auth = served
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Apply(
            pb.ApplyRequest(changes=[pb.ApplyRequest.Change(delete="own/timeout")]),
            metadata=_md(auth, 60.0),
        )
    assert info.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.details() != EXPIRED


async def test_without_a_token_nothing_expires() -> None:
    # `AA==` among the keys lets token-less RPCs through: they have no expiry to honour.
    auth = KeyedAuth(f"{KEYS}, AA==")
    auth.leeway = 0.0
    assert auth.verify(None, int(Capability.READ)).expires_at is None
    server = grpc.aio.server(interceptors=[AuthServerInterceptor(auth)])
    pb_grpc.add_JournalServicer_to_server(Journal(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            resp = await stub.Apply(
                pb.ApplyRequest(changes=[pb.ApplyRequest.Change(delete="sleep/0.3")])
            )
            assert resp == pb.ApplyResponse()
    finally:
        await server.stop(None)
