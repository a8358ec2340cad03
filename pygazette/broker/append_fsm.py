"""Appends in cluster mode: Gazette's append state machine over a replication pipeline.

An Append (or a pulse: an empty append the primary runs on its own) goes through:

1. resolve — the journal's primary, after any revision the request requires;
2. proxy — a non-primary forwards the whole stream to the primary (once the route has the
   journal's replication: more members means the allocator is about to drop one, so wait);
3. pipeline — as primary, hold the journal's append lock; if there is no pipeline for the
   current route, own the spool, open Replicate streams to every peer and synchronise them:
   propose our fragment (rolled to a new one on a route change), and roll forward to any
   peer's larger offset (taking its registers) until every peer agrees; then confirm that
   agreement everywhere with one more round, so that no member (whichever remain after the
   next route change) cuts back below it;
4. advertise — if the assignments don't all advertise this route yet, write it into them
   (one transaction) and resolve again: the allocator only drops replicas of consistent
   journals;
5. preconditions — registers (`check_registers`), offsets (`offset`, or a greater offset
   in the fragment index, which means consistency was lost), suspension;
6. stream — roll the fragment first if due (length, flush interval, codec), then send each
   content chunk to every peer and to the local spool; on commit, propose the extended
   fragment, with the new registers, and wait for every peer to acknowledge it.

Departures from Gazette, all for safety under failures:

- Appends are not pipelined: a proposal goes out only after every peer acknowledged the
  previous round. Replicas rely on this to confirm content (`replicated_spool`).
- A commit takes two rounds. The first carries the commit proposal; once every peer holds
  it, the primary commits to its own spool (only while its etcd lease is surely alive: a
  frozen or partitioned primary that comes back can't make an append durable) and proposes
  the new fragment again; once every peer has confirmed it, the append is acknowledged and
  readers may see it. So an acknowledged append is confirmed on every replica, and content
  that isn't confirmed was never acknowledged: a new pipeline cuts it from every replica,
  primary included, and an append that failed never surfaces later. A spool that completes
  (rolls, or leaves this broker) is cut the same way first, and an append cut short between
  rounds (its client gone) drops its pipeline: no round runs on it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from pygazette.allocator.request_fence import ResolveError
from pygazette.allocator.session import MemberSession
from pygazette.auth.capability import Capability
from pygazette.auth.client_interceptor import journal_claims_scope
from pygazette.broker.allocation import assignments_advertise, route_value
from pygazette.broker.append_service import AppendAborted, AppendLimits
from pygazette.broker.cluster_resolver import ClusterResolver, Resolution
from pygazette.broker.flow_control import FlowControlUnderflow, MinRatePolicer, throttle
from pygazette.broker.metrics import record_append
from pygazette.broker.peers import Peers, PeerUnavailable
from pygazette.broker.pipeline import Pipeline, PipelineBroken
from pygazette.broker.replica import Replica
from pygazette.broker.replicated_spool import fragments_equal, roll_proposal
from pygazette.keyspace.keyspace import Compare, KeyspaceUnavailable, Put
from pygazette.keyspace.layout import decode_route, desired_replication, routes_equivalent
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import sha1sum_from_digest
from pygazette.protocol.labels import update_registers
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import selector_matches
from pygazette.protocol.validation import journal_spec_flags_allow_write, validate_append_request

log = logging.getLogger(__name__)

# A primary pulses each of its journals this often, and whenever their route changes.
PULSE_INTERVAL_SECONDS = 60.0
PULSE_RETRY_SECONDS = 1.0
# Rounds of roll-forward synchronisation before giving up on a pipeline.
MAX_SYNC_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class ReadThrough:
    """Resolve again once the keyspace reaches `revision` (0: the next change)."""

    revision: int


class ReplicationFailed(Exception):
    pass


def _abandon(acquire: asyncio.Future[Any], lock: asyncio.Lock) -> None:
    """Give up a pending `lock.acquire()`, releasing the lock if it is granted anyway."""

    def release_if_granted(f: asyncio.Future[Any]) -> None:
        if not f.cancelled() and f.exception() is None:
            lock.release()

    if acquire.done():
        release_if_granted(acquire)
    else:
        acquire.cancel()
        acquire.add_done_callback(release_if_granted)


async def acquire_or_invalidated(lock: asyncio.Lock, invalidated: asyncio.Event | None) -> bool:
    """Take `lock`, unless `invalidated` is set first (then return False, not holding it).

    Cancellation-safe: if the caller is cancelled, the lock is not left held.
    """
    if invalidated is None:
        await lock.acquire()
        return True
    if invalidated.is_set():
        return False
    acquire = asyncio.ensure_future(lock.acquire())
    wait = asyncio.ensure_future(invalidated.wait())
    try:
        await asyncio.wait([acquire, wait], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        wait.cancel()
        _abandon(acquire, lock)
        raise
    wait.cancel()
    if not acquire.done() or invalidated.is_set():
        _abandon(acquire, lock)
        return False
    return not acquire.cancelled() and acquire.exception() is None


async def _one_empty_chunk() -> AsyncIterator[pb.AppendRequest]:
    yield pb.AppendRequest()


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
        self.pulse_interval = PULSE_INTERVAL_SECONDS
        self._tasks: set[asyncio.Task[None]] = set()

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

    async def pulse_loop(self, replica: Replica) -> None:
        """Pulse a journal while this broker is its primary (see the module docstring)."""
        request = pb.AppendRequest(
            journal=replica.name,
            do_not_proxy=True,
            suspend=pb.AppendRequest.SUSPEND_NO_RESUME,
        )
        while replica.primary and not replica.stopping:
            invalidated = replica.invalidated
            delay = self.pulse_interval
            try:
                async with asyncio.timeout(self.pulse_interval):
                    resp = await self._run(request, _one_empty_chunk(), pulse=True)
                if resp.status not in (
                    pb.OK,
                    pb.NOT_JOURNAL_PRIMARY_BROKER,
                    pb.NO_JOURNAL_PRIMARY_BROKER,
                    pb.JOURNAL_NOT_FOUND,
                    pb.SUSPENDED,
                ):
                    log.info(
                        "journal pulse failed",
                        extra={"journal": replica.name, "status": pb.Status.Name(resp.status)},
                    )
                    delay = PULSE_RETRY_SECONDS
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not replica.stopping:
                    log.info(
                        "journal pulse failed (will retry)",
                        extra={"journal": replica.name, "error": str(exc)},
                    )
                delay = PULSE_RETRY_SECONDS
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await invalidated.wait()

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

            replica = res.replica
            assert replica is not None
            if not await acquire_or_invalidated(replica.pipeline, res.invalidated):
                continue
            try:
                outcome = await self._as_primary(first, it, res, replica, pulse)
            finally:
                replica.pipeline.release()
            if isinstance(outcome, ReadThrough):
                read_through = outcome.revision or res.header.etcd.revision + 1
                continue
            if not pulse and outcome.status == pb.OK:
                record_append(outcome.commit, started)
            return outcome

    async def _as_primary(
        self,
        first: pb.AppendRequest,
        it: AsyncIterator[pb.AppendRequest],
        res: Resolution,
        replica: Replica,
        pulse: bool,
    ) -> pb.AppendResponse | ReadThrough:
        assert res.spec is not None and replica.rspool is not None
        pln = replica.replication
        if pln is None or not pln.ok or not routes_equivalent(pln.route, res.route):
            if pln is not None:
                await close_replication(replica)
            started = await self._start_pipeline(replica, res)
            if started is not None:
                return started
            pln = replica.replication
            assert pln is not None

        if not assignments_advertise(res.route, res.assignments):
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
        failure = await _first_listing_or_invalidated(replica, res.invalidated)
        if failure is None:
            return ReadThrough(0)
        if failure or (not pulse and (failure := replica.append_refusal())):
            return pb.AppendResponse(
                status=pb.FRAGMENT_STORE_UNHEALTHY, header=res.header, store_health_error=failure
            )
        rs = replica.rspool
        spec = res.spec
        registers = _copy(rs.registers)
        if (
            first.HasField("check_registers")
            and registers.labels
            and not selector_matches(first.check_registers, registers)
        ):
            return pb.AppendResponse(
                status=pb.REGISTER_MISMATCH, header=res.header, registers=registers
            )
        max_offset = max(rs.end, replica.index.end_offset)
        suspend = spec.suspend if spec.HasField("suspend") else pb.JournalSpec.Suspend()
        roll_to = 0
        if rs.end < suspend.offset:
            roll_to = suspend.offset
        elif rs.end != max_offset and first.offset == 0 and journal_spec_flags_allow_write(spec):
            return pb.AppendResponse(status=pb.INDEX_HAS_GREATER_OFFSET, header=res.header)
        elif first.offset and first.offset != max_offset:
            return pb.AppendResponse(status=pb.WRONG_APPEND_OFFSET, header=res.header)
        elif first.offset and rs.end != max_offset:
            roll_to = max_offset
        if first.suspend == pb.AppendRequest.SUSPEND_NO_RESUME and suspend.level != 0:
            return pb.AppendResponse(status=pb.SUSPENDED, header=res.header)
        if first.suspend == pb.AppendRequest.SUSPEND_RESUME and suspend.level != 0:
            return ReadThrough(await self._update_suspend(res, pb.JournalSpec.Suspend.NONE, rs.end))
        if first.suspend in (pb.AppendRequest.SUSPEND_IF_FLUSHED, pb.AppendRequest.SUSPEND_NOW):
            return pb.AppendResponse(status=pb.NOT_ALLOWED, header=res.header)
        if not roll_to and rs.end > rs.begin and rs.begin == replica.index.begin_offset:
            # The spool holds the journal's first known write: roll it, so the store shows
            # that writes happened (Gazette's guard against reusing offsets).
            roll_to = rs.end

        try:
            return await self._stream(first, it, res, replica, pln, registers, roll_to, pulse)
        except PipelineBroken as exc:
            rs.rollback()
            await close_replication(replica, graceful=False)
            raise AppendAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        except AppendAborted:
            raise  # Rolled back on every peer: the pipeline is still in step.
        except BaseException:
            # Cut short otherwise (the client went away or its deadline passed, mid-round):
            # a round may have reached some peers and not others, a cancelled read ends its
            # peer's stream, and our spool may hold a commit no peer confirmed. Never run
            # another round on this pipeline: the next append builds a new one, which cuts
            # what was not confirmed.
            rs.rollback()
            await close_replication(replica, graceful=False)
            raise

    async def _start_pipeline(self, replica: Replica, res: Resolution) -> ReadThrough | None:
        assert replica.rspool is not None and res.spec is not None
        if not await acquire_or_invalidated(replica.spool_lock, res.invalidated):
            return ReadThrough(0)
        rs = replica.rspool
        # Content we hold but never saw confirmed everywhere was never acknowledged (see the
        # module docstring): a new pipeline starts without it.
        if rs.unconfirmed:
            rs.cut_unconfirmed()
        pln = Pipeline(_copy_header(res.header), self.peers)
        try:
            # Roll on a route change: every member starts the next fragment at the same offset.
            roll_to = rs.end if rs.end > rs.begin else 0
            registers = _copy(rs.registers)
            for attempt in range(MAX_SYNC_ROUNDS):
                if attempt:
                    # A peer refused the last round: start over on fresh streams, so that no
                    # peer takes the next proposal as confirming the last one.
                    pln.abort()
                    pln = Pipeline(_copy_header(res.header), self.peers)
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
                        if frag.end == rs.end and frag.begin == frag.end:
                            roll_to = max(roll_to, frag.end)
                            continue
                        raise ReplicationFailed(f"unexpected PROPOSAL_MISMATCH: {frag}")
                    raise ReplicationFailed(f"unexpected status {pb.Status.Name(resp.status)}")
                if read_through:
                    pln.abort()
                    replica.spool_lock.release()
                    return ReadThrough(read_through)
                if not roll_to:
                    break
                log.info(
                    "a peer holds a greater offset; rolling the journal forward",
                    extra={"journal": replica.name, "from": rs.end, "to": roll_to},
                )
            else:
                raise ReplicationFailed("peers did not agree on a fragment")
            # Every member now holds our fragment: confirm it everywhere before anything
            # else. A roll forward passed content only some peer holds (it persists it); the
            # route may change again before any append confirms the offsets we passed
            # (routes wider than the replication take none), and members whose frontier
            # stayed below them would cut back there and write over that content.
            await _round(pln, rs.fragment(), rs.registers)
        except (PipelineBroken, ReplicationFailed, PeerUnavailable, grpc.aio.AioRpcError) as exc:
            pln.abort()
            rs.rollback()
            replica.spool_lock.release()
            raise AppendAborted(
                grpc.StatusCode.UNAVAILABLE, f"replication of {replica.name} failed: {exc}"
            ) from exc
        except BaseException:
            pln.abort()
            replica.spool_lock.release()
            raise
        replica.replication = pln
        _confirmed(replica)
        return None

    async def _stream(
        self,
        first: pb.AppendRequest,
        it: AsyncIterator[pb.AppendRequest],
        res: Resolution,
        replica: Replica,
        pln: Pipeline,
        registers: pb.LabelSet,
        roll_to: int,
        pulse: bool,
    ) -> pb.AppendResponse:
        rs = replica.rspool
        spec = res.spec
        assert rs is not None and spec is not None
        proposal = roll_proposal(
            rs.fragment(), rs.first_append_time, roll_to, spec.fragment, time.time()
        )
        if not fragments_equal(proposal, rs.fragment()):
            await rs.apply_proposal(proposal, registers, primary=True)
            await _round(pln, rs.fragment(), registers)
            _confirmed(replica)

        begin = rs.end
        codec = rs.codec
        policer = MinRatePolicer(self.limits.min_rate)
        limiters = [replica.limiter, self.limits.global_limiter]
        total_chunks = delayed_chunks = 0
        committing = False
        error: AppendAborted | None = None
        status = pb.OK
        may_write = journal_spec_flags_allow_write(spec)

        async def receive() -> pb.AppendRequest | None:
            try:
                async with asyncio.timeout(policer.timeout()):
                    return await anext(it)
            except StopAsyncIteration:
                return None
            except TimeoutError:
                raise FlowControlUnderflow(policer.min_rate) from None

        try:
            while True:
                req = await receive()
                if req is None:
                    if not committing:
                        error = AppendAborted(
                            grpc.StatusCode.ABORTED,
                            "append stream ended without its final empty chunk; "
                            "nothing was appended",
                        )
                    break
                if committing:
                    error = AppendAborted(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "expected end of stream after the empty chunk",
                    )
                    break
                if req.journal or req.HasField("header") or req.offset:
                    error = AppendAborted(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "only the first AppendRequest may carry options; later ones carry content",
                    )
                    break
                content = req.content
                if not content:
                    committing = True
                    continue
                if not may_write:
                    status = pb.NOT_ALLOWED
                    break
                total_chunks += 1
                policer.received(len(content))
                waited = await throttle(limiters, len(content))
                if waited:
                    delayed_chunks += 1
                    policer.excuse(waited)
                delta = rs.delta
                await asyncio.gather(
                    pln.send(pb.ReplicateRequest(content=content, content_delta=delta)),
                    rs.apply_content(content, delta),
                )
        except FlowControlUnderflow as exc:
            error = AppendAborted(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            # The client went away: roll back everywhere before giving up the pipeline.
            await self._roll_back(replica, pln, registers)
            raise

        if rs.delta == 0 and error is None and status == pb.OK and committing:
            if first.HasField("union_registers") or first.HasField("subtract_registers"):
                error = AppendAborted(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "register modification requires non-empty Append",
                )
        if error is not None or status != pb.OK:
            await self._roll_back(replica, pln, registers)
            if error is not None:
                raise error
            return pb.AppendResponse(status=status, header=res.header)

        # Commit: every peer first, then our own spool.
        proposal = rs.next_fragment()
        new_registers = registers
        if rs.delta:
            new_registers = update_registers(
                registers,
                union=first.union_registers if first.HasField("union_registers") else None,
                subtract=first.subtract_registers if first.HasField("subtract_registers") else None,
            )
        end_before = rs.end
        # The append's own SHA-1, which its spool write already computed.
        digest = rs.pending.sha.digest() if rs.pending is not None else hashlib.sha1().digest()
        await _round(pln, proposal, new_registers)  # Every peer holds the append...
        if self.session is not None and not self.session.lease_alive():
            raise PipelineBroken("etcd lease may have expired; refusing to commit")
        local = await rs.apply_proposal(proposal, new_registers, primary=True)
        if local.status != pb.OK:
            raise PipelineBroken(f"own spool refused its commit: {local}")
        if pln.streams and rs.end > end_before:
            await _round(pln, rs.fragment(), new_registers)  # ...and has confirmed it.
        _confirmed(replica)

        commit = pb.Fragment(
            journal=replica.name,
            begin=begin,
            end=begin + (proposal.end - end_before),
            compression_codec=codec,
        )
        commit.sum.CopyFrom(sha1sum_from_digest(digest))
        return pb.AppendResponse(
            status=pb.OK,
            header=res.header,
            commit=commit,
            registers=_copy(rs.registers),
            total_chunks=total_chunks,
            delayed_chunks=delayed_chunks,
        )

    async def _roll_back(self, replica: Replica, pln: Pipeline, registers: pb.LabelSet) -> None:
        rs = replica.rspool
        assert rs is not None
        rs.rollback()
        if not pln.ok:
            return
        try:
            await _round(pln, rs.fragment(), registers)
            _confirmed(replica)
        except PipelineBroken:
            await close_replication(replica, graceful=False)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    # Keyspace updates.
    async def _advertise(self, res: Resolution) -> int:
        """Write the route into every assignment that doesn't advertise it yet."""
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
        if not ops:
            return 0
        try:
            result = await self.keyspace.txn(compares, ops)
        except KeyspaceUnavailable as exc:
            raise AppendAborted(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        return result.revision

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

        async def requests() -> AsyncIterator[pb.AppendRequest]:
            yield forwarded
            async for req in it:
                yield req

        try:
            # Re-signed by this broker for this journal only, as Gazette proxies.
            with journal_claims_scope(Capability.APPEND, first.journal):
                call = stub.Append(requests())
            resp: pb.AppendResponse = await call
        except grpc.aio.AioRpcError as exc:
            raise AppendAborted(exc.code(), exc.details() or "proxied append failed") from exc
        return resp


async def _round(pln: Pipeline, proposal: pb.Fragment, registers: pb.LabelSet) -> None:
    """A round every peer must accept (else the pipeline is broken)."""
    resps = await pln.round(pb.ReplicateRequest(proposal=proposal, registers=_copy(registers)))
    bad = [r for r in resps if r.status != pb.OK]
    if bad:
        pln.broken = f"a peer refused a proposal: {pb.Status.Name(bad[0].status)}"
        raise PipelineBroken(pln.broken)


def _confirmed(replica: Replica) -> None:
    """A round after every peer took our fragment succeeded: all of it is confirmed."""
    rs = replica.rspool
    assert rs is not None
    rs.set_confirmed(rs.end)
    replica.set_readable(rs.end)


async def close_replication(replica: Replica, *, graceful: bool = True) -> None:
    """Close the primary's pipeline, giving the spool back."""
    pln = replica.replication
    if pln is None:
        return
    replica.replication = None
    if graceful and pln.ok:
        await pln.close()
    else:
        pln.abort()
    if replica.rspool is not None:
        replica.rspool.rollback()
    if replica.spool_lock.locked():
        replica.spool_lock.release()


async def _first_listing_or_invalidated(
    replica: Replica, invalidated: asyncio.Event | None
) -> str | None:
    """`replica.await_first_listing()`'s result ("" once listed, else why it can't be), or
    None if the resolution was invalidated first."""
    if replica.index.first_refresh_done.is_set():
        return ""
    listing = asyncio.ensure_future(replica.await_first_listing())
    if invalidated is None:
        return await listing
    inval = asyncio.ensure_future(invalidated.wait())
    try:
        await asyncio.wait([listing, inval], return_when=asyncio.FIRST_COMPLETED)
    finally:
        listing.cancel()
        inval.cancel()
    if listing.done() and not listing.cancelled():
        return listing.result()
    return None


def _copy(ls: pb.LabelSet) -> pb.LabelSet:
    out = pb.LabelSet()
    out.CopyFrom(ls)
    return out


def _copy_header(h: pb.Header) -> pb.Header:
    out = pb.Header()
    out.CopyFrom(h)
    return out
