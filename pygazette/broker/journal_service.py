"""The `protocol.Journal` gRPC servicer: validates each request and dispatches it.

List, Apply and ListFragments are answered here; Read and Append are served by
`read_service` and `append_service`. Bad requests fail with INVALID_ARGUMENT and a message
naming the field; Gazette statuses travel in the response's `status`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from pygazette.broker.append_service import AppendAborted, AppendLimits, serve_append
from pygazette.broker.path_postfix import check_apply_request
from pygazette.broker.read_service import serve_read
from pygazette.broker.resolver import JOURNALS_PREFIX, Resolver, journal_key
from pygazette.broker.store_health_service import serve_fragment_store_health
from pygazette.keyspace.keyspace import Compare, Delete, Put
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import fragment_content_path
from pygazette.protocol.gazette_encoding import canonical_journal_spec
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.selector import journal_selected
from pygazette.protocol.validation import (
    validate_apply_request,
    validate_fragment_store_health_request,
    validate_fragments_request,
    validate_list_request,
    validate_read_request,
)
from pygazette.stores.store import StoreError, StoreRegistry

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

DEFAULT_FRAGMENTS_PAGE_LIMIT = 1000
LIST_CHUNK = 1000  # Journals per List response, as Gazette chunks them.


class JournalService(pb_grpc.JournalServicer):
    def __init__(self, resolver: Resolver, stores: StoreRegistry, limits: AppendLimits) -> None:
        self.resolver = resolver
        self.stores = stores
        self.limits = limits

    async def List(
        self, request: pb.ListRequest, context: Context
    ) -> AsyncIterator[pb.ListResponse]:  # type: ignore[override]
        """Snapshots of matching journals: one, or with `watch` a new one per change.

        A snapshot is one or more responses (the first carries the header) of at most
        LIST_CHUNK journals; under `watch`, an empty response marks each snapshot's end.
        """
        await _validate(validate_list_request, request, context)
        ks = self.resolver.keyspace
        min_revision = 0
        if request.HasField("watch_resume"):
            min_revision = request.watch_resume.etcd.revision + 1
        last: tuple[int, int] = (-1, -1)
        while True:
            if min_revision > ks.revision:
                await ks.wait_for_revision(min_revision)
            min_revision = ks.revision + 1
            header = self.resolver.header(routed=False)
            matched: list[tuple[pb.JournalSpec, int, int]] = []
            for kv in ks.range(JOURNALS_PREFIX):
                spec = pb.JournalSpec()
                spec.ParseFromString(kv.value)
                if journal_selected(request.selector, spec):
                    matched.append((spec, kv.mod_revision, kv.create_revision))
            # Unchanged count and max mod revision mean an unchanged snapshot.
            current = (len(matched), max((rev for _, rev, _ in matched), default=-1))
            if current == last:
                continue
            last = current
            resp = pb.ListResponse(status=pb.OK, header=header)
            route = self.resolver.route()
            for spec, rev, created in matched:
                if len(resp.journals) == LIST_CHUNK:
                    yield resp
                    resp = _list_chunk()
                resp.journals.add(spec=spec, mod_revision=rev, create_revision=created, route=route)
            yield resp
            if not request.watch:
                return
            yield _list_chunk()

    async def Apply(self, request: pb.ApplyRequest, context: Context) -> pb.ApplyResponse:  # type: ignore[override]
        await _validate(validate_apply_request, request, context)
        await _validate(check_apply_request, request, context)  # Templates we can render.
        compares: list[Compare] = []
        ops: list[Put | Delete] = []
        for change in request.changes:
            if change.HasField("upsert"):
                key = journal_key(change.upsert.name)
                spec = canonical_journal_spec(change.upsert)
                ops.append(Put(key, spec.SerializeToString(deterministic=True)))
            else:
                key = journal_key(change.delete)
                ops.append(Delete(key))
            if change.expect_mod_revision != -1:  # -1 skips the revision check.
                compares.append(Compare(key, change.expect_mod_revision))
        result = await self.resolver.keyspace.txn(compares, ops)
        if not result.succeeded:
            return pb.ApplyResponse(
                status=pb.ETCD_TRANSACTION_FAILED, header=self.resolver.header(routed=False)
            )
        await self.resolver.keyspace.wait_for_revision(result.revision)
        return pb.ApplyResponse(status=pb.OK, header=self.resolver.header(routed=False))

    async def Read(
        self, request: pb.ReadRequest, context: Context
    ) -> AsyncIterator[pb.ReadResponse]:  # type: ignore[override]
        await _validate(validate_read_request, request, context)
        try:
            async for resp in serve_read(request, self.resolver, self.stores):
                yield resp
        except StoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"reading fragment: {exc}")

    async def Append(
        self, request_iterator: AsyncIterator[pb.AppendRequest], context: Context
    ) -> pb.AppendResponse:  # type: ignore[override]
        try:
            return await serve_append(request_iterator, self.resolver, self.limits)
        except AppendAborted as exc:
            await context.abort(exc.code, str(exc))
            raise  # Not reached: abort raises.

    async def Replicate(
        self, request_iterator: AsyncIterator[pb.ReplicateRequest], context: Context
    ) -> AsyncIterator[pb.ReplicateResponse]:  # type: ignore[override]
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "replication needs cluster mode; this broker runs single-node",
        )
        yield pb.ReplicateResponse()  # Not reached: makes this an async generator.

    async def ListFragments(
        self, request: pb.FragmentsRequest, context: Context
    ) -> pb.FragmentsResponse:  # type: ignore[override]
        await _validate(validate_fragments_request, request, context)
        replica = self.resolver.resolve(request.journal)
        if replica is None:
            return pb.FragmentsResponse(
                status=pb.JOURNAL_NOT_FOUND, header=self.resolver.header(routed=False)
            )
        if failure := await replica.await_first_listing():
            await context.abort(grpc.StatusCode.UNAVAILABLE, failure)
        frags = replica.index.persisted() + [
            s.fragment() for s in replica.index.local_spools() if s.end > s.begin
        ]
        frags.sort(key=lambda f: (f.begin, f.end))
        limit = request.page_limit or DEFAULT_FRAGMENTS_PAGE_LIMIT
        ttl = None
        if request.HasField("signatureTTL"):
            ttl = request.signatureTTL.seconds + request.signatureTTL.nanos / 1e9
        resp = pb.FragmentsResponse(status=pb.OK, header=self.resolver.header())
        for frag in frags:
            if frag.begin < request.next_page_token:
                continue
            if len(resp.fragments) == limit:
                # As Gazette: the next page starts at the next fragment, in range or not.
                resp.next_page_token = frag.begin
                break
            # Gazette's time range is inclusive, and a fragment not yet persisted (mod_time
            # 0) passes its lower bound and fails its upper one.
            if (frag.mod_time and frag.mod_time < request.begin_mod_time) or (
                request.end_mod_time
                and (not frag.mod_time or frag.mod_time > request.end_mod_time)
            ):
                continue
            entry = resp.fragments.add(spec=frag)
            if ttl is not None and frag.backing_store:
                try:
                    store = self.stores.get(frag.backing_store)
                    entry.signed_url = await store.signed_url(fragment_content_path(frag), ttl)
                except StoreError as exc:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"signing URL: {exc}")
        return resp

    async def FragmentStoreHealth(
        self, request: pb.FragmentStoreHealthRequest, context: Context
    ) -> pb.FragmentStoreHealthResponse:  # type: ignore[override]
        await _validate(validate_fragment_store_health_request, request, context)
        monitor = self.resolver.persister.health
        return await serve_fragment_store_health(request, self.resolver, monitor)


def _list_chunk() -> pb.ListResponse:
    """A continuation (or end-of-snapshot) ListResponse, encoded as Gazette encodes it: its
    header is zero-valued, but present down to its own non-nullable parts."""
    resp = pb.ListResponse()
    resp.header.process_id.SetInParent()
    resp.header.route.SetInParent()
    resp.header.etcd.SetInParent()
    return resp


async def _validate(validator: object, request: object, context: Context) -> None:
    try:
        validator(request)  # type: ignore[operator]
    except ValidationError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
