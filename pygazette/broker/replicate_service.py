"""The Replicate RPC, replica side: apply a primary's stream of content and proposals.

The first request must carry the primary's Header and a proposal. The replica resolves the
journal at (at least) the header's revision and accepts the stream only if it is a member
of an equivalent route (else WRONG_ROUTE, with its own header, so the primary can tell
whether it is behind). It then owns the journal's spool for the life of the stream,
applying each request (`replicated_spool`) and answering those that ask for it.

A later proposal that carries a Header again is the primary's *confirmation* (`pipeline`):
every peer holds the journal up to the proposal's end, so it moves the confirmed frontier
(`replicated_spool`) there and changes nothing else; content streamed for the next append
stays pending. On a route of two, a proposal with a Header that commits the content streamed
since the last commit is a commit that confirms itself: the primary committed it first, so
once it is committed here too the frontier moves to its end.

Unlike Gazette's replicas, it drops the stream as soon as its keyspace shows the journal with
another primary (or without this broker): a primary that was cut off (frozen, partitioned)
and has since been replaced can't commit anything through it. Members joining or leaving
under the same primary don't end it (`_primary_continues`): the appends in flight complete,
as with Gazette, and the primary's next append opens a pipeline on the new route. A replica
dropped from the route meanwhile serves the stream until the primary closes it, or its stop
cuts it off (`_left_under_primary`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import grpc

from pygazette.allocator.request_fence import ResolveError
from pygazette.broker.cluster_resolver import ClusterResolver
from pygazette.broker.invalidation import acquire_or_invalidated
from pygazette.broker.journal_runtime import JournalRuntime
from pygazette.broker.pipeline import REPLICA_STOPPING, STALE_STREAM
from pygazette.broker.replicated_spool import (
    ReplicationProtocolError,
    SpoolFinished,
    fragments_equal,
)
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
    taken = await _take_replica(first, resolver)
    if isinstance(taken, pb.ReplicateResponse):
        yield taken
        return
    replica = taken
    rs = replica.rspool
    assert rs is not None
    stream_route = first.header.route
    watch = _RouteWatch(replica, resolver, first.proposal.journal, stream_route, first.header)
    pair = len(stream_route.members) == 2  # Commits may confirm themselves (`_apply`).
    try:
        req: pb.ReplicateRequest | None = first
        is_first = True
        while req is not None:
            resp = await _answer(replica, req, is_first, pair)
            is_first = False
            if resp is not None:
                yield resp
            req = await watch.next(it)
    finally:
        watch.close()
        rs.rollback()
        replica.spool_lock.release()


async def serve_replicate_whole(
    requests: Sequence[pb.ReplicateRequest], resolver: ClusterResolver
) -> list[pb.ReplicateResponse]:
    """A Replicate stream's requests, whole (`PeerJournal.ReplicateWhole`): applied as the
    stream would apply them, under the journal's spool lock throughout; the answers to
    those asking for one, up to the first that is not OK (nothing after it is applied).
    Content left uncommitted at the end is rolled back, as at the end of a stream."""
    if not requests:
        raise ReplicateAborted(grpc.StatusCode.INVALID_ARGUMENT, "expected ReplicateRequests")
    first = requests[0]
    taken = await _take_replica(first, resolver)
    if isinstance(taken, pb.ReplicateResponse):
        return [taken]
    replica = taken
    rs = replica.rspool
    assert rs is not None
    stream_route = first.header.route
    watch = _RouteWatch(
        replica, resolver, first.proposal.journal, stream_route, first.header, watching=False
    )
    pair = len(stream_route.members) == 2
    out: list[pb.ReplicateResponse] = []
    try:
        for i, req in enumerate(requests):
            if i:
                watch.check(req)
            resp = await _answer(replica, req, i == 0, pair)
            if resp is not None:
                out.append(resp)
                if resp.status != pb.OK:
                    break
    finally:
        rs.rollback()
        replica.spool_lock.release()
    return out


async def _take_replica(
    first: pb.ReplicateRequest, resolver: ClusterResolver
) -> JournalRuntime | pb.ReplicateResponse:
    """The replica a stream's first request is for, its spool lock taken; or the answer
    refusing the stream (this broker is not a member of an equivalent route)."""
    _validate(first)
    if not first.HasField("header") or not first.HasField("proposal"):
        raise ReplicateAborted(
            grpc.StatusCode.INVALID_ARGUMENT,
            "expected the first ReplicateRequest to have a Header and a Proposal",
        )
    journal = first.proposal.journal
    while True:
        try:
            res = await resolver.resolve_journal(
                journal, require_primary=False, may_proxy=False, proxy_header=first.header
            )
        except ResolveError as exc:
            raise ReplicateAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        if res.status != pb.OK:
            # As Gazette's replica answers, but without its Header: a ReplicateResponse
            # carries one only with WRONG_ROUTE (Gazette's Validate refuses any other).
            return pb.ReplicateResponse(status=res.status)
        if not routes_equivalent(res.route, first.header.route):
            return pb.ReplicateResponse(status=pb.WRONG_ROUTE, header=res.header)
        replica = res.replica
        assert replica is not None
        if await acquire_or_invalidated(replica.spool_lock, res.invalidated):
            return replica


async def _answer(
    replica: JournalRuntime, req: pb.ReplicateRequest, is_first: bool, pair: bool
) -> pb.ReplicateResponse | None:
    """Apply `req`: its answer if it asks for one (no Header: Gazette's ReplicateResponse
    carries one only with WRONG_ROUTE, its Validate refuses any other), else None; a
    proposal failing without asking for an answer ends the stream."""
    resp = await _apply(replica, req, is_first, pair=pair)
    if req.acknowledge:
        assert resp is not None
        return resp
    if resp is not None and resp.status != pb.OK:
        raise ReplicateAborted(
            grpc.StatusCode.FAILED_PRECONDITION,
            "no acknowledgement requested, but the proposal failed: "
            f"{pb.Status.Name(resp.status)}",
        )
    return None


async def _apply(
    replica: JournalRuntime, req: pb.ReplicateRequest, is_first: bool, pair: bool = False
) -> pb.ReplicateResponse | None:
    try:
        return await _apply_request(replica, req, is_first, pair)
    except SpoolFinished as exc:
        # The replica stopped under a request it didn't wait for (`Replica.stop`).
        raise ReplicateAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc


async def _apply_request(
    replica: JournalRuntime, req: pb.ReplicateRequest, is_first: bool, pair: bool
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
        # exactly our fragment, or if it is in doubt (we were its primary, and sent a
        # confirmation of it that some peer may have taken): then a shorter proposal gets
        # PROPOSAL_MISMATCH with our fragment, and the new primary rolls forward past it.
        if rs.unconfirmed and not (
            fragments_equal(rs.fragment(), req.proposal) and req.registers == rs.registers
        ):
            rs.cut_unconfirmed(keep_in_doubt=True)
    elif req.HasField("header"):
        if pair and rs.delta and req.proposal.end == rs.end + rs.delta:
            # A commit that confirms itself, on a route of two (`pipeline`): the primary
            # committed it first, so once it is committed here every member holds it.
            resp = await rs.apply_proposal(req.proposal, req.registers, primary=False)
            if resp.status == pb.OK:
                replica.confirm_through(req.proposal.end)
            return resp
        # A confirmation: every peer holds the journal up to the proposal's end.
        if req.proposal.end > rs.end:
            return pb.ReplicateResponse(
                status=pb.PROPOSAL_MISMATCH, fragment=rs.fragment(), registers=rs.registers
            )
        replica.confirm_through(req.proposal.end)
        return pb.ReplicateResponse(status=pb.OK)
    return await rs.apply_proposal(req.proposal, req.registers, primary=False)


class _RouteWatch:
    """Ends a Replicate stream once the journal's route here has another primary, or leaves
    this broker out (`_primary_continues`), or the replica stops: at once while the stream
    waits for its next request, else before it reads another. One watcher task per stream,
    woken only when the journal's assignments change, rather than a wait on them beside
    every request."""

    def __init__(
        self,
        replica: JournalRuntime,
        resolver: ClusterResolver,
        journal: str,
        stream_route: pb.Route,
        header: pb.Header,
        *,
        watching: bool = True,
    ) -> None:
        """With `watching` False, no watcher task: the caller `check`s before each request."""
        self.replica = replica
        self.resolver = resolver
        self.journal = journal
        self.stream_route = stream_route
        self.header = header  # The stream's first Header (validated).
        self.stale: ReplicateAborted | None = None
        # The keyspace state the route was last checked at, and whether it matched: a new
        # state comes with every keyspace change, so the route is looked up only then.
        self._state: object = None
        self._route_matches = False
        self._left = False  # This broker left the route, whose primary is the stream's.
        self._receiving = False
        self._task = asyncio.current_task()
        self._watcher = (
            asyncio.create_task(self._watch(), name=f"replicate-watch:{journal}")
            if watching
            else None
        )

    def _check(self) -> ReplicateAborted | None:
        state = self.resolver.observed.current
        if state is not self._state:
            route = self.resolver.journal_route(state, self.journal)
            self._route_matches = _primary_continues(route, self.stream_route, self.header)
            self._left = _left_under_primary(route, self.stream_route, self.header)
            self._state = state
        if self.replica.stopping and not (self._left and self.resolver.serving):
            return ReplicateAborted(grpc.StatusCode.UNAVAILABLE, REPLICA_STOPPING)
        if self._left:
            # Dropped from the route under the same primary (a replica the journal no longer
            # wants): the stream goes on until the primary, told of the route, closes it (or
            # the replica's stop cuts it off, STOP_WAIT_SECONDS), as Gazette's replicas serve
            # a stream to its end. Its commits are then confirmed, and persisted from here.
            return None
        if not self._route_matches or self.replica.primary:
            return ReplicateAborted(grpc.StatusCode.ABORTED, STALE_STREAM)
        return None

    async def _watch(self) -> None:
        while True:
            invalidated = self.replica.invalidated
            self.stale = self._check()
            if self.stale is not None:
                if self._receiving and self._task is not None:
                    self._task.cancel()
                return
            await invalidated.wait()

    async def next(self, it: AsyncIterator[pb.ReplicateRequest]) -> pb.ReplicateRequest | None:
        """The next request (None at the end of the stream), unless the stream is stale."""
        stale = self.stale or self._check()
        if stale is not None:
            raise stale
        self._receiving = True
        try:
            req = await anext(it)
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            task = self._task
            if self.stale is not None and task is not None and task.uncancel() == 0:
                raise self.stale from None
            raise
        finally:
            self._receiving = False
        _validate(req, self.header)
        return req

    def check(self, req: pb.ReplicateRequest) -> None:
        """Before applying `req`, a later request of a whole stream: raise if the stream is
        stale, or `req` is invalid."""
        stale = self._check()
        if stale is not None:
            raise stale
        _validate(req, self.header)

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()


def _primary_continues(route: pb.Route, stream_route: pb.Route, header: pb.Header) -> bool:
    """Whether a stream opened on `stream_route` may go on now that the journal's route is
    `route`: its primary is the stream's, and this broker (the stream's `header.process_id`)
    is still a member. Members joining or leaving (a broker drained, replication changed)
    don't end the streams of the members that stay: the appends in flight on them complete
    (as Gazette's do), and the primary's next append replaces its pipeline. A new primary
    does: a primary cut off (frozen, partitioned) and since replaced commits nothing here."""
    if routes_equivalent(route, stream_route):
        return True
    return _same_primary(route, stream_route) and _is_member(route, header.process_id)


def _left_under_primary(route: pb.Route, stream_route: pb.Route, header: pb.Header) -> bool:
    """Whether this broker (`header.process_id`) has left the journal's `route`, whose primary
    is still the stream's."""
    return _same_primary(route, stream_route) and not _is_member(route, header.process_id)


def _same_primary(route: pb.Route, stream_route: pb.Route) -> bool:
    """Whether both routes have a primary, and it is the same broker."""
    if not 0 <= route.primary < len(route.members):
        return False
    if not 0 <= stream_route.primary < len(stream_route.members):
        return False
    new, old = route.members[route.primary], stream_route.members[stream_route.primary]
    return (new.zone, new.suffix) == (old.zone, old.suffix)


def _is_member(route: pb.Route, broker: pb.ProcessSpec.ID) -> bool:
    return any(m.zone == broker.zone and m.suffix == broker.suffix for m in route.members)


def _validate(req: pb.ReplicateRequest, known: pb.Header | None = None) -> None:
    """Validate `req`; a Header equal to `known` (validated already) is not validated again
    (a confirmation repeats the stream's first Header, with its route and endpoints)."""
    try:
        if (
            known is not None
            and req.HasField("proposal")
            and req.HasField("header")
            and req.header == known
        ):
            if not req.acknowledge:
                raise ValidationError("expected Acknowledge with Header")
            rest = pb.ReplicateRequest()
            rest.CopyFrom(req)
            rest.ClearField("header")
            validate_replicate_request(rest)
        else:
            validate_replicate_request(req)
    except ValidationError as exc:
        raise ReplicateAborted(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
