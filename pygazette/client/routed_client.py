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
most `max_routes` routes are kept (all are dropped past it); channels are kept per
endpoint (one per broker) and closed with the client.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Unpack

import grpc
import grpc.aio

from pygazette.client.channel import ChannelOptions, channel_target
from pygazette.client.journal_client import JournalClient
from pygazette.protocol.pb import protocol_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["ENDPOINT_BACKOFF_SECONDS", "RoutedJournalClient"]

# An endpoint whose read failed is not routed to for this long.
ENDPOINT_BACKOFF_SECONDS = 30.0
_MAX_ROUTES = 100_000

ReadCallable = grpc.aio.UnaryStreamMultiCallable[pb.ReadRequest, pb.ReadResponse]


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
        self._peers: dict[str, JournalClient | None] = {}  # Endpoint → its client (None: us).
        self._failed: dict[str, float] = {}  # Endpoint → when a read through it failed.
        self.routed_reads = 0  # Reads sent to a primary's own endpoint (tests, diagnostics).

    def read_rpc(self, journal: str) -> ReadCallable:
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
        return peer.rpc_read

    def note_route(self, journal: str, route: pb.Route) -> None:
        name = _name(journal)
        primary = route.primary
        if 0 <= primary < len(route.endpoints) and route.endpoints[primary]:
            if len(self._primaries) >= self.max_routes and name not in self._primaries:
                self._primaries.clear()
            self._primaries[name] = route.endpoints[primary]
        else:
            self._primaries.pop(name, None)

    def forget_route(self, journal: str) -> None:
        self._primaries.pop(_name(journal), None)

    def read_failed(self, journal: str, rpc: ReadCallable, error: grpc.aio.AioRpcError) -> None:
        if error.code() != grpc.StatusCode.UNAVAILABLE:
            return  # Not a sign of the broker being unreachable (see the module doc).
        endpoint = next(
            (ep for ep, peer in self._peers.items() if peer is not None and peer.rpc_read is rpc),
            None,
        )
        if endpoint is None:
            return  # Sent through this client's own broker: the primary was not asked.
        self._failed[endpoint] = self._clock()
        name = _name(journal)
        if self._primaries.get(name) == endpoint:
            del self._primaries[name]

    def _peer(self, endpoint: str) -> JournalClient | None:
        """The client of `endpoint` (None: this client's own broker, or unusable)."""
        if endpoint in self._peers:
            return self._peers[endpoint]
        peer: JournalClient | None = None
        try:
            if channel_target(endpoint)[0] != self.target:
                peer = JournalClient(endpoint, **self._channel_options)
        except ValueError as exc:  # E.g. a plaintext endpoint while TLS is configured.
            log.warning(
                "cannot route reads to a broker endpoint (reading through %s instead)",
                self.address,
                extra={"endpoint": endpoint, "error": str(exc)},
            )
        self._peers[endpoint] = peer
        return peer

    async def close(self, grace: float | None = None) -> None:
        peers = [p for p in self._peers.values() if p is not None]
        self._peers.clear()
        for peer in peers:
            await peer.close(grace)
        await super().close(grace)


def _name(journal: str) -> str:
    """The journal's name without a metadata path segment (";...")."""
    return journal.split(";", 1)[0]
