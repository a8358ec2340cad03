"""Connections to peer brokers: one gRPC channel per advertised endpoint, shared by all RPCs.

Brokers talk to each other to replicate (Replicate) and to proxy clients' Append, Read and
ListFragments to the broker that serves them (a small Append whole, on pygazette's own
`PeerJournal` service: `peer_append_service`). Endpoints are the URLs brokers advertise in
their BrokerSpecs (`http://host:port`, or `https://host:port` for a TLS peer: as Gazette's
dispatcher does, the scheme decides, and `https://` peers are reached with the broker's peer
TLS material).
"""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit

import grpc
import grpc.aio

from pygazette.auth.authorizer import Authorizer
from pygazette.auth.client_interceptor import auth_interceptors
from pygazette.auth.tls import ClientTLS, channel_credentials
from pygazette.protocol.pb import peer_pb2_grpc as ppb_grpc
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.pb import retention_pb2_grpc as rpb_grpc

MAX_MESSAGE_BYTES = 64 << 20


class PeerUnavailable(Exception):
    """A peer has no usable endpoint (e.g. its member key carries none)."""


def endpoint_target(endpoint: str) -> str:
    """The gRPC target ("host:port") of an advertised endpoint URL."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PeerUnavailable(f"unusable peer endpoint {endpoint!r}")
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


class Peers:
    def __init__(self, *, tls: ClientTLS | None = None, auth: Authorizer | None = None) -> None:
        self._tls = tls
        # Signs every RPC to a peer with narrow claims, as Gazette's brokers re-sign.
        self._interceptors = auth_interceptors(auth)
        # Built (its files read and checked) now, at start-up; system roots if none given.
        self._credentials = channel_credentials(tls) if tls is not None else None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.JournalStub] = {}
        self._peer_stubs: dict[str, ppb_grpc.PeerJournalStub] = {}

    def stub(self, endpoint: str) -> pb_grpc.JournalStub:
        """The peer's `protocol.Journal` service."""
        stub = self._stubs.get(endpoint)
        if stub is None:
            stub = self._stubs[endpoint] = pb_grpc.JournalStub(self._channel(endpoint))  # type: ignore[no-untyped-call]
        return stub

    def connected(self, endpoint: str) -> bool:
        """Whether this broker's channel to the peer at `endpoint` is connected (READY)."""
        channel = self._channels.get(endpoint)
        return channel is not None and channel.get_state() == grpc.ChannelConnectivity.READY

    def peer_stub(self, endpoint: str) -> ppb_grpc.PeerJournalStub:
        """The peer's `pygazette.PeerJournal` service (pygazette brokers only)."""
        stub = self._peer_stubs.get(endpoint)
        if stub is None:
            stub = ppb_grpc.PeerJournalStub(self._channel(endpoint))  # type: ignore[no-untyped-call]
            self._peer_stubs[endpoint] = stub
        return stub

    def retention_stub(self, endpoint: str) -> rpb_grpc.RetentionStub:
        """The peer's `pygazette.Retention` service (pygazette brokers only)."""
        return rpb_grpc.RetentionStub(self._channel(endpoint))  # type: ignore[no-untyped-call]

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            target = endpoint_target(endpoint)
            channel = self._open(
                endpoint,
                target,
                [
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    # Notice a dead or frozen peer within seconds, not minutes. (gRPC's core
                    # times a ping's acknowledgement out by ping_timeout_ms, a minute by
                    # default, not by keepalive_timeout_ms.)
                    ("grpc.keepalive_time_ms", 2000),
                    ("grpc.keepalive_timeout_ms", 2000),
                    ("grpc.http2.ping_timeout_ms", 2000),
                    ("grpc.keepalive_permit_without_calls", 0),
                    ("grpc.http2.max_pings_without_data", 0),
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ],
            )
            self._channels[endpoint] = channel
        return channel

    def _open(self, endpoint: str, target: str, options: list[tuple[str, int]]) -> grpc.aio.Channel:
        if not endpoint.startswith("https://"):
            return grpc.aio.insecure_channel(
                target, options=options, interceptors=self._interceptors
            )
        if self._credentials is None:
            self._credentials = channel_credentials(self._tls)
        return grpc.aio.secure_channel(
            target, self._credentials, options=options, interceptors=self._interceptors
        )

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        self._peer_stubs.clear()
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close(None)
