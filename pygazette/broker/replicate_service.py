"""The Replicate RPC, replica side: apply a primary's stream of content and proposals.

The first request must carry the primary's Header and a proposal. The replica resolves the
journal at (at least) the header's revision and accepts the stream only if it is a member
of an equivalent route (else WRONG_ROUTE, with its own header, so the primary can tell
whether it is behind). It then owns the journal's spool for the life of the stream,
applying each request (`replicated_spool`) and answering those that ask for it.

Unlike Gazette's replicas, it drops the stream as soon as its keyspace shows a route the
stream no longer matches: a primary that was cut off (frozen, partitioned) and has since
been replaced can't commit anything through it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from pygazette.allocator.request_fence import ResolveError
from pygazette.broker.append_fsm import acquire_or_invalidated
from pygazette.broker.cluster_resolver import ClusterResolver
from pygazette.broker.replica import Replica
from pygazette.broker.replicated_spool import ReplicationProtocolError, fragments_equal
from pygazette.keyspace.layout import routes_equivalent
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_replicate_request

log = logging.getLogger(__name__)


class ReplicateAborted(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


async def serve_replicate(
    requests: AsyncIterator[pb.ReplicateRequest], resolver: ClusterResolver
) -> AsyncIterator[pb.ReplicateResponse]:
    it = aiter(requests)
    try:
        first = await anext(it)
    except StopAsyncIteration:
        return
    _validate(first)
    if not first.HasField("header") or not first.HasField("proposal"):
        raise ReplicateAborted(
            grpc.StatusCode.INVALID_ARGUMENT,
            "expected the first ReplicateRequest to have a Header and a Proposal",
        )
    journal = first.proposal.journal
    stream_route = first.header.route

    while True:
        try:
            res = await resolver.resolve_journal(
                journal, require_primary=False, may_proxy=False, proxy_header=first.header
            )
        except ResolveError as exc:
            raise ReplicateAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        if res.status != pb.OK:
            yield pb.ReplicateResponse(status=res.status, header=res.header)
            return
        if not routes_equivalent(res.route, stream_route):
            yield pb.ReplicateResponse(status=pb.WRONG_ROUTE, header=res.header)
            return
        replica = res.replica
        assert replica is not None
        if await acquire_or_invalidated(replica.spool_lock, res.invalidated):
            break

    rs = replica.rspool
    assert rs is not None
    try:
        header: pb.Header | None = res.header
        req: pb.ReplicateRequest | None = first
        is_first = True
        while req is not None:
            resp = await _apply(replica, req, is_first)
            is_first = False
            if req.acknowledge:
                assert resp is not None
                if header is not None:
                    resp.header.CopyFrom(header)
                    header = None
                yield resp
            elif resp is not None and resp.status != pb.OK:
                raise ReplicateAborted(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"no acknowledgement requested, but the proposal failed: "
                    f"{pb.Status.Name(resp.status)}",
                )
            req = await _next(it, replica, resolver, journal, stream_route)
    finally:
        rs.rollback()
        replica.spool_lock.release()


async def _apply(
    replica: Replica, req: pb.ReplicateRequest, is_first: bool
) -> pb.ReplicateResponse | None:
    rs = replica.rspool
    assert rs is not None
    if not req.HasField("proposal"):
        try:
            await rs.apply_content(req.content, req.content_delta)
        except ReplicationProtocolError as exc:
            raise ReplicateAborted(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        return None
    if req.proposal.journal != replica.name:
        raise ReplicateAborted(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"proposal of journal {req.proposal.journal} on a stream of {replica.name}",
        )
    if is_first:
        # A new pipeline. Content we hold beyond our confirmed frontier may be what an
        # earlier primary never got acknowledged: keep it only if the new primary proposes
        # exactly our fragment.
        if rs.unconfirmed and not (
            fragments_equal(rs.fragment(), req.proposal) and req.registers == rs.registers
        ):
            rs.cut_unconfirmed()
    else:
        # The primary sends a proposal only after every peer acknowledged the last round.
        rs.set_confirmed(rs.end)
        replica.set_readable(rs.end)
    return await rs.apply_proposal(req.proposal, req.registers, primary=False)


async def _next(
    it: AsyncIterator[pb.ReplicateRequest],
    replica: Replica,
    resolver: ClusterResolver,
    journal: str,
    stream_route: pb.Route,
) -> pb.ReplicateRequest | None:
    """The next request, unless the stream's route stops being this journal's route."""
    receive = asyncio.ensure_future(anext(it))
    try:
        while True:
            invalidated = replica.invalidated
            if replica.stopping:
                raise ReplicateAborted(grpc.StatusCode.UNAVAILABLE, "replica is stopping")
            route = resolver.journal_route(resolver.observed.current, journal)
            if not routes_equivalent(route, stream_route) or replica.primary:
                raise ReplicateAborted(
                    grpc.StatusCode.ABORTED, "the journal's route changed; stream is stale"
                )
            wait = asyncio.ensure_future(invalidated.wait())
            try:
                await asyncio.wait([receive, wait], return_when=asyncio.FIRST_COMPLETED)
            finally:
                wait.cancel()
            if receive.done():
                try:
                    req = receive.result()
                except StopAsyncIteration:
                    return None
                _validate(req)
                return req
    finally:
        if not receive.done():
            receive.cancel()
        receive.add_done_callback(_retrieve)


def _retrieve(f: asyncio.Future[pb.ReplicateRequest]) -> None:
    """Take a finished read's outcome, so an unread error isn't reported as lost."""
    if not f.cancelled():
        f.exception()


def _validate(req: pb.ReplicateRequest) -> None:
    try:
        validate_replicate_request(req)
    except ValidationError as exc:
        raise ReplicateAborted(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
