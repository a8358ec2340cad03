"""The `pygazette.Retention` gRPC service: prune a journal's expired fragments on demand.

`pygazette journals prune` calls it once per selected journal. The broker lists every store
of the journal afresh, plans with `retention.plan_retention` and removes (or, with
`dry_run`, only reports) the expired fragments.
"""

from __future__ import annotations

from typing import Any

import grpc

from pygazette.broker.fragment.retention import prune_journal
from pygazette.broker.resolver import Resolver
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import retention_pb2 as rpb
from pygazette.protocol.pb import retention_pb2_grpc as rpb_grpc
from pygazette.protocol.validation import validate_journal_name
from pygazette.stores.store import StoreError, StoreRegistry

Context = grpc.aio.ServicerContext[Any, Any]


class RetentionService(rpb_grpc.RetentionServicer):
    def __init__(self, resolver: Resolver, stores: StoreRegistry) -> None:
        self.resolver = resolver
        self.stores = stores

    async def Prune(self, request: rpb.PruneRequest, context: Context) -> rpb.PruneResponse:  # type: ignore[override]
        try:
            validate_journal_name(request.journal, allow_meta=False)
        except ValidationError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Journal: {exc}")
        replica = self.resolver.resolve(request.journal)
        if replica is None:
            return rpb.PruneResponse(
                status=pb.JOURNAL_NOT_FOUND, header=self.resolver.header(routed=False)
            )
        try:
            result = await prune_journal(replica, self.stores, dry_run=request.dry_run)
        except StoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"listing fragments: {exc}")
            raise  # Not reached: abort raises.
        resp = rpb.PruneResponse(status=pb.OK, header=self.resolver.header())
        resp.removed.extend(result.removed)
        for frag, reason in result.kept:
            resp.kept.add(fragment=frag, reason=reason)
        resp.errors.extend(result.errors)
        return resp
