"""gRPC channels to Gazette servers (brokers and consumer processes) and the connection that
owns one.

`channel_target` maps an address ("host:port", "http://host:port", "https://…", "unix:…") to
a gRPC target; `open_channel` opens a `grpc.aio` channel to it with the options every client
uses; `Connection` holds such a channel to one address and closes it as an async context
manager. `JournalClient` (brokers) and the consumer's `ShardClient` are Connections.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self, TypedDict, Unpack
from urllib.parse import urlsplit

import grpc
import grpc.aio

from pygazette.auth.authorizer import Authorizer
from pygazette.auth.client_interceptor import auth_interceptors
from pygazette.auth.tls import ClientTLS, channel_credentials

__all__ = [
    "KEEPALIVE_TIMEOUT_MS",
    "KEEPALIVE_TIME_MS",
    "MAX_MESSAGE_SIZE",
    "ChannelOptions",
    "Connection",
    "channel_target",
    "open_channel",
]

# Gazette moves fragment-sized payloads (ListFragments pages, large appends); gRPC's default
# 4 MiB receive limit is too small for them.
MAX_MESSAGE_SIZE = 64 << 20

# Keepalive pings only while an RPC is open. Five minutes is the smallest ping interval a gRPC
# server accepts by default, so long idle blocking reads are never cut off for "too many
# pings"; a killed server is noticed at once anyway, as its TCP connection is reset. A ping
# unanswered for KEEPALIVE_TIMEOUT_MS (a frozen server, a connection lost in the network) fails
# the connection's RPCs UNAVAILABLE. gRPC's core times a ping's acknowledgement out by
# grpc.http2.ping_timeout_ms (a minute by default), not by keepalive_timeout_ms: both are set.
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


class ChannelOptions(TypedDict, total=False):
    """What a client may change of its channel."""

    max_message_size: int  # Largest message sent or received (MAX_MESSAGE_SIZE).
    keepalive_time_ms: int  # Ping interval while an RPC is open (KEEPALIVE_TIME_MS).
    options: list[tuple[str, int | str]] | None  # More gRPC channel arguments.
    # For "https://" addresses: the CA to trust (else the system roots) and the client
    # certificate to present. Giving it for a plaintext address is an error.
    tls: ClientTLS | None
    # Authorization of every RPC: `KeyedAuth` (signs from --auth-keys) or `BearerAuth`.
    auth: Authorizer | None


def open_channel(address: str, **channel: Unpack[ChannelOptions]) -> tuple[str, grpc.aio.Channel]:
    """The gRPC target of `address` and a new channel to it (TLS for "https://"), with
    `options` added to the defaults. ValueError if the address is unusable, or if TLS material
    is given for a plaintext one (`TLSConfigError`, a ValueError, if the material is bad)."""
    target, secure = channel_target(address)
    tls = channel.get("tls")
    if tls is not None and not secure:
        raise ValueError(
            f"TLS certificates were given, but {address!r} is not an https:// address"
        )
    max_message_size = channel.get("max_message_size", MAX_MESSAGE_SIZE)
    opts: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", max_message_size),
        ("grpc.max_send_message_length", max_message_size),
        ("grpc.keepalive_time_ms", channel.get("keepalive_time_ms", KEEPALIVE_TIME_MS)),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 0),
        # Reconnect quickly after a server restart instead of gRPC's default backoff of
        # up to two minutes; retry policies above the channel add their own backoff.
        # (Not grpc.min_reconnect_backoff_ms: gRPC also takes it as the connect timeout,
        # and 100 ms fails connections to a busy server before its HTTP/2 SETTINGS.)
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
    opts.extend(channel.get("options") or [])
    auth = channel.get("auth")
    # Signs every RPC on the channel (see `pygazette.auth.client_interceptor`).
    icp = auth_interceptors(auth)
    if secure:
        return target, grpc.aio.secure_channel(
            target, channel_credentials(tls), options=opts, interceptors=icp
        )
    return target, grpc.aio.insecure_channel(target, options=opts, interceptors=icp)


class Connection:
    """One `grpc.aio` channel to the server at `address`.

    Create it inside a running event loop (gRPC binds the channel to the loop), use it as an
    async context manager or call `close()`.
    """

    def __init__(self, address: str, **channel: Unpack[ChannelOptions]) -> None:
        self.address = address
        self.target, self.channel = open_channel(address, **channel)

    async def close(self, grace: float | None = None) -> None:
        """Close the channel, cancelling RPCs still in flight (after `grace` seconds)."""
        await self.channel.close(grace)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r})"
