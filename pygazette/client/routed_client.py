"""`RoutedJournalClient`: a JournalClient whose reads and appends go straight to the
journal's primary.

A plain `JournalClient` sends every RPC to its one broker, which proxies a read or an append
of a journal it is not primary of to the primary: a second RPC, and the proxying broker's
CPU for every message of the stream. Thousands of shards of a consumer process each holding
a blocking read made that proxying a third of the brokers' CPU while the shards started, and
every transaction's appends (outputs, ACKs, the recovery log) paid it again. This client
remembers each journal's route — from the header of a read's first response, of an append's
response (an OK or a refusal such as NOT_JOURNAL_PRIMARY_BROKER) and from listings
(`note_route`) — and opens a read or an append of a journal whose primary it knows on a
channel to that broker's advertised endpoint, as Gazette's routed journal client does for
both. Everything else, and RPCs of journals whose route it doesn't know, go to its own
broker.

Routes are hints: a read sent to a broker that is no longer primary is proxied by that
broker as before. A routed read that fails as UNAVAILABLE (the broker unreachable, its
connection lost, or it not serving) forgets the journal's route, and that endpoint is not
routed to again for `ENDPOINT_BACKOFF_SECONDS`, so that the retry goes through this client's
own broker; a routed append the same. Only that code, and only of a call sent to that
endpoint (`read_failed`, `append_failed`), as
Gazette's dispatcher invalidates a route only on Unavailable: a call cancelled, a token
expired (DEADLINE_EXCEEDED), a message too large for this client, or a failure of the
client's own broker say nothing of the primary, and its retry goes to the primary again. At
most `max_routes` routes are kept (all are dropped past it). Channels are kept per endpoint
(one per broker), and closed with the client, or once no route has named their endpoint and
no call has used them for `PEER_SWEEP_SECONDS` to twice that (brokers that restarted on new
addresses leave their old ones behind): never under a call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Unpack

import grpc
import grpc.aio

from pygazette.client.channel import ChannelOptions, channel_target
from pygazette.client.journal_client import JournalClient
from pygazette.protocol.pb import protocol_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["ENDPOINT_BACKOFF_SECONDS", "PEER_SWEEP_SECONDS", "RoutedJournalClient"]

# An endpoint whose read failed is not routed to for this long.
ENDPOINT_BACKOFF_SECONDS = 30.0
# How often unused peer channels are looked for: a channel is closed once two looks in a row
# found no route naming its endpoint and no call on it (as Gazette's dispatcher sweeps every
# 30 s the SubConns not picked since its last sweep).
PEER_SWEEP_SECONDS = 30.0
_MAX_ROUTES = 100_000

ReadCallable = grpc.aio.UnaryStreamMultiCallable[pb.ReadRequest, pb.ReadResponse]
AppendCallable = grpc.aio.StreamUnaryMultiCallable[pb.AppendRequest, pb.AppendResponse]


class _PeerRead(ReadCallable):
    """The Read callable of a peer broker's channel, counting the calls still open on it."""

    def __init__(self, endpoint: str, client: JournalClient) -> None:
        self.endpoint = endpoint
        self.client = client
        self.calls = 0  # Calls not yet done. -1 once one could not be counted: never closed.
        self.append = _PeerAppend(self)

    def __call__(
        self,
        request: pb.ReadRequest,
        timeout: float | None = None,
        metadata: grpc.aio.Metadata | Sequence[tuple[str, str | bytes]] | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> grpc.aio.UnaryStreamCall[pb.ReadRequest, pb.ReadResponse]:
        call = self.client.rpc_read(
            request,
            timeout=timeout,
            metadata=metadata,
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )
        self.count(call)
        return call

    def count(self, call: grpc.aio.Call) -> None:
        """Count `call` among the channel's calls until it is done."""
        if self.calls >= 0:
            try:
                call.add_done_callback(self._ended)
            except NotImplementedError:
                self.calls = -1
            else:
                self.calls += 1

    def _ended(self, _call: object) -> None:
        if self.calls > 0:
            self.calls -= 1


class _PeerAppend(AppendCallable):
    """The Append callable of a peer broker's channel (its calls counted with its reads')."""

    def __init__(self, peer: _PeerRead) -> None:
        self.peer = peer

    def __call__(
        self,
        request_iterator: object = None,
        timeout: float | None = None,
        metadata: grpc.aio.Metadata | Sequence[tuple[str, str | bytes]] | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> grpc.aio.StreamUnaryCall[pb.AppendRequest, pb.AppendResponse]:
        call = self.peer.client.rpc_append(
            request_iterator,  # type: ignore[arg-type]
            timeout=timeout,
            metadata=metadata,
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )
        self.peer.count(call)
        return call


class RoutedJournalClient(JournalClient):
    """A JournalClient that reads each journal from its primary broker (see module doc)."""

    def __init__(
        self,
        address: str,
        *,
        max_routes: int = _MAX_ROUTES,
        clock: Callable[[], float] = time.monotonic,
        **channel: Unpack[ChannelOptions],
    ) -> None:
        super().__init__(address, **channel)
        self._channel_options = channel
        self.max_routes = max_routes
        self._clock = clock
        self._primaries: dict[str, str] = {}  # Journal name → its primary's endpoint.
        self._named: dict[str, int] = {}  # Endpoint → how many of _primaries name it.
        self._peers: dict[str, _PeerRead | None] = {}  # Endpoint → its reads (None: us).
        self._failed: dict[str, float] = {}  # Endpoint → when a read through it failed.
        self._swept_at = clock()
        self._unused: set[str] = set()  # Endpoints found unused by the last sweep.
        self._closing: set[asyncio.Task[None]] = set()
        self.routed_reads = 0  # Reads sent to a primary's own endpoint (tests, diagnostics).
        self.routed_appends = 0  # Appends sent to a primary's own endpoint.

    @property
    def peer_endpoints(self) -> list[str]:
        """Endpoints of the peer brokers this client holds a channel to."""
        return [ep for ep, peer in self._peers.items() if peer is not None]

    def read_rpc(self, journal: str) -> ReadCallable:
        peer = self._primary_peer(journal)
        if peer is None:
            return self.rpc_read
        self.routed_reads += 1
        return peer

    def append_rpc(self, journal: str) -> AppendCallable:
        peer = self._primary_peer(journal)
        if peer is None:
            return self.rpc_append
        self.routed_appends += 1
        return peer.append

    def _primary_peer(self, journal: str) -> _PeerRead | None:
        """The channel of the journal's primary, if it is known, usable and not this
        client's own broker."""
        self._maybe_sweep()
        endpoint = self._primaries.get(_name(journal))
        if endpoint is None:
            return None
        failed = self._failed.get(endpoint)
        if failed is not None:
            if self._clock() - failed < ENDPOINT_BACKOFF_SECONDS:
                return None
            del self._failed[endpoint]
        return self._peer(endpoint)

    def note_route(self, journal: str, route: pb.Route) -> None:
        self._maybe_sweep()
        name = _name(journal)
        primary = route.primary
        if 0 <= primary < len(route.endpoints) and route.endpoints[primary]:
            if len(self._primaries) >= self.max_routes and name not in self._primaries:
                self._primaries.clear()
                self._named.clear()
            self._set_primary(name, route.endpoints[primary])
        else:
            self._set_primary(name, None)

    def read_failed(self, journal: str, rpc: ReadCallable, error: grpc.aio.AioRpcError) -> None:
        if isinstance(rpc, _PeerRead):
            self._peer_failed(journal, rpc, error)

    def append_failed(self, journal: str, rpc: AppendCallable, error: grpc.aio.AioRpcError) -> None:
        if isinstance(rpc, _PeerAppend):
            self._peer_failed(journal, rpc.peer, error)

    def _peer_failed(self, journal: str, peer: _PeerRead, error: grpc.aio.AioRpcError) -> None:
        if error.code() != grpc.StatusCode.UNAVAILABLE:
            return  # Not a sign of the broker being unreachable (see the module doc).
        if self._peers.get(peer.endpoint) is not peer:
            return  # A channel closed since (swept): says nothing of the current one.
        self._failed[peer.endpoint] = self._clock()
        name = _name(journal)
        if self._primaries.get(name) == peer.endpoint:
            self._set_primary(name, None)

    def _set_primary(self, name: str, endpoint: str | None) -> None:
        old = self._primaries.get(name)
        if old == endpoint:
            return
        if old is not None:
            left = self._named.get(old, 0) - 1
            if left > 0:
                self._named[old] = left
            else:
                self._named.pop(old, None)
        if endpoint is None:
            del self._primaries[name]
        else:
            self._primaries[name] = endpoint
            self._named[endpoint] = self._named.get(endpoint, 0) + 1
            self._unused.discard(endpoint)

    def _peer(self, endpoint: str) -> _PeerRead | None:
        """The reads of `endpoint` (None: this client's own broker, or unusable)."""
        self._unused.discard(endpoint)
        if endpoint in self._peers:
            return self._peers[endpoint]
        peer: _PeerRead | None = None
        try:
            if channel_target(endpoint)[0] != self.target:
                peer = _PeerRead(endpoint, JournalClient(endpoint, **self._channel_options))
        except ValueError as exc:  # E.g. a plaintext endpoint while TLS is configured.
            log.warning(
                "cannot route reads to a broker endpoint (reading through %s instead)",
                self.address,
                extra={"endpoint": endpoint, "error": str(exc)},
            )
        self._peers[endpoint] = peer
        return peer

    def _maybe_sweep(self) -> None:
        """Every PEER_SWEEP_SECONDS: close the channels of endpoints that no route has named
        and no call has used since the last sweep (brokers gone, or moved to new addresses).
        Run as routes are noted and reads started, so the channels a client holds stay bounded
        by the endpoints its recent routes named, without a task of its own."""
        now = self._clock()
        if now - self._swept_at < PEER_SWEEP_SECONDS:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # Closing needs the client's loop; sweep on a later call.
        self._swept_at = now
        unused = {
            ep
            for ep, peer in self._peers.items()
            if ep not in self._named and (peer is None or peer.calls == 0)
        }
        for ep in unused & self._unused:
            peer = self._peers.pop(ep)
            if peer is not None:
                task = loop.create_task(peer.client.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        self._unused = {ep for ep in unused if ep in self._peers}
        for ep, at in list(self._failed.items()):
            if now - at >= ENDPOINT_BACKOFF_SECONDS:
                del self._failed[ep]

    async def close(self, grace: float | None = None) -> None:
        peers = [p for p in self._peers.values() if p is not None]
        self._peers.clear()
        for peer in peers:
            await peer.client.close(grace)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await super().close(grace)


def _name(journal: str) -> str:
    """The journal's name without a metadata path segment (";...")."""
    return journal.split(";", 1)[0]
