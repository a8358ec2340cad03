"""A small async client of the `consumer.Shard` service, for the CLI and tests.

`ShardClient(address)` talks to any consumer process of an application (every process
answers List, Apply, GetHints and Unassign from the shared keyspace, and proxies Stat to the
shard's primary). Stat goes straight to the primary when the client knows the shard's route
(from an earlier List or Stat), and falls back to the given address when that process is
unreachable or no longer primary.

Non-OK statuses become `ShardError` subclasses (one per consumer Status, as the journal
client maps broker statuses in `pygazette.protocol.errors`); responses that break the
protocol's rules become `InvalidResponse` (a `ProtocolViolation`, counted by the client's
`response_check`); transport failures stay `grpc.aio.AioRpcError`.

`ShardPeers` caches one channel per advertised endpoint; the Shard service uses it to proxy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio

from pygazette.auth.authorizer import Authorizer
from pygazette.auth.tls import ClientTLS
from pygazette.client.channel import Connection, open_channel
from pygazette.client.response_check import check_response
from pygazette.protocol.errors import (
    StatusError,
    bind_status,
    enum_value_name,
)
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import consumer_pb2_grpc as cpb_grpc
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import format_selector, parse_selector
from pygazette.protocol.shard_validation import (
    validate_get_hints_response,
    validate_shard_apply_response,
    validate_shard_list_response,
    validate_stat_response,
    validate_unassign_response_status,
)

__all__ = [
    "DEFAULT_CONSUMER",
    "NoShardPrimary",
    "NotShardPrimary",
    "ShardClient",
    "ShardError",
    "ShardEtcdTransactionFailed",
    "ShardNotFound",
    "ShardPeers",
    "ShardStopped",
    "raise_for_shard_status",
    "shard_error_for_status",
    "shard_status_name",
]

DEFAULT_CONSUMER = "http://localhost:8080"


# Errors.
def shard_status_name(status: int) -> str:
    """Name of a `consumer.Status` value, or ``"Status(<n>)"`` when it is unknown."""
    return enum_value_name(cpb.Status, status)


class ShardError(StatusError):
    """A Shard RPC answered with a non-OK `consumer.Status`."""

    STATUS_ENUM = cpb.Status


@bind_status("SHARD_NOT_FOUND")
class ShardNotFound(ShardError):
    """The named shard does not exist."""


@bind_status("NO_SHARD_PRIMARY")
class NoShardPrimary(ShardError):
    """The shard has no primary at the moment (transient)."""


@bind_status("NOT_SHARD_PRIMARY")
class NotShardPrimary(ShardError):
    """The responding process is not the shard's primary (and may not proxy)."""


@bind_status("ETCD_TRANSACTION_FAILED")
class ShardEtcdTransactionFailed(ShardError):
    """The change's etcd transaction failed (e.g. a stale expect_mod_revision)."""


@bind_status("SHARD_STOPPED")
class ShardStopped(ShardError):
    """The shard's primary stopped while serving the request."""


def shard_error_for_status(
    status: int, detail: str = "", header: pb.Header | None = None
) -> ShardError:
    """The exception of a non-OK consumer status (a plain ShardError if unknown)."""
    err = ShardError.for_status(status, detail, header)
    assert isinstance(err, ShardError)
    return err


def raise_for_shard_status(response: Any, detail: str = "") -> None:
    """Raise the matching ShardError unless `response.status` is OK."""
    ShardError.raise_for(response, detail)


def _check(validator: Callable[[Any], None], response: Any, what: str, subject: str = "") -> None:
    """Gazette's rules for a `what` response (InvalidResponse, counted, if one is broken)."""
    check_response(what, subject, validator, response)


def as_shard_selector(selector: str | pb.LabelSelector) -> pb.LabelSelector:
    """A LabelSelector from its text form ("id=shard-1, app in (a, b)") or as is."""
    if isinstance(selector, pb.LabelSelector):
        return selector
    return parse_selector(selector)


# Channels.
class ShardPeers:
    """One channel (and Shard stub) per consumer endpoint, shared by all calls."""

    def __init__(self, *, tls: ClientTLS | None = None, auth: Authorizer | None = None) -> None:
        self._tls = tls  # For "https://" endpoints.
        self._auth = auth  # Signs each RPC (a proxying consumer re-signs with its own key).
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, cpb_grpc.ShardStub] = {}

    def stub(self, endpoint: str) -> cpb_grpc.ShardStub:
        """The stub of `endpoint` (an advertised URL such as "http://host:port");
        ValueError if it is unusable."""
        stub = self._stubs.get(endpoint)
        if stub is None:
            secure = endpoint.startswith("https://")
            _, channel = open_channel(
                endpoint, tls=self._tls if secure else None, auth=self._auth
            )
            self._channels[endpoint] = channel
            stub = self._stubs[endpoint] = cpb_grpc.ShardStub(channel)  # type: ignore[no-untyped-call]
        return stub

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close(None)


def _primary_endpoint(route: pb.Route) -> str:
    if 0 <= route.primary < len(route.endpoints):
        return route.endpoints[route.primary]
    return ""


