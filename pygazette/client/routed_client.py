"""`RoutedJournalClient`: a JournalClient whose reads go straight to the journal's primary.

A plain `JournalClient` sends every RPC to its one broker, which proxies a read of a
journal it is not primary of to the primary: a second RPC, and the proxying broker's CPU
for every message of the stream. Thousands of shards of a consumer process each holding a
blocking read made that proxying a third of the brokers' CPU while the shards started.
This client remembers each journal's route — from the header of a read's first response
and from listings (`note_route`) — and opens a read of a journal whose primary it knows on
a channel to that broker's advertised endpoint, as Gazette's routed journal client does.
Everything else, and reads of journals whose route it doesn't know, go to its own broker.

Routes are hints: a read sent to a broker that is no longer primary is proxied by that
broker as before. A routed read that fails as UNAVAILABLE (the broker unreachable, its
connection lost, or it not serving) forgets the journal's route, and that endpoint is not
routed to again for `ENDPOINT_BACKOFF_SECONDS`, so that the retry goes through this client's
own broker. Only that code, and only of a call sent to that endpoint (`read_failed`), as
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


class _PeerRead(ReadCallable):
    """The Read callable of a peer broker's channel, counting the calls still open on it."""

    def __init__(self, endpoint: str, client: JournalClient) -> None:
        self.endpoint = endpoint
        self.client = client
        self.calls = 0  # Calls not yet done. -1 once one could not be counted: never closed.

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
        if self.calls >= 0:
            try:
                call.add_done_callback(self._ended)
            except NotImplementedError:
                self.calls = -1
            else:
                self.calls += 1
        return call

    def _ended(self, _call: object) -> None:
        if self.calls > 0:
            self.calls -= 1


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

    @property
    def peer_endpoints(self) -> list[str]:
        """Endpoints of the peer brokers this client holds a channel to."""
        return [ep for ep, peer in self._peers.items() if peer is not None]

    def read_rpc(self, journal: str) -> ReadCallable:
        self._maybe_sweep()
        endpoint = self._primaries.get(_name(journal))
        if endpoint is None:
            return self.rpc_read
        failed = self._failed.get(endpoint)
        if failed is not None:
            if self._clock() - failed < ENDPOINT_BACKOFF_SECONDS:
                return self.rpc_read
            del self._failed[endpoint]
        peer = self._peer(endpoint)
        if peer is None:
            return self.rpc_read
        self.routed_reads += 1
        return peer

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
        if error.code() != grpc.StatusCode.UNAVAILABLE:
            return  # Not a sign of the broker being unreachable (see the module doc).
        if not isinstance(rpc, _PeerRead) or self._peers.get(rpc.endpoint) is not rpc:
            return  # Sent through this client's own broker: the primary was not asked.
        self._failed[rpc.endpoint] = self._clock()
        name = _name(journal)
        if self._primaries.get(name) == rpc.endpoint:
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
