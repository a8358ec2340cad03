"""The `pygazette.Retention` gRPC service: prune a journal's expired fragments on demand.

`pygazette journals prune` calls it once per selected journal, on any broker. The broker
that serves the journal (its primary, else another of its brokers) lists every store of the
journal afresh, plans with `retention.plan_retention` and removes (or, with `dry_run`, only
reports) the expired fragments. In a cluster, a broker without a replica of the journal
proxies the request there, its header naming that broker, as journal RPCs are proxied.
"""

from __future__ import annotations

from typing import Any

import grpc

from pygazette.allocator.request_fence import ResolveError, same_process
from pygazette.broker.cluster_resolver import ClusterResolver
from pygazette.broker.fragment.retention import prune_journal
from pygazette.broker.peers import Peers, PeerUnavailable
from pygazette.broker.replica import Replica
from pygazette.broker.resolver import Resolver
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import retention_pb2 as rpb
from pygazette.protocol.pb import retention_pb2_grpc as rpb_grpc
from pygazette.protocol.validation import validate_journal_name
from pygazette.stores.store import StoreError, StoreRegistry

Context = grpc.aio.ServicerContext[Any, Any]


class RetentionService(rpb_grpc.RetentionServicer):
    def __init__(
        self, resolver: Resolver, stores: StoreRegistry, peers: Peers | None = None
    ) -> None:
        self.resolver = resolver
        self.stores = stores
        self.peers = peers  # In a cluster: to proxy to the broker serving the journal.

    async def Prune(self, request: rpb.PruneRequest, context: Context) -> rpb.PruneResponse:  # type: ignore[override]
        try:
            validate_journal_name(request.journal, allow_meta=False)
        except ValidationError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Journal: {exc}")
        if isinstance(self.resolver, ClusterResolver) and self.peers is not None:
            replica, header, proxied = await self._resolve(request, context, self.resolver)
            if proxied is not None:
                return proxied
        else:
            replica, header = self.resolver.resolve(request.journal), self.resolver.header()
        if replica is None:
            return rpb.PruneResponse(
                status=pb.JOURNAL_NOT_FOUND, header=self.resolver.header(routed=False)
            )
        try:
            result = await prune_journal(replica, self.stores, dry_run=request.dry_run)
        except StoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"listing fragments: {exc}")
            raise  # Not reached: abort raises.
        resp = rpb.PruneResponse(status=pb.OK, header=header)
        resp.removed.extend(result.removed)
        for frag, reason in result.kept:
            resp.kept.add(fragment=frag, reason=reason)
        resp.errors.extend(result.errors)
        return resp

    async def _resolve(
        self, request: rpb.PruneRequest, context: Context, resolver: ClusterResolver
    ) -> tuple[Replica | None, pb.Header, rpb.PruneResponse | None]:
        """The local replica to prune and the response's header; or, for a journal another
        broker serves (its primary preferred), that broker's response to the request proxied
        there; or the journal's status (JOURNAL_NOT_FOUND, SUSPENDED, ...) as the response."""
        assert self.peers is not None
        try:
            res = await resolver.resolve_journal(
                request.journal,
                require_primary=False,
                may_proxy=True,
                prefer_primary=True,
                proxy_header=request.header if request.HasField("header") else None,
            )
        except ResolveError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise  # Not reached: abort raises.
        if res.status != pb.OK:
            return None, res.header, rpb.PruneResponse(status=res.status, header=res.header)
        if res.local:
            return res.replica, res.header, None
        forwarded = rpb.PruneRequest()
        forwarded.CopyFrom(request)
        forwarded.header.CopyFrom(res.header)
        target = res.header.process_id
        route = res.route
        endpoint = next(
            (
                route.endpoints[i]
                for i, m in enumerate(route.members)
                if same_process(m, target) and i < len(route.endpoints)
            ),
            "",
        )
        try:
            if not endpoint:
                raise PeerUnavailable(f"no endpoint for {target.zone}#{target.suffix}")
            resp: rpb.PruneResponse = await self.peers.retention_stub(endpoint).Prune(forwarded)
        except PeerUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise  # Not reached: abort raises.
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "proxied request failed")
            raise  # Not reached: abort raises.
        return None, res.header, resp
