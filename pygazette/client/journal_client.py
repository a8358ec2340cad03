"""The connection to a broker: one `grpc.aio` channel and typed callables of the Journal RPCs.

Everything else in the client package talks to brokers through a `JournalClient`. It holds no
per-journal state; the Reader, Appender and listing helpers are built on top of it.
"""

from __future__ import annotations

import os
from types import TracebackType
from urllib.parse import urlsplit

import grpc
import grpc.aio

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc

DEFAULT_BROKER = "http://localhost:8080"
BROKER_ADDRESS_ENV = "BROKER_ADDRESS"

# Gazette moves fragment-sized payloads (ListFragments pages, large appends); gRPC's default
# 4 MiB receive limit is too small for them.
MAX_MESSAGE_SIZE = 64 << 20

# Keepalive pings only while an RPC is open. Five minutes is the smallest ping interval a gRPC
# server accepts by default, so long idle blocking reads are never cut off for "too many
# pings"; a killed broker is noticed at once anyway, as its TCP connection is reset.
KEEPALIVE_TIME_MS = 5 * 60 * 1000
KEEPALIVE_TIMEOUT_MS = 20 * 1000


def channel_target(address: str) -> tuple[str, bool]:
    """Map a broker address to a gRPC target and whether it uses TLS.

    Accepts "host:port", "http://host:port" and "https://host:port" (paths are ignored), and
    passes through gRPC target schemes such as "unix:" and "dns:".
    """
    address = address.strip()
    if not address:
        raise ValueError("empty broker address")
    if "://" not in address:
        return address, False
    parts = urlsplit(address)
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise ValueError(f"broker address has no host: {address!r}")
        host = parts.hostname
        if ":" in host:  # IPv6 literal.
            host = f"[{host}]"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{host}:{port}", parts.scheme == "https"
    if parts.scheme in ("unix", "dns", "ipv4", "ipv6"):
        return address, False
    raise ValueError(f"unsupported broker address scheme {parts.scheme!r} in {address!r}")


def broker_address_from_env(default: str = DEFAULT_BROKER) -> str:
    """The broker address from $BROKER_ADDRESS, else `default`."""
    return os.environ.get(BROKER_ADDRESS_ENV) or default


class JournalClient:
    """An asyncio connection to one broker.

    Create it inside a running event loop (gRPC binds the channel to the loop), use it as an
    async context manager or call `close()`. Requests may be sent to any broker of a cluster:
    brokers proxy to the journal's primary as needed.
    """

    def __init__(
        self,
        address: str = DEFAULT_BROKER,
        *,
        max_message_size: int = MAX_MESSAGE_SIZE,
        keepalive_time_ms: int = KEEPALIVE_TIME_MS,
        options: list[tuple[str, int | str]] | None = None,
    ) -> None:
        self.address = address
        self.target, secure = channel_target(address)
        opts: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", max_message_size),
            ("grpc.max_send_message_length", max_message_size),
            ("grpc.keepalive_time_ms", keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 0),
            # Reconnect quickly after a broker restart instead of gRPC's default backoff of
            # up to two minutes; retry policies above the channel add their own backoff.
            # (Not grpc.min_reconnect_backoff_ms: gRPC also takes it as the connect timeout,
            # and 100 ms fails connections to a busy server before its HTTP/2 SETTINGS.)
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        opts.extend(options or [])
        if secure:
            self.channel = grpc.aio.secure_channel(
                self.target, grpc.ssl_channel_credentials(), options=opts
            )
        else:
            self.channel = grpc.aio.insecure_channel(self.target, options=opts)
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

    async def close(self, grace: float | None = None) -> None:
        """Close the channel, cancelling RPCs still in flight (after `grace` seconds)."""
        await self.channel.close(grace)

    async def __aenter__(self) -> JournalClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"JournalClient({self.address!r})"


def is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` is a gRPC transport failure (broker unreachable, connection lost)."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE
