"""Appends in cluster mode: Gazette's append state machine over a replication pipeline.

An Append (or a pulse: an empty append the primary runs on its own) goes through:

1. resolve — the journal's primary, after any revision the request requires;
2. proxy — a non-primary forwards the whole stream to the primary (once the route has the
   journal's replication: more members means the allocator is about to drop one, so wait);
3. pipeline — as primary, hold the journal's append lock; if there is no pipeline for the
   current route, own the spool, open Replicate streams to every peer and synchronise them:
   propose our fragment (rolled to a new one on a route change), and roll forward to any
   peer's larger offset (taking its registers) until every peer agrees; then confirm that
   agreement everywhere, so that no member (whichever remain after the next route change)
   cuts back below it;
4. advertise — if the assignments don't all advertise this route yet, write it into them
   (one transaction, shared with other journals' writes: `advertiser`) and resolve again:
   the allocator only drops replicas of consistent journals (a pulse doesn't wait for the
   write: it changes the assignments, which pulses the journal again);
5. preconditions — registers (`check_registers`), offsets (`offset`, or a greater offset
   in the fragment index, which means consistency was lost), suspension;
6. stream — roll the fragment first if due (length, flush interval, codec; everything
   before is confirmed first), then send each content chunk to every peer and to the local
   spool; on commit, propose the extended fragment, with the new registers, to every peer
   and commit it locally (on a route of two: commit it locally, then send a commit that
   confirms itself, `Pipeline.propose_confirmed_commit`); release the append lock;
7. acknowledge — wait for every peer to acknowledge the commit, then for a confirmation
   covering it (on a route of two, the commit's own acknowledgement), then for the append
   before it to be answered; answer.

Appends pipeline as Gazette's do: an append holds the journal's append lock only while it
streams its content and sends its commit (to every peer, then to the local spool); the next
append streams behind it while the commit's acknowledgements are on their way, and each
append then waits for its own round (`pipeline`), so acknowledgements come in order.

Departures from Gazette, all for safety under failures:

- An append is acknowledged only once its commit is *confirmed* on every replica: after
  every peer acknowledged the commit, the primary sends a confirmation (one covers every
  commit below it) and waits until every peer acknowledged that too; only then may readers
  see it. (With one peer, the primary commits first and its commit carries the
  confirmation: the peer that commits it confirms it, and its one acknowledgement covers
  both.) A confirmation goes out only while the primary's etcd lease is surely alive (a
  frozen or partitioned primary that comes back can't make an append durable). So an
  acknowledged append is confirmed on every replica, and content that isn't confirmed was
  never acknowledged: a new pipeline cuts it from every replica, primary included, and an
  append that failed never surfaces later. A spool that completes (rolls, or leaves this
  broker) is cut the same way first, so a roll waits until everything before it is
  confirmed. A failed round breaks the pipeline: every append in flight behind it fails
  with it (UNAVAILABLE: it was confirmed nowhere, and never surfaces), and the next append
  builds a new pipeline. A client that goes away breaks nothing, as with Gazette: mid-stream
  its content is rolled back on every peer, and once its commit went out the commit goes on
  (its client may not learn of it); the appends in flight around it are answered. The
  one exception: an append whose confirmation went out but was not acknowledged by every
  peer before the failure is in doubt (a peer that took the confirmation keeps it, and the
  journal may continue from that peer); it fails with UNKNOWN, as an append whose
  acknowledgement was lost on its way to the client. And so a new pipeline never cuts below
  a confirmation this broker sent: the primary notes the greatest such offset when its
  pipeline closes (`ReplicatedSpool.in_doubt`), keeps its content when the next pipeline
  starts (still hidden from readers), and that pipeline's synchronisation confirms it
  everywhere (as a replica, it answers a shorter proposal with its fragment, and the new
  primary rolls forward past it). Otherwise the journal would go on from the lower offset
  with other bytes while the peer that took the confirmation (e.g. killed before its
  acknowledgement reached us) holds the old ones as confirmed, and serves them when it is
  assigned the journal again. This is kept in memory: a primary that crashes too (a double
  failure) cuts to its confirmed frontier after its restart.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import grpc
import grpc.aio

from pygazette.allocator.request_fence import ResolveError
from pygazette.allocator.session import MemberSession
from pygazette.auth.capability import Capability
from pygazette.auth.client_interceptor import journal_claims_scope
from pygazette.broker.advertiser import RouteAdvertiser
from pygazette.broker.allocation import assignments_advertise, route_value
from pygazette.broker.append_service import (
    SUSPENDING,
    AppendAborted,
    AppendLimits,
    chunk_error,
)
from pygazette.broker.cluster_resolver import ClusterResolver, Resolution
from pygazette.broker.flow_control import (
    FlowControlUnderflow,
    MinRatePolicer,
    next_policed,
    throttle,
)
from pygazette.broker.invalidation import acquire_or_invalidated, first_listing_or_invalidated
from pygazette.broker.journal_runtime import JournalRuntime
from pygazette.broker.metrics import record_append
from pygazette.broker.peers import Peers, PeerUnavailable
from pygazette.broker.pipeline import Pipeline, PipelineBroken, Round
from pygazette.broker.pulser import Pulsed
from pygazette.broker.replicated_spool import SpoolFinished, fragments_equal, roll_proposal
from pygazette.broker.whole_replication import (
    WholeInDoubt,
    WholeRefused,
    WholeUnserved,
    replicate_whole,
)
from pygazette.keyspace.keyspace import Compare, KeyspaceUnavailable, Put, TxnResult
from pygazette.keyspace.layout import decode_route, desired_replication, routes_equivalent
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import sha1sum_from_digest
from pygazette.protocol.labels import update_registers
from pygazette.protocol.pb import peer_pb2 as ppb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import selector_matches
from pygazette.protocol.stream_write import send_all
from pygazette.protocol.validation import journal_spec_flags_allow_write, validate_append_request

log = logging.getLogger(__name__)

# A pulse (see `pulser`) that hasn't finished in this long has failed.
PULSE_TIMEOUT_SECONDS = 60.0
# Rounds of roll-forward synchronisation before giving up on a pipeline.
MAX_SYNC_ROUNDS = 8
# A broker reads this much of a client's append before it dials the primary (proxying) or
# takes the journal (as primary): `ClusterAppends._read_ahead`. The rest streams through.
PROXY_READ_AHEAD = 256 << 10
# While it reads ahead nothing is held, so the client may fall this far behind the minimum
# rate (the policing that protects a held journal allows 1 s).
READ_AHEAD_SLACK_SECONDS = 10.0
# How long appends to a peer that does not serve `PeerJournal.AppendWhole` are streamed before
# it is asked again (and replicated through pipelines, for `ReplicateWhole`).
STREAMING_ONLY_SECONDS = 600.0
# A journal appended to whole (`_append_whole`) this recently opens a pipeline for its next
# append instead: it has traffic, and a pipeline's appends cost a message, not a call, and
# overlap rather than wait for one another.
WHOLE_QUIET_SECONDS = 1.0
# Why an append stream is refused when it ends without its commit (an empty chunk).
_NO_COMMIT = "append stream ended without its final empty chunk; nothing was appended"


# A journal whose newest fragment was persisted this long ago (or its flush interval, if it
# has one) is idle, and `journals suspend` suspends it (Gazette's default: a day).
SUSPEND_IDLE_SECONDS = 24 * 3600


@dataclass(frozen=True, slots=True)
class ReadThrough:
    """Resolve again once the keyspace reaches `revision` (0: the next change)."""

    revision: int


class _Checked(NamedTuple):
    """An append that passed its preconditions (`ClusterAppends._preconditions`)."""

    registers: pb.LabelSet  # The journal's registers it starts from.
    roll_to: int  # The offset the spool rolls to first (0: none).
    suspending: bool  # It asks a suspended journal to suspend (nothing is committed).


class ReplicationFailed(Exception):
    pass


@dataclass(slots=True)
class _ClientGone:
    """Whether an append whose client went away left the pipeline in step: its content
    rolled back on every peer, or its commit sent to every peer and committed here
    (`ClusterAppends._stream`)."""

    in_step: bool = False


async def _one_empty_chunk() -> AsyncIterator[pb.AppendRequest]:
    yield pb.AppendRequest()


async def _prepended(
    first: list[pb.AppendRequest], rest: AsyncIterator[pb.AppendRequest] | None
) -> AsyncIterator[pb.AppendRequest]:
    for req in first:
        yield req
    if rest is not None:
        async for req in rest:
            yield req


async def _relay(call: Any, requests: AsyncIterator[pb.AppendRequest]) -> pb.AppendResponse:
    """Send `requests` on the proxied `call` while waiting for its answer. A primary that
    answers before the client's stream ends (it refused the append, or failed a client too
    slow for its flow control) is answered to the client at once, not once the client sends
    its next chunk; a client's stream that fails cancels the call."""
    sender = asyncio.ensure_future(send_all(call, requests))

    def sent(task: asyncio.Future[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            call.cancel()

    sender.add_done_callback(sent)
    try:
        resp: pb.AppendResponse = await call
    except asyncio.CancelledError:
        failure = sender.exception() if sender.done() and not sender.cancelled() else None
        if failure is not None:
            raise failure from None
        raise
    finally:
        if not sender.done():
            sender.cancel()
    return resp


class ClusterAppends:
    def __init__(
        self,
        resolver: ClusterResolver,
        peers: Peers,
        limits: AppendLimits,
        session: MemberSession | None,
    ) -> None:
        self.resolver = resolver
        self.keyspace = resolver.keyspace
        self.peers = peers
        self.limits = limits
        self.session = session
        self.pulse_timeout = PULSE_TIMEOUT_SECONDS
        self._tasks: set[asyncio.Task[None]] = set()
        # Routes found advertised by assignments (see `_advertises`).
        self._advertised: set[tuple[object, ...]] = set()
        # Advertisements of many journals share a transaction (see `advertiser`).
        self.advertiser = RouteAdvertiser(self.keyspace)
        # Told of each journal whose pulse's advertisement failed (pulse it again later).
        self.on_advertise_failed: Callable[[JournalRuntime], None] = lambda _journal: None
        # Peers found not to serve `PeerJournal.AppendWhole` (Gazette's brokers, or pygazette's
        # from before it), with when to ask again (monotonic time: an upgraded broker may
        # take the same endpoint).
        self._streaming_only: dict[str, float] = {}
        # The same for `PeerJournal.ReplicateWhole`.
        self._replicates_streaming_only: dict[str, float] = {}
        # Told of each replication pipeline opened (the pulser watches the journal then).
        self.on_pipeline_open: Callable[[JournalRuntime], None] = lambda _journal: None

    # Entry points.
    async def serve(self, requests: AsyncIterator[pb.AppendRequest]) -> pb.AppendResponse:
        it = aiter(requests)
        try:
            first = await anext(it)
        except StopAsyncIteration:
            raise AppendAborted(
                grpc.StatusCode.INVALID_ARGUMENT, "expected an initial AppendRequest"
            ) from None
        try:
            validate_append_request(first)
        except ValidationError as exc:
            raise AppendAborted(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        return await self._run(first, it)

    async def pulse(self, replica: JournalRuntime) -> bool:
        """Pulse a journal this broker is primary of, once (`pulser` runs pulses): whether
        it is done with (False: it failed, and is worth retrying)."""
        request = pb.AppendRequest(
            journal=replica.name,
            do_not_proxy=True,
            suspend=pb.AppendRequest.SUSPEND_NO_RESUME,
        )
        try:
            async with asyncio.timeout(self.pulse_timeout):
                resp = await self._run(request, _one_empty_chunk(), pulse=True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not replica.stopping:
                log.info(
                    "journal pulse failed (will retry)",
                    extra={"journal": replica.name, "error": str(exc)},
                )
            return replica.stopping
        if resp.status in (
            pb.OK,
            pb.NOT_JOURNAL_PRIMARY_BROKER,
            pb.NO_JOURNAL_PRIMARY_BROKER,
            pb.JOURNAL_NOT_FOUND,
            pb.SUSPENDED,
        ):
            return True
        log.info(
            "journal pulse failed",
            extra={"journal": replica.name, "status": pb.Status.Name(resp.status)},
        )
        return False

    async def suspend_if_idle(self, replica: Pulsed) -> float | None:
        """Ask a journal this broker is primary of to suspend itself if it is idle (an empty
        append with SUSPEND_IF_FLUSHED, as Gazette's auto-suspending pulse): in how many
        seconds to ask again (None: it is not ours any more). A suspended journal is asked
        again after its flush interval, as its fragments may all expire meanwhile (it is
        then suspended fully); one not idle yet, when it will be."""
        request = pb.AppendRequest(
            journal=replica.name,
            do_not_proxy=True,
            suspend=pb.AppendRequest.SUSPEND_IF_FLUSHED,
        )
        async with asyncio.timeout(self.pulse_timeout):
            resp = await self._run(request, _one_empty_chunk(), pulse=True)
        idle_after = replica.spec.fragment.flush_interval.seconds or SUSPEND_IDLE_SECONDS
        if resp.status == pb.SUSPENDED:
            level = replica.spec.suspend.level if replica.spec.HasField("suspend") else 0
            if level == pb.JournalSpec.Suspend.FULL:
                return None
            log.info("journal suspended (idle)", extra={"journal": replica.name})
            return float(idle_after)
        if resp.status != pb.OK:
            return None  # Not its primary any more, or gone.
        _low, _high, mod_time = replica.index.summary()
        if not mod_time:  # Content not persisted yet: idle a flush interval from now.
            return float(idle_after)
        return max(1.0, mod_time + idle_after - time.time())

    # The state machine.
    async def _run(
        self,
        first: pb.AppendRequest,
        it: AsyncIterator[pb.AppendRequest],
        *,
        pulse: bool = False,
    ) -> pb.AppendResponse:
        started = time.monotonic()
        read_through = 0
        read_ahead = False
        whole: list[pb.AppendRequest] | None = None  # The client's whole append, read ahead.
        proxy_header = first.header if first.HasField("header") else None
        while True:
            try:
                res = await self.resolver.resolve_journal(
                    first.journal,
                    require_primary=True,
                    may_proxy=not first.do_not_proxy,
                    min_revision=read_through,
                    proxy_header=proxy_header,
                )
            except ResolveError as exc:
                raise AppendAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
            if res.status == pb.SUSPENDED and first.suspend == pb.AppendRequest.SUSPEND_RESUME:
                assert res.spec is not None
                read_through = await self._update_suspend(res, pb.JournalSpec.Suspend.NONE, None)
                continue
            if res.status != pb.OK:
                return pb.AppendResponse(status=res.status, header=res.header)
            assert res.spec is not None
            members, wanted = len(res.route.members), desired_replication(res.spec)
            if not res.local:
                if members > wanted:  # The allocator is about to drop a member: wait.
                    read_through = res.header.etcd.revision + 1
                    continue
                if members < wanted:
                    return pb.AppendResponse(
                        status=pb.INSUFFICIENT_JOURNAL_BROKERS, header=res.header
                    )
                return await self._proxy(first, it, res)

            journal = res.replica
            assert journal is not None
            if not pulse and not read_ahead:
                # Before taking the journal: a small append then never holds it waiting
                # for the client's next chunk (`_read_ahead`).
                ahead, more = await self._read_ahead(it)
                it = _prepended(ahead, it if more else None)
                whole = None if more else ahead
                read_ahead = True
            if not await acquire_or_invalidated(journal.pipeline, res.invalidated):
                continue
            try:
                outcome = await self._as_primary(first, it, res, journal, pulse, whole)
            except SpoolFinished as exc:
                # The replica stopped under the append (`Replica.stop`): try again.
                raise AppendAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
            finally:
                journal.pipeline.release()
            if isinstance(outcome, ReadThrough):
                read_through = outcome.revision or res.header.etcd.revision + 1
                continue
            if isinstance(outcome, PendingCommit):
                outcome = await outcome.acknowledged()
            if not pulse and outcome.status == pb.OK:
                record_append(outcome.commit, started)
            return outcome

    async def _as_primary(
        self,
        first: pb.AppendRequest,
        it: AsyncIterator[pb.AppendRequest],
        res: Resolution,
        journal: JournalRuntime,
        pulse: bool,
        whole: list[pb.AppendRequest] | None = None,
    ) -> pb.AppendResponse | ReadThrough | PendingCommit:
        """The append as primary; `whole`: the client's requests after `first`, if its
        stream ended with them (`_read_ahead`)."""
        assert res.spec is not None and journal.rspool is not None
        pln = journal.replication
        if (
            pln is None
            or not pln.ok
            or not routes_equivalent(pln.route, res.route)
            or pln.aged()  # Its streams' tokens would expire: a new one, with new tokens.
        ):
            if pln is not None:
                await journal.close_replication()
            endpoint = self._whole_peer(first, whole, res, journal)
            if endpoint is not None:
                assert whole is not None
                done = await self._append_whole(first, whole, res, journal, endpoint)
                if done is not None:
                    return done
                # Not replicated whole after all: a pipeline, as for any append.
                it = _prepended(whole, None)
            started = await self._start_pipeline(journal, res)
            if started is not None:
                return started
            pln = journal.replication
            assert pln is not None

        checked = await self._preconditions(first, res, journal, pln, pulse)
        if not isinstance(checked, _Checked):
            return checked
        registers, roll_to, suspending = checked
        rs = journal.rspool
        gone = _ClientGone()
        try:
            outcome = await self._stream(first, it, res, journal, pln, registers, roll_to, gone)
        except PipelineBroken as exc:
            rs.rollback()
            await journal.close_replication(graceful=False)
            raise AppendAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        except AppendAborted:
            raise  # Rolled back on every peer: the pipeline is still in step.
        except BaseException:
            if gone.in_step and pln.ok:
                # The client went away, and every peer rolled its content back (mid-stream)
                # or has its commit (sent, and committed here): the pipeline is in step, and
                # the appends in flight around this one go on (as Gazette's).
                raise
            # Cut short otherwise (the client went away or its deadline passed, mid-round):
            # a round may have reached some peers and not others, and our spool may hold a
            # commit no peer confirmed. Never run another round on this pipeline: the next
            # append builds a new one, which cuts what was not confirmed.
            rs.rollback()
            await journal.close_replication(graceful=False)
            raise
        if suspending and isinstance(outcome, PendingCommit) and outcome.response.status == pb.OK:
            # Nothing was committed (content is refused with a suspension): once what came
            # before is confirmed, the answer is that the journal is suspended.
            outcome.response = pb.AppendResponse(status=pb.SUSPENDED, header=res.header)
        return outcome

    async def _preconditions(
        self,
        first: pb.AppendRequest,
        res: Resolution,
        journal: JournalRuntime,
        pln: Pipeline | None,
        pulse: bool,
    ) -> pb.AppendResponse | ReadThrough | _Checked:
        """Check the append against the journal as its spool now stands (in line with every
        peer's: `pln` synchronised them, or the whole append will). An answer or a read-
        through ends the append; else the registers it starts from, the offset to roll the
        spool to first (0: none), and whether it asks a suspended journal to suspend."""
        assert res.spec is not None and journal.rspool is not None
        if not self._advertises(res):
            if pulse and self._advertise_later(res, journal):
                # Its write changes the assignments, which pulses the journal again.
                return pb.AppendResponse(status=pb.OK, header=res.header)
            return ReadThrough(await self._advertise(res))
        members, wanted = len(res.route.members), desired_replication(res.spec)
        if members > wanted:
            return ReadThrough(res.header.etcd.revision + 1)
        if members < wanted:
            return pb.AppendResponse(status=pb.INSUFFICIENT_JOURNAL_BROKERS, header=res.header)

        # Preconditions. The first store listing must have landed (the stores may hold a
        # larger write head than our spools); while the store can't be listed, or while it
        # fails and closed spools piled up past the bound, appends are refused, as on a
        # single node (a pulse appends nothing: only an unlisted store refuses it).
        failure = await first_listing_or_invalidated(journal, res.invalidated)
        if failure is None:
            return ReadThrough(0)
        if failure or (not pulse and (failure := journal.append_refusal())):
            return pb.AppendResponse(
                status=pb.FRAGMENT_STORE_UNHEALTHY, header=res.header, store_health_error=failure
            )
        rs = journal.rspool
        spec = res.spec
        # Registers as the appends before this one leave them (committed here, if not yet
        # acknowledged: should one of them fail, the pipeline fails, and this append too).
        registers = _copy(rs.registers)
        if (
            first.HasField("check_registers")
            and registers.labels
            and not selector_matches(first.check_registers, registers)
        ):
            return pb.AppendResponse(
                status=pb.REGISTER_MISMATCH, header=res.header, registers=registers
            )
        suspend = spec.suspend if spec.HasField("suspend") else pb.JournalSpec.Suspend()
        # The spool rolls forward to the offset the journal was suspended at, if below it; the
        # checks of the append's offset hold for its end after that roll (as Gazette's, which
        # rolls first and checks then).
        end = max(rs.end, suspend.offset)
        roll_to = suspend.offset if rs.end < suspend.offset else 0
        max_offset = max(end, journal.index.end_offset)
        if end != max_offset and first.offset == 0 and journal_spec_flags_allow_write(spec):
            return pb.AppendResponse(status=pb.INDEX_HAS_GREATER_OFFSET, header=res.header)
        elif first.offset and first.offset != max_offset:
            return pb.AppendResponse(status=pb.WRONG_APPEND_OFFSET, header=res.header)
        elif first.offset and end != max_offset:
            roll_to = max_offset
        if first.suspend == pb.AppendRequest.SUSPEND_NO_RESUME and suspend.level != 0:
            return pb.AppendResponse(status=pb.SUSPENDED, header=res.header)
        # Where the journal resumes (or is suspended at): its spool's end after those rolls.
        resume_at = max(end, roll_to)
        if first.suspend == pb.AppendRequest.SUSPEND_RESUME and suspend.level != 0:
            return ReadThrough(
                await self._update_suspend(res, pb.JournalSpec.Suspend.NONE, resume_at)
            )
        suspending = False
        if first.suspend in SUSPENDING:
            # Asked to suspend the journal (`journals suspend`), as Gazette's appendFSM does.
            low, high, mod_time = journal.index.summary()
            if suspend.level != pb.JournalSpec.Suspend.FULL and low == high:
                # No fragment holds any content (never written, or all of it removed by
                # retention): no broker needs to serve it at all.
                return ReadThrough(
                    await self._update_suspend(res, pb.JournalSpec.Suspend.FULL, resume_at)
                )
            # Idle: its newest fragment is persisted, and has been for the flush interval
            # (taken as how long a journal in use goes without an append).
            idle_after = spec.fragment.flush_interval.seconds or SUSPEND_IDLE_SECONDS
            dirty = not mod_time or mod_time > time.time() - idle_after
            if suspend.level == pb.JournalSpec.Suspend.NONE and (
                not dirty or first.suspend == pb.AppendRequest.SUSPEND_NOW
            ):
                # One broker serves it from now on (the allocator drops the others). Commits
                # of earlier appends may still be in flight: once confirmed they count (else
                # they are cut, and it would resume past a gap).
                assert pln is not None  # A suspending append is never replicated whole.
                await _confirm_all(journal, pln)
                return ReadThrough(
                    await self._update_suspend(res, pb.JournalSpec.Suspend.PARTIAL, resume_at)
                )
            if suspend.level == pb.JournalSpec.Suspend.PARTIAL:
                # Suspended: roll the spool, so its content persists rather than waiting for
                # an append that may not come, and answer SUSPENDED.
                suspending = True
                if rs.end > rs.begin:
                    roll_to = rs.end
        if not roll_to and rs.end > rs.begin and rs.begin == journal.index.begin_offset:
            # The spool holds the journal's first known write: roll it, so the store shows
            # that writes happened (Gazette's guard against reusing offsets).
            roll_to = rs.end
        return _Checked(registers, roll_to, suspending)

    def _advertises(self, res: Resolution) -> bool:
        """`assignments_advertise(res.route, res.assignments)`, remembered: an assignment's
        value is fixed by its key and mod revision, so decoding (and validating) the routes
        they advertise is done once, not on every append."""
        route = res.route
        key = (
            route.primary,
            tuple((m.zone, m.suffix) for m in route.members),
            tuple((a.kv.key, a.kv.mod_revision) for a in res.assignments),
        )
        if key in self._advertised:
            return True
        if not assignments_advertise(route, res.assignments):
            return False
        if len(self._advertised) >= 10_000:
            self._advertised.clear()
        self._advertised.add(key)
        return True

    def _whole_peer(
        self,
        first: pb.AppendRequest,
        whole: list[pb.AppendRequest] | None,
        res: Resolution,
        journal: JournalRuntime,
    ) -> str | None:
        """The endpoint of the one peer to replicate this append to in one call
        (`whole_replication`), or None to open a pipeline. Only an append the client sent
        whole, with content, to a journal of a route of two whose spool holds nothing
        unconfirmed, that was not appended to whole a moment ago (WHOLE_QUIET_SECONDS)."""
        spec, route, rs = res.spec, res.route, journal.rspool
        if whole is None or spec is None or rs is None or first.suspend in SUSPENDING:
            return None
        if len(route.members) != 2 or len(route.endpoints) != 2 or route.primary not in (0, 1):
            return None
        if desired_replication(spec) != 2 or rs.unconfirmed or rs.in_doubt > (rs.confirmed or 0):
            return None
        now = time.monotonic()
        if now - journal.replicated_whole_at < WHOLE_QUIET_SECONDS:
            return None
        if not any(req.content for req in whole):
            return None
        if not self._lease_alive():
            return None
        endpoint = route.endpoints[1 - route.primary]
        if self._replicates_streaming_only.get(endpoint, 0.0) > now:
            return None
        if not self.peers.connected(endpoint):
            # A call that can't connect fails as one cut off after the peer took it does (in
            # doubt, UNKNOWN to the client); a pipeline's new stream fails plainly
            # (UNAVAILABLE), and connects the channel for the next append.
            return None
        return endpoint

    async def _append_whole(
        self,
        first: pb.AppendRequest,
        whole: list[pb.AppendRequest],
        res: Resolution,
        journal: JournalRuntime,
        endpoint: str,
    ) -> pb.AppendResponse | ReadThrough | None:
        """Append with no pipeline: synchronise, write and commit the journal's spool here,
        then replicate all of it to the peer at `endpoint` in one call (`whole_replication`),
        whose answer confirms it. None when that can't be done with nothing committed (the
        caller appends through a pipeline instead)."""
        assert res.spec is not None and journal.rspool is not None
        if not await acquire_or_invalidated(journal.spool_lock, res.invalidated):
            return ReadThrough(0)
        rs = journal.rspool
        try:
            # The preconditions first: with no pipeline, our spool is as every member's
            # (nothing unconfirmed: `_whole_peer`), and a peer that disagrees answers PROPOSAL_
            # MISMATCH, which sends the append to a pipeline (that synchronises, then checks).
            checked = await self._preconditions(first, res, journal, None, pulse=False)
            if isinstance(checked, pb.AppendResponse) and checked.status != pb.OK:
                # Perhaps only as our spool stands: a pipeline hears from the peer (which
                # may be ahead, and roll us forward) before it checks.
                return None
            if not isinstance(checked, _Checked):
                return checked
            # Synchronise as a new pipeline does (`_start_pipeline`), proposing our fragment,
            # or the roll this append starts with (`_stream`; all of it is confirmed). Here
            # first, at the peer in the same call.
            proposal = roll_proposal(
                rs.fragment(), rs.first_append_time, checked.roll_to, res.spec.fragment, time.time()
            )
            local = await rs.apply_proposal(proposal, _copy(checked.registers), primary=True)
            if local.status != pb.OK:
                return None
            header = _copy_header(res.header)
            header.process_id.CopyFrom(res.route.members[1 - res.route.primary])
            sync = pb.ReplicateRequest(
                header=header,
                proposal=rs.fragment(),
                registers=_copy(rs.registers),
                acknowledge=True,
                deprecated_journal=journal.name,
            )
            return await self._commit_whole(
                first, whole, res, journal, endpoint, sync, checked.registers
            )
        finally:
            rs.rollback()  # Content written but not committed (refused, or cut short).
            journal.spool_lock.release()

    async def _commit_whole(
        self,
        first: pb.AppendRequest,
        whole: list[pb.AppendRequest],
        res: Resolution,
        journal: JournalRuntime,
        endpoint: str,
        sync: pb.ReplicateRequest,
        registers: pb.LabelSet,
    ) -> pb.AppendResponse | None:
        """`_append_whole`'s content and commit (its caller holds the spool)."""
        rs, spec = journal.rspool, res.spec
        assert rs is not None and spec is not None
        begin, codec = rs.end, rs.codec
        may_write = journal_spec_flags_allow_write(spec)
        limiters = [journal.limiter.capped(self.limits.max_append_rate)]
        requests = [sync]
        committing = False
        total_chunks = delayed_chunks = 0
        for req in whole:
            error = chunk_error(req, committing)
            if error is not None:
                raise error
            content = req.content
            size = len(content)
            total_chunks += 1  # Every chunk read, the commit chunk too (as Gazette's).
            if not size:
                committing = True
                continue
            if not may_write:
                return pb.AppendResponse(status=pb.NOT_ALLOWED, header=res.header)
            if await throttle(limiters, size):
                delayed_chunks += 1
            delta = rs.delta
            requests.append(pb.ReplicateRequest(content=content, content_delta=delta))
            await rs.apply_content(content, delta)
        if not committing:
            raise AppendAborted(grpc.StatusCode.ABORTED, _NO_COMMIT)

        proposal = rs.next_fragment()
        new_registers = update_registers(
            registers,
            union=first.union_registers if first.HasField("union_registers") else None,
            subtract=first.subtract_registers if first.HasField("subtract_registers") else None,
        )
        assert rs.pending is not None
        commit = pb.Fragment(
            journal=journal.name, begin=begin, end=begin + rs.delta, compression_codec=codec
        )
        commit.sum.CopyFrom(sha1sum_from_digest(rs.pending.sha.digest()))
        if not self._lease_alive():
            raise AppendAborted(
                grpc.StatusCode.UNAVAILABLE, "etcd lease may have expired; refusing to confirm"
            )
        # Committed here first, then at the peer, whose commit confirms it (a route of two:
        # `Pipeline.propose_confirmed_commit`). Until the peer answers, it lies above our
        # confirmed frontier.
        local = await rs.apply_proposal(proposal, new_registers, primary=True)
        if local.status != pb.OK:
            raise AppendAborted(
                grpc.StatusCode.UNAVAILABLE, f"own spool refused its commit: {local}"
            )
        requests.append(
            pb.ReplicateRequest(
                header=sync.header, proposal=proposal, registers=new_registers, acknowledge=True
            )
        )
        # The pulser watches the journal (its flush interval), as from a pipeline's opening:
        # also when the call leaves the commit in doubt, which the flush's pipeline then
        # confirms everywhere, without waiting for another append.
        self.on_pipeline_open(journal)
        try:
            answers = await replicate_whole(self.peers, endpoint, journal.name, requests)
        except WholeUnserved:
            self._replicates_streaming_only[endpoint] = time.monotonic() + STREAMING_ONLY_SECONDS
            log.info("peer takes replication as streams only", extra={"endpoint": endpoint})
            rs.cut_unconfirmed()
            return None
        except WholeRefused as exc:
            log.info(
                "whole replication refused; appending through a pipeline",
                extra={"journal": journal.name, "error": str(exc)},
            )
            rs.cut_unconfirmed()
            return None
        except BaseException as exc:
            # The peer may hold the commit, confirmed (its answer was lost, or we stopped
            # waiting): in doubt, as after a pipeline broke with a self-confirming commit out.
            rs.note_in_doubt(proposal.end, rs.confirmed or 0)
            if isinstance(exc, WholeInDoubt):
                raise _in_doubt(journal.name, exc) from exc
            raise
        if len(answers) != 2 or any(a.status != pb.OK for a in answers):
            # The peer stopped at an answer that is not OK and applied nothing after it, the
            # commit included. A pipeline's synchronisation deals with what it says (a peer
            # ahead of us, a newer route).
            rs.cut_unconfirmed()
            return None
        journal.confirm_through(proposal.end)
        journal.replicated_whole_at = time.monotonic()
        return _response(res, commit, new_registers, total_chunks, delayed_chunks)

    async def _start_pipeline(self, journal: JournalRuntime, res: Resolution) -> ReadThrough | None:
        assert journal.rspool is not None and res.spec is not None
        if not await acquire_or_invalidated(journal.spool_lock, res.invalidated):
            return ReadThrough(0)
        rs = journal.rspool
        # Content we hold but never saw confirmed everywhere was never acknowledged (see the
        # module docstring): a new pipeline starts without it, but never cuts below a
        # confirmation this broker sent that some peer may have taken (`in_doubt`).
        if rs.unconfirmed:
            rs.cut_unconfirmed(keep_in_doubt=True)
        pln = self._new_pipeline(journal, res)
        try:
            # Propose our fragment (rolled if it is due, `roll_proposal`), as Gazette's first
            # sync does: members holding exactly it (the route's, when its pipeline closed
            # idle) take it and the journal goes on in the same spool. A member that doesn't
            # (a new one, after a route change) rolls to our end and answers with an empty
            # fragment there, and the next round rolls every member there.
            roll_to = 0
            registers = _copy(rs.registers)
            for attempt in range(MAX_SYNC_ROUNDS):
                if attempt:
                    # A peer refused the last round: start over on fresh streams.
                    pln.abort()
                    pln = self._new_pipeline(journal, res)
                # Peers' Replicate streams are signed for this journal only, as Gazette's.
                with journal_claims_scope(Capability.REPLICATE, res.spec.name):
                    await pln.open()
                proposal = roll_proposal(
                    rs.fragment(), rs.first_append_time, roll_to, res.spec.fragment, time.time()
                )
                local = await rs.apply_proposal(proposal, registers, primary=True)
                if local.status != pb.OK:
                    raise ReplicationFailed(f"own spool refused {proposal}")
                resps = await pln.round(
                    pb.ReplicateRequest(proposal=rs.fragment(), registers=_copy(rs.registers))
                )
                roll_to, read_through = 0, 0
                for resp in resps:
                    if resp.status == pb.OK:
                        continue
                    if resp.status == pb.WRONG_ROUTE:
                        if (
                            not routes_equivalent(resp.header.route, res.route)
                            and resp.header.etcd.revision > res.header.etcd.revision
                        ):
                            read_through = max(read_through, resp.header.etcd.revision)
                            continue
                        raise ReplicationFailed(f"unexpected WRONG_ROUTE: {resp.header}")
                    if resp.status == pb.PROPOSAL_MISMATCH:
                        frag = resp.fragment
                        if frag.end > rs.end:
                            if frag.end > roll_to:
                                roll_to = frag.end
                                registers = _copy(resp.registers)
                            continue
                        if frag.end == rs.end:
                            # It holds another fragment, or other registers, ending where
                            # ours does (or rolled there, lacking ours): all roll there.
                            roll_to = max(roll_to, frag.end)
                            continue
                        raise ReplicationFailed(f"unexpected PROPOSAL_MISMATCH: {frag}")
                    raise ReplicationFailed(f"unexpected status {pb.Status.Name(resp.status)}")
                if read_through:
                    pln.abort()
                    journal.spool_lock.release()
                    return ReadThrough(read_through)
                if not roll_to:
                    break
                log.info(
                    "a peer holds a greater offset; rolling the journal forward",
                    extra={"journal": journal.name, "from": rs.end, "to": roll_to},
                )
            else:
                raise ReplicationFailed("peers did not agree on a fragment")
            # Every member now holds our fragment: confirm it everywhere before anything
            # else. A roll forward passed content only some peer holds (it persists it); the
            # route may change again before any append confirms the offsets we passed
            # (routes wider than the replication take none), and members whose frontier
            # stayed below them would cut back there and write over that content.
            await pln.confirm_fragment(rs.fragment(), _copy(rs.registers))
        except (PipelineBroken, ReplicationFailed, PeerUnavailable, grpc.aio.AioRpcError) as exc:
            pln.abort()
            rs.rollback()
            # Its synchronising confirmation may have reached some peers.
            rs.note_in_doubt(pln.confirm_sent, pln.confirmed)
            journal.spool_lock.release()
            raise AppendAborted(
                grpc.StatusCode.UNAVAILABLE, f"replication of {journal.name} failed: {exc}"
            ) from exc
        except BaseException:
            pln.abort()
            rs.note_in_doubt(pln.confirm_sent, pln.confirmed)
            journal.spool_lock.release()
            raise
        journal.replication = pln
        self.on_pipeline_open(journal)
        return None

    def _lease_alive(self) -> bool:
        """Whether this broker's etcd lease is surely alive (no session: single member), so
        that a confirmation may go out (see `pipeline`)."""
        return self.session is None or self.session.lease_alive()

    def _new_pipeline(self, journal: JournalRuntime, res: Resolution) -> Pipeline:
        return Pipeline(
            _copy_header(res.header),
            self.peers,
            may_confirm=self._lease_alive,
            on_confirmed=journal.confirm_through,
        )

    async def _stream(
        self,
        first: pb.AppendRequest,
        it: AsyncIterator[pb.AppendRequest],
        res: Resolution,
        journal: JournalRuntime,
        pln: Pipeline,
        registers: pb.LabelSet,
        roll_to: int,
        gone: _ClientGone,
    ) -> pb.AppendResponse | PendingCommit:
        """Stream the client's content and commit it; `gone` tells, of a client that went
        away, whether the pipeline is still in step (`_ClientGone`)."""
        rs = journal.rspool
        spec = res.spec
        assert rs is not None and spec is not None
        frag = rs.fragment()
        proposal = roll_proposal(frag, rs.first_append_time, roll_to, spec.fragment, time.time())
        if not fragments_equal(proposal, frag):
            # A spool completes cut to its confirmed frontier: confirm everything first.
            await pln.confirm(rs.end)
            await rs.apply_proposal(proposal, registers, primary=True)
            # Streamed ahead of the content without waiting for an answer, as Gazette's
            # roll: the pipeline is synchronised, and a peer refusing it ends its stream,
            # which fails this append's commit round (and breaks the pipeline).
            await pln.send(pb.ReplicateRequest(proposal=rs.fragment(), registers=_copy(registers)))
            await pln.confirm_fragment(rs.fragment(), registers)

        begin = rs.end
        codec = rs.codec
        policer = MinRatePolicer(self.limits.min_rate)
        limiters = [journal.limiter.capped(self.limits.max_append_rate)]
        total_chunks = delayed_chunks = 0
        committing = False
        error: AppendAborted | None = None
        status = pb.OK
        may_write = journal_spec_flags_allow_write(spec)

        async def receive() -> pb.AppendRequest | None:
            return await next_policed(it, policer)

        try:
            while True:
                req = await receive()
                if req is None:
                    if not committing:
                        error = AppendAborted(grpc.StatusCode.ABORTED, _NO_COMMIT)
                    break
                error = chunk_error(req, committing)
                if error is not None:
                    break
                content = req.content  # Each read of a bytes field copies it: read it once.
                size = len(content)
                total_chunks += 1  # Every chunk read, the commit chunk too (as Gazette's).
                if not size:
                    committing = True
                    continue
                if not may_write or first.suspend in SUSPENDING:
                    # Not writable, or asked to suspend: a suspending append carries no
                    # content (as Gazette's).
                    status = pb.NOT_ALLOWED
                    break
                policer.received(size)
                waited = await throttle(limiters, size)
                if waited:
                    delayed_chunks += 1
                    policer.excuse(waited)
                # Queued for every peer (their writers send it meanwhile), then spooled here.
                # The client isn't charged for the time this takes (a busy broker, a peer
                # slow to drain its queue): the policer measures the client alone.
                spooling = time.monotonic()
                delta = rs.delta
                await pln.send(pb.ReplicateRequest(content=content, content_delta=delta), size)
                await rs.apply_content(content, delta)
                policer.excuse(time.monotonic() - spooling)
        except FlowControlUnderflow as exc:
            error = AppendAborted(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            # The client went away: roll back everywhere (`_as_primary` keeps the pipeline
            # if every peer did).
            await self._roll_back(journal, pln, registers, gone)
            raise

        if rs.delta == 0 and error is None and status == pb.OK and committing:
            if first.HasField("union_registers") or first.HasField("subtract_registers"):
                error = AppendAborted(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "append stream: register modification requires non-empty Append",
                )
        if error is not None or status != pb.OK:
            await self._roll_back(journal, pln, registers, gone)
            if error is not None:
                raise error
            return pb.AppendResponse(status=status, header=res.header)

        commit = pb.Fragment(journal=journal.name, begin=begin, end=begin, compression_codec=codec)
        if not rs.delta:
            # Nothing to commit: acknowledged once all that came before is confirmed.
            commit.sum.CopyFrom(sha1sum_from_digest(hashlib.sha1().digest()))
            resp = _response(res, commit, registers, total_chunks, 0)
            return PendingCommit(journal, pln, None, rs.end, resp, *pln.barrier())
        # Commit: send the proposal to every peer, then commit our own spool (as Gazette's
        # pipeline scatters it); the acknowledgements are awaited without the append lock.
        proposal = rs.next_fragment()
        new_registers = update_registers(
            registers,
            union=first.union_registers if first.HasField("union_registers") else None,
            subtract=first.subtract_registers if first.HasField("subtract_registers") else None,
        )
        # The append's own SHA-1, which its spool write already computed.
        assert rs.pending is not None
        commit.end = begin + rs.delta
        commit.sum.CopyFrom(sha1sum_from_digest(rs.pending.sha.digest()))
        if pln.pair:
            # A route of two: commit here first, then send a commit that confirms itself
            # (`Pipeline.propose_confirmed_commit`). Committed here but never sent, it lies
            # above the confirmed frontier, and the next pipeline cuts it.
            pln.check_may_confirm()
            try:
                local = await rs.apply_proposal(proposal, new_registers, primary=True)
            except asyncio.CancelledError:
                if rs.end == proposal.end:
                    # The client went away while the commit landed here (a synced spool's
                    # commit waits for its disk): it goes on, to the peer too.
                    try:
                        pln.propose_confirmed_commit(
                            pb.ReplicateRequest(proposal=proposal, registers=new_registers)
                        )
                        gone.in_step = True
                    except PipelineBroken:
                        pass  # Unconfirmed here: the next pipeline cuts it.
                raise
            if local.status != pb.OK:
                pln.fail(f"own spool refused its commit: {local}")
                raise PipelineBroken(pln.broken)
            rnd = pln.propose_confirmed_commit(
                pb.ReplicateRequest(proposal=proposal, registers=new_registers)
            )
            resp = _response(res, commit, new_registers, total_chunks, delayed_chunks)
            return PendingCommit(journal, pln, rnd, proposal.end, resp, *pln.barrier())
        rnd = await pln.propose(
            pb.ReplicateRequest(proposal=proposal, registers=new_registers), commit=True
        )
        try:
            local = await rs.apply_proposal(proposal, new_registers, primary=True)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and rs.end == proposal.end:
                # The client went away while the commit landed here (a synced spool's commit
                # waits for its disk): every member holds it, and it goes on.
                pln.committed_locally(rnd)
                gone.in_step = True
                raise
            # Peers may commit it; it must never be confirmed: break the pipeline (the next
            # one synchronises every replica with this spool again).
            pln.fail(f"own spool failed its commit: {exc!r}")
            raise
        if local.status != pb.OK:
            pln.fail(f"own spool refused its commit: {local}")
            raise PipelineBroken(pln.broken)
        pln.committed_locally(rnd)
        resp = _response(res, commit, new_registers, total_chunks, delayed_chunks)
        return PendingCommit(journal, pln, rnd, proposal.end, resp, *pln.barrier())

    async def _roll_back(
        self, journal: JournalRuntime, pln: Pipeline, registers: pb.LabelSet, gone: _ClientGone
    ) -> None:
        """Drop the content streamed for an append, here and on every peer (else the pipeline
        is closed). Once the rollback is sent to every peer (they all get it, in the same
        order, and one refusing it breaks the pipeline) the pipeline is in step (`gone`),
        also if the append is cancelled (its client gone) while every peer answers."""
        rs = journal.rspool
        assert rs is not None
        rs.rollback()
        if not pln.ok:
            return
        try:
            rnd = await pln.propose(
                pb.ReplicateRequest(proposal=rs.fragment(), registers=_copy(registers))
            )
            gone.in_step = True
            await pln.wait(rnd)
        except PipelineBroken:
            gone.in_step = False
            await journal.close_replication(graceful=False)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await self.advertiser.stop()

    # Keyspace updates.
    async def _advertise(self, res: Resolution) -> int:
        """Write the route into every assignment that doesn't advertise it yet (in a
        transaction shared with other journals' advertisements: `advertiser`)."""
        compares, ops = _advertisement(res)
        if not ops:
            return 0
        try:
            result = await self.advertiser.advertise(compares, ops)
        except KeyspaceUnavailable as exc:
            raise AppendAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        return result.revision

    def _advertise_later(self, res: Resolution, journal: JournalRuntime) -> bool:
        """A pulse's `_advertise`, not awaited: the pulse is done once its pipeline is
        synchronised (the write changes the assignments, which pulses the journal again,
        and that pulse runs the empty append). So a pulse doesn't hold one of the pulser's
        few workers through the transaction, and many pulses' writes share one. Should the
        write fail, `on_advertise_failed` is told (to pulse again). Whether it was sent."""
        compares, ops = _advertisement(res)
        if not ops:
            return False

        def written(done: asyncio.Future[TxnResult]) -> None:
            failed = done.cancelled() or done.exception() is not None
            if failed or not done.result().succeeded:
                # An assignment changed (that pulses the journal anyway), or the write
                # failed: pulse again (it finds the route advertised, or writes it).
                if not journal.stopping:
                    self.on_advertise_failed(journal)

        self.advertiser.submit(compares, ops).add_done_callback(written)
        return True

    async def _update_suspend(self, res: Resolution, level: int, offset: int | None) -> int:
        assert res.spec is not None and res.item is not None
        spec = pb.JournalSpec()
        spec.CopyFrom(res.spec)
        spec.suspend.level = level  # type: ignore[assignment]
        if offset is not None:
            spec.suspend.offset = offset
        compares = [Compare(res.item.key, res.item.mod_revision)]
        compares += [Compare(a.kv.key, a.kv.mod_revision) for a in res.assignments]
        try:
            result = await self.keyspace.txn(
                compares, [Put(res.item.key, spec.SerializeToString(deterministic=True))]
            )
        except KeyspaceUnavailable as exc:
            raise AppendAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        return result.revision

    # Proxying.
    async def _proxy(
        self, first: pb.AppendRequest, it: AsyncIterator[pb.AppendRequest], res: Resolution
    ) -> pb.AppendResponse:
        route = res.route
        target = res.header.process_id
        endpoint = ""
        for i, m in enumerate(route.members):
            if m.zone == target.zone and m.suffix == target.suffix and i < len(route.endpoints):
                endpoint = route.endpoints[i]
        try:
            stub = self.peers.stub(endpoint)
        except PeerUnavailable as exc:
            raise AppendAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        forwarded = pb.AppendRequest()
        forwarded.CopyFrom(first)
        forwarded.header.CopyFrom(res.header)
        ahead, more = await self._read_ahead(it)

        if not more and self._streaming_only.get(endpoint, 0.0) <= time.monotonic():
            whole = await self._proxy_whole(endpoint, first.journal, [forwarded, *ahead])
            if whole is not None:
                return whole
        # Re-signed by this broker for this journal only, as Gazette proxies.
        with journal_claims_scope(Capability.APPEND, first.journal):
            call = stub.Append()
        try:
            # Written with `send`: a primary that ends the stream early (refusing it) has its
            # status reach the client, not grpc-python's INTERNAL.
            resp: pb.AppendResponse
            if more:
                resp = await _relay(call, _prepended([forwarded, *ahead], it))
            else:
                await send_all(call, _prepended([forwarded, *ahead], None))
                resp = await call
        except grpc.aio.AioRpcError as exc:
            call.cancel()  # Ours (the primary's status) or the client's stream failing.
            raise AppendAborted(exc.code(), exc.details() or "proxied append failed") from exc
        except BaseException:
            call.cancel()  # The client went away: the primary rolls the append back.
            raise
        return resp

    async def _proxy_whole(
        self, endpoint: str, journal: str, requests: list[pb.AppendRequest]
    ) -> pb.AppendResponse | None:
        """Proxy an append the client has sent whole (and closed its stream) in one message
        (`peer_append_service`); None if the primary does not serve that (a Gazette broker:
        stream it then, as to that primary from now on)."""
        with journal_claims_scope(Capability.APPEND, journal):
            call = self.peers.peer_stub(endpoint).AppendWhole(ppb.WholeAppend(requests=requests))
        try:
            resp: pb.AppendResponse = await call
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._streaming_only[endpoint] = time.monotonic() + STREAMING_ONLY_SECONDS
                log.info("peer takes appends as streams only", extra={"endpoint": endpoint})
                return None
            raise AppendAborted(exc.code(), exc.details() or "proxied append failed") from exc
        except BaseException:
            call.cancel()  # The client went away: the primary rolls the append back.
            raise
        return resp

    async def _read_ahead(
        self, it: AsyncIterator[pb.AppendRequest]
    ) -> tuple[list[pb.AppendRequest], bool]:
        """The client's next chunks, up to its commit (an empty chunk) and the end of its
        stream, or PROXY_READ_AHEAD bytes, read before the primary is dialed (proxying) or
        the journal taken (as primary); whether the stream goes on after them.

        The primary polices the pace of the chunks it receives (`flow_control`) while it
        holds the journal: with a 1 s allowance, as Gazette's. Through a proxy that pace was
        the proxy's too (a proxy whose event loop stalled between a client's chunks failed
        prompt clients with DEADLINE_EXCEEDED), and a client that dawdled held the journal
        from every other writer. Read ahead, a small append reaches the primary whole, in
        one burst, and is streamed into the journal only once it is all here. Nothing is
        held meanwhile, so the client's pace is policed with READ_AHEAD_SLACK_SECONDS of
        allowance (a machine so loaded that a client's process stalls for a second fails
        no append)."""
        policer = MinRatePolicer(self.limits.min_rate, READ_AHEAD_SLACK_SECONDS)
        ahead: list[pb.AppendRequest] = []
        size = 0
        try:
            while size < PROXY_READ_AHEAD:
                req = await next_policed(it, policer)
                if req is None:
                    return ahead, False
                ahead.append(req)
                n = len(req.content)
                if not n:
                    # The commit: only the end of the stream may follow, and a client sends
                    # it at once. Anything else is left for the primary to refuse.
                    last = await next_policed(it, policer)
                    if last is None:
                        return ahead, False
                    ahead.append(last)
                    break
                size += n
                policer.received(n)
        except FlowControlUnderflow as exc:
            raise AppendAborted(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from exc
        return ahead, True


@dataclass(slots=True)
class PendingCommit:
    """An append whose commit went out: acknowledged once every peer confirmed it."""

    journal: JournalRuntime
    pipeline: Pipeline
    round: Round | None  # The commit's round (None: nothing to commit).
    end: int  # The journal's end after the commit.
    response: pb.AppendResponse
    # The previous append is answered first (`Pipeline.barrier`).
    previous: asyncio.Future[None] | None
    answered: asyncio.Future[None]

    async def acknowledged(self) -> pb.AppendResponse:
        pln = self.pipeline
        try:
            if self.round is not None:
                await pln.wait(self.round)  # Every peer holds the append...
            await pln.confirm(self.end)  # ...and has confirmed it.
            if self.previous is not None and not self.previous.done():
                await asyncio.shield(self.previous)
        except PipelineBroken as exc:
            if pln.confirm_sent >= self.end > self.response.commit.begin:
                # A confirmation covering it went out: a peer may hold it confirmed, and
                # the journal may continue from that peer.
                raise _in_doubt(self.journal.name, exc) from exc
            # Confirmed nowhere: the next pipeline cuts it from every member.
            raise AppendAborted(
                grpc.StatusCode.UNAVAILABLE, f"replication of {self.journal.name} failed: {exc}"
            ) from exc
        # Cut short otherwise (the client went away): its commit went out to every peer and
        # goes on (as Gazette's, which doesn't roll back a commit it sent): its client may
        # not learn of it, and the appends behind it are answered in turn.
        finally:
            if not self.answered.done():
                self.answered.set_result(None)
        return self.response


def _in_doubt(journal: str, exc: BaseException) -> AppendAborted:
    """An append whose confirmation went out, to a peer that may hold it confirmed, when
    replication failed: it may or may not have been committed (UNKNOWN)."""
    return AppendAborted(
        grpc.StatusCode.UNKNOWN,
        f"replication of {journal} failed while the append was being confirmed; it may or "
        f"may not have been committed: {exc}",
    )


def _response(
    res: Resolution,
    commit: pb.Fragment,
    registers: pb.LabelSet,
    total_chunks: int,
    delayed_chunks: int,
) -> pb.AppendResponse:
    return pb.AppendResponse(
        status=pb.OK,
        header=res.header,
        commit=commit,
        registers=_copy(registers),
        total_chunks=total_chunks,
        delayed_chunks=delayed_chunks,
    )


async def _confirm_all(journal: JournalRuntime, pln: Pipeline) -> None:
    """Wait until everything committed to the journal's open spool is confirmed; a pipeline
    that breaks meanwhile is dropped (its unconfirmed commits fail) and the append aborted."""
    assert journal.rspool is not None
    try:
        await pln.confirm(journal.rspool.end)
    except PipelineBroken as exc:
        await journal.close_replication(graceful=False)
        raise AppendAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc


def _advertisement(res: Resolution) -> tuple[list[Compare], list[Put]]:
    """The transaction writing `res.route` into the assignments that don't advertise it,
    guarded by every assignment's mod revision."""
    value = route_value(res.route)
    compares = [Compare(a.kv.key, a.kv.mod_revision) for a in res.assignments]
    ops: list[Put] = []
    for a in res.assignments:
        try:
            current = decode_route(a.kv)
        except ValueError:
            current = pb.Route(primary=-1)
        if not routes_equivalent(current, res.route) or not a.kv.value:
            ops.append(Put(a.kv.key, value, ignore_lease=True))
    return compares, ops


def _copy(ls: pb.LabelSet) -> pb.LabelSet:
    out = pb.LabelSet()
    out.CopyFrom(ls)
    return out


def _copy_header(h: pb.Header) -> pb.Header:
    out = pb.Header()
    out.CopyFrom(h)
    return out