class ShardClient(Connection):
    """An asyncio client of one consumer application's Shard service."""

    def __init__(
        self,
        address: str = DEFAULT_CONSUMER,
        *,
        route_stat: bool = True,
        tls: ClientTLS | None = None,
        auth: Authorizer | None = None,
    ) -> None:
        super().__init__(address, tls=tls, auth=auth)
        self.stub = cpb_grpc.ShardStub(self.channel)  # type: ignore[no-untyped-call]
        self.route_stat = route_stat  # Send Stat straight to a known primary.
        # Shards' primaries, at their advertised endpoints.
        self.peers = ShardPeers(tls=tls, auth=auth)
        self._routes: dict[str, str] = {}  # Shard ID → endpoint of its primary.

    async def close(self, grace: float | None = None) -> None:
        await self.peers.close()
        await super().close(grace)

    def _learn(self, shard: str, route: pb.Route) -> None:
        endpoint = _primary_endpoint(route)
        if endpoint:
            self._routes[shard] = endpoint
        else:
            self._routes.pop(shard, None)

    # RPCs.
    async def list_all(
        self, selector: str | pb.LabelSelector = "", *, within: float | None = None
    ) -> cpb.ListResponse:
        """The List response of shards matching `selector` (which may use label "id")."""
        request = cpb.ListRequest(selector=as_shard_selector(selector))
        resp: cpb.ListResponse = await self.stub.List(request, timeout=within)
        _check(validate_shard_list_response, resp, "List")
        raise_for_shard_status(resp, f"listing {format_selector(request.selector) or 'all shards'}")
        for shard in resp.shards:
            self._learn(shard.spec.id, shard.route)
        return resp

    async def list_shards(
        self, selector: str | pb.LabelSelector = "", *, within: float | None = None
    ) -> list[cpb.ListResponse.Shard]:
        """Every shard matching `selector`, with its revisions, route and statuses."""
        return list((await self.list_all(selector, within=within)).shards)

    async def stat(
        self,
        shard: str,
        read_through: Mapping[str, int] | None = None,
        *,
        within: float | None = None,
    ) -> cpb.StatResponse:
        """The shard's progress, once its primary has read through `read_through`."""
        request = cpb.StatRequest(shard=shard, read_through=dict(read_through or {}))
        resp: cpb.StatResponse | None = None
        endpoint = self._routes.get(shard, "") if self.route_stat else ""
        if endpoint:
            try:
                resp = await self.peers.stub(endpoint).Stat(request, timeout=within)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                resp = None  # The primary we knew is gone: ask the default address.
            except ValueError:
                resp = None  # An unusable advertised endpoint.
            if resp is not None and resp.status == cpb.NOT_SHARD_PRIMARY:
                resp = None
            if resp is None:
                self._routes.pop(shard, None)
        if resp is None:
            resp = await self.stub.Stat(request, timeout=within)
        assert resp is not None
        _check(validate_stat_response, resp, "Stat", f"shard {shard}")
        if resp.status == cpb.OK:
            self._learn(shard, resp.header.route)
        elif resp.status != cpb.SHARD_STOPPED:
            self._routes.pop(shard, None)
        raise_for_shard_status(resp, f"stat of shard {shard}")
        return resp

    async def apply(
        self,
        changes: Iterable[cpb.ApplyRequest.Change],
        *,
        within: float | None = None,
    ) -> cpb.ApplyResponse:
        """Apply the changes in one etcd transaction (ShardEtcdTransactionFailed if any
        expect_mod_revision no longer holds)."""
        request = cpb.ApplyRequest(changes=list(changes))
        resp: cpb.ApplyResponse = await self.stub.Apply(request, timeout=within)
        _check(validate_shard_apply_response, resp, "Apply")
        raise_for_shard_status(resp, f"applying {len(request.changes)} shard change(s)")
        return resp

    async def apply_in_batches(
        self,
        changes: Sequence[cpb.ApplyRequest.Change],
        size: int,
        *,
        within: float | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> cpb.ApplyResponse | None:
        """Apply the changes `size` at a time (each batch is its own transaction, so this
        may apply only some batches before failing); the last response (None if none).
        `progress`, given, is told (changes applied, all changes) after each batch."""
        if size <= 0:
            raise ValueError(f"batch size must be > 0 (got {size})")
        resp: cpb.ApplyResponse | None = None
        for i in range(0, len(changes), size):
            batch = changes[i : i + size]
            resp = await self.apply(batch, within=within)
            if progress is not None:
                progress(i + len(batch), len(changes))
        return resp

    async def get_hints(self, shard: str, *, within: float | None = None) -> cpb.GetHintsResponse:
        """The shard's stored primary hints and backup hints."""
        resp: cpb.GetHintsResponse = await self.stub.GetHints(
            cpb.GetHintsRequest(shard=shard), timeout=within
        )
        _check(validate_get_hints_response, resp, "GetHints", f"shard {shard}")
        raise_for_shard_status(resp, f"hints of shard {shard}")
        return resp

    async def unassign(
        self,
        shards: Iterable[str],
        *,
        only_failed: bool = False,
        dry_run: bool = False,
        within: float | None = None,
    ) -> list[str]:
        """Remove the shards' primary and failed assignments (only failed ones with
        `only_failed`); the shards that were (with `dry_run`: would be) unassigned."""
        request = cpb.UnassignRequest(shards=list(shards), only_failed=only_failed, dry_run=dry_run)
        resp: cpb.UnassignResponse = await self.stub.Unassign(request, timeout=within)
        _check(validate_unassign_response_status, resp, "Unassign")
        raise_for_shard_status(resp, "unassigning shards")
        return list(resp.shards)
