"""The connection to a broker: one `grpc.aio` channel and typed callables of the Journal RPCs.

Everything else in the client package talks to brokers through a `JournalClient`. It holds no
per-journal state; the Reader, Appender and listing helpers are built on top of it.
"""

from __future__ import annotations

from typing import Unpack

import grpc
import grpc.aio

from pygazette.client.channel import ChannelOptions, Connection
from pygazette.client.defaults import BROKER_ADDRESS_ENV, DEFAULT_BROKER, broker_address_from_env
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc

__all__ = [
    "BROKER_ADDRESS_ENV",
    "DEFAULT_BROKER",
    "JournalClient",
    "broker_address_from_env",
    "is_unavailable",
]


class JournalClient(Connection):
    """An asyncio connection to one broker (a `Connection`: create it inside a running event
    loop, use it as an async context manager or call `close()`). Requests may be sent to any
    broker of a cluster: brokers proxy to the journal's primary as needed.
    """

    def __init__(self, address: str = DEFAULT_BROKER, **channel: Unpack[ChannelOptions]) -> None:
        super().__init__(address, **channel)
        self.stub = pb_grpc.JournalStub(self.channel)  # type: ignore[no-untyped-call]

        ch = self.channel
        # List streams: a snapshot (possibly over several responses), then more snapshots
        # while `watch` is set.
        self.rpc_list: grpc.aio.UnaryStreamMultiCallable[pb.ListRequest, pb.ListResponse] = (
            ch.unary_stream(
                "/protocol.Journal/List",
                request_serializer=pb.ListRequest.SerializeToString,
                response_deserializer=pb.ListResponse.FromString,
            )
        )
        self.rpc_apply: grpc.aio.UnaryUnaryMultiCallable[pb.ApplyRequest, pb.ApplyResponse] = (
            ch.unary_unary(
                "/protocol.Journal/Apply",
                request_serializer=pb.ApplyRequest.SerializeToString,
                response_deserializer=pb.ApplyResponse.FromString,
            )
        )
        self.rpc_read: grpc.aio.UnaryStreamMultiCallable[pb.ReadRequest, pb.ReadResponse] = (
            ch.unary_stream(
                "/protocol.Journal/Read",
                request_serializer=pb.ReadRequest.SerializeToString,
                response_deserializer=pb.ReadResponse.FromString,
            )
        )
        self.rpc_append: grpc.aio.StreamUnaryMultiCallable[pb.AppendRequest, pb.AppendResponse] = (
            ch.stream_unary(
                "/protocol.Journal/Append",
                request_serializer=pb.AppendRequest.SerializeToString,
                response_deserializer=pb.AppendResponse.FromString,
            )
        )
        self.rpc_list_fragments: grpc.aio.UnaryUnaryMultiCallable[
            pb.FragmentsRequest, pb.FragmentsResponse
        ] = ch.unary_unary(
            "/protocol.Journal/ListFragments",
            request_serializer=pb.FragmentsRequest.SerializeToString,
            response_deserializer=pb.FragmentsResponse.FromString,
        )

    # Routing (`routed_client.RoutedJournalClient` overrides these): this client sends every
    # RPC to its one broker, which proxies to the journal's primary as needed.
    def read_rpc(
        self, journal: str
    ) -> grpc.aio.UnaryStreamMultiCallable[pb.ReadRequest, pb.ReadResponse]:
        """The Read callable to read `journal` with."""
        return self.rpc_read

    def note_route(self, journal: str, route: pb.Route) -> None:
        """A broker said `journal` has `route` (in a response header or a listing)."""

    def read_failed(
        self,
        journal: str,
        rpc: grpc.aio.UnaryStreamMultiCallable[pb.ReadRequest, pb.ReadResponse],
        error: grpc.aio.AioRpcError,
    ) -> None:
        """A read of `journal` through `rpc` (from `read_rpc`) failed with `error`."""

    def append_rpc(
        self, journal: str
    ) -> grpc.aio.StreamUnaryMultiCallable[pb.AppendRequest, pb.AppendResponse]:
        """The Append callable to append to `journal` with."""
        return self.rpc_append

    def append_failed(
        self,
        journal: str,
        rpc: grpc.aio.StreamUnaryMultiCallable[pb.AppendRequest, pb.AppendResponse],
        error: grpc.aio.AioRpcError,
    ) -> None:
        """An append to `journal` through `rpc` (from `append_rpc`) failed with `error`."""


def is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` is a gRPC transport failure (broker unreachable, connection lost)."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE
