"""Garbage on the wire and malformed messages get errors; the broker keeps serving."""

from __future__ import annotations

import socket

import grpc
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all
from tests.support.broker_process import BrokerProcess


async def test_garbage_bytes_and_bad_protobufs(broker: BrokerProcess) -> None:
    # Raw garbage instead of an HTTP/2 preface.
    with socket.create_connection(("127.0.0.1", broker.port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)) * 10)
        sock.settimeout(5)
        try:
            sock.recv(1024)
        except OSError:
            pass

    async with grpc.aio.insecure_channel(broker.address) as channel:
        # A Read whose payload is not a valid ReadRequest protobuf.
        raw_read = channel.unary_stream(
            "/protocol.Journal/Read",
            request_serializer=lambda b: b,
            response_deserializer=pb.ReadResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError):
            async for _ in raw_read(b"\xff\xff\xff\xff\x0f"):
                pass
        # An unknown method.
        unknown = channel.unary_unary(
            "/protocol.Journal/Nope", request_serializer=lambda b: b, response_deserializer=bytes
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await unknown(b"")
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # An Append stream with no messages at all.
        stub = pb_grpc.JournalStub(channel)

        async def nothing():  # type: ignore[no-untyped-def]
            return
            yield

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Append(nothing())
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        # The broker still serves, and nothing was lost.
        await apply_specs(stub, journal_spec("bad/input"))
        assert (await append(stub, "bad/input", b"still fine")).status == pb.OK
        content, _ = await read_all(stub, "bad/input")
        assert content == b"still fine"
    assert broker.proc is not None and broker.proc.poll() is None
