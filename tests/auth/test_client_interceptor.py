"""The tokens a pygazette client signs per RPC, seen by a real gRPC server: the claims and
lifetimes of Gazette's AuthJournalClient and AuthShardClient (broker/protocol/auth.go,
consumer/protocol/auth.go of v0.103.0)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import jwt
import pytest

from pygazette.auth.client_interceptor import auth_interceptors
from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb

KEYS = base64.b64encode(b"client-interceptor-key".ljust(32, b"k")).decode()
HOUR, MINUTE = 3600, 60
NAME = {"include": {"labels": [{"name": "name", "value": "a/journal"}]}, "exclude": {}}

# method → (request, response type, streamed response, Gazette's claims' cap, sel, lifetime)
CASES: dict[str, tuple[Any, Any, bool, int, dict[str, Any], int]] = {
    "/protocol.Journal/List": (
        pb.ListRequest(selector=pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="x")]))),
        pb.ListResponse,
        True,
        2,
        {"include": {"labels": [{"name": "x"}]}, "exclude": {}},
        HOUR,
    ),
    "/protocol.Journal/Apply": (pb.ApplyRequest(), pb.ApplyResponse, False, 4, {}, MINUTE),
    "/protocol.Journal/Read": (
        pb.ReadRequest(journal="a/journal;meta"),
        pb.ReadResponse,
        True,
        8,
        NAME,
        HOUR,
    ),
    "/protocol.Journal/ListFragments": (
        pb.FragmentsRequest(journal="a/journal"),
        pb.FragmentsResponse,
        False,
        8,
        NAME,
        HOUR,
    ),
    "/consumer.Shard/Stat": (
        cpb.StatRequest(shard="s-1"),
        cpb.StatResponse,
        False,
        8,
        {"include": {"labels": [{"name": "id", "value": "s-1"}]}, "exclude": {}},
        MINUTE,
    ),
    "/consumer.Shard/List": (cpb.ListRequest(), cpb.ListResponse, False, 2, {}, MINUTE),
    "/consumer.Shard/Apply": (cpb.ApplyRequest(), cpb.ApplyResponse, False, 4, {}, MINUTE),
    "/consumer.Shard/GetHints": (
        cpb.GetHintsRequest(shard="s-1"),
        cpb.GetHintsResponse,
        False,
        8,
        {"include": {"labels": [{"name": "id", "value": "s-1"}]}, "exclude": {}},
        MINUTE,
    ),
    "/consumer.Shard/Unassign": (
        cpb.UnassignRequest(shards=["s-1", "s-2"]),
        cpb.UnassignResponse,
        False,
        4,
        {
            "include": {"labels": [{"name": "id", "value": "s-1"}, {"name": "id", "value": "s-2"}]},
            "exclude": {},
        },
        MINUTE,
    ),
}


class _Recorder(grpc.GenericRpcHandler):
    """Answers every method with an empty response, recording its `authorization`."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = str(details.method)
        if method not in CASES:
            return None
        self.seen[method] = dict(details.invocation_metadata or ())["authorization"]
        _, response, streamed, *_ = CASES[method]

        async def unary(_request: bytes, _context: Any) -> bytes:
            return bytes(response().SerializeToString())

        async def stream(_request: bytes, _context: Any) -> AsyncIterator[bytes]:
            yield bytes(response().SerializeToString())

        if streamed:
            return grpc.unary_stream_rpc_method_handler(stream)
        return grpc.unary_unary_rpc_method_handler(unary)


def _normalized(selector: Any) -> dict[str, Any]:
    """A claims' `sel` with null or empty label lists left out."""
    out: dict[str, Any] = {}
    for part in ("include", "exclude"):
        labels = (selector or {}).get(part, {}).get("labels") or []
        out[part] = {"labels": labels} if labels else {}
    return out


@pytest.mark.parametrize("method", sorted(CASES))
async def test_rpcs_are_signed_with_gazettes_claims_and_lifetimes(method: str) -> None:
    recorder = _Recorder()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([recorder])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        auth = KeyedAuth(KEYS)
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=auth_interceptors(auth)
        )
        async with channel:
            request, response, streamed, *_ = CASES[method]
            if streamed:
                call = channel.unary_stream(
                    method,
                    request_serializer=type(request).SerializeToString,
                    response_deserializer=response.FromString,
                )(request)
                assert [r async for r in call] == [response()]
            else:
                call = channel.unary_unary(
                    method,
                    request_serializer=type(request).SerializeToString,
                    response_deserializer=response.FromString,
                )
                assert await call(request) == response()
    finally:
        await server.stop(None)
    _, _, _, cap, sel, lifetime = CASES[method]
    token = recorder.seen[method].removeprefix("Bearer ")
    doc = jwt.decode(token, auth.keys[0], algorithms=["HS256"])
    assert doc["cap"] == cap
    assert _normalized(doc.get("sel")) == _normalized(sel)
    assert doc["exp"] - doc["iat"] == lifetime
