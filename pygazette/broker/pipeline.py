"""A primary's replication pipeline: one Replicate stream to each peer of a route, pipelined.

Requests go out to every peer in one order (writes are serialised). A request that asks for
an acknowledgement opens a *round*; one reader per peer stream pairs that peer's responses
with the open rounds in order (a replica answers in the order it was asked). So several
rounds may be in flight at once, as in Gazette's pipeline: the next append's content and
commit follow the previous commit while its acknowledgements are still on their way, and
rounds complete in the order they were sent.

Confirmation. Each replica keeps a *confirmed* frontier (`replicated_spool`): content below
it is held by every member of the route, and a new pipeline cuts what lies above it. The
primary moves it explicitly: once every peer acknowledged the commits up to an offset, it
sends a proposal of the fragment it committed there carrying the pipeline's Header again
(otherwise only a stream's first request carries one). Replicas take that as "confirmed up
to the proposal's end" and change nothing else (content streamed for the next append stays
pending). One confirmation covers every commit below its end, so they coalesce; when every
peer has acknowledged one, `on_confirmed` tells the primary's own spool. On a route of two
(the primary and one peer) a commit confirms itself (`propose_confirmed_commit`): the
primary commits to its own spool first, then sends the commit with the Header; the peer,
once it commits it, holds what every member holds, takes it as confirmed, and its
acknowledgement is the confirmation's: a round trip and two messages fewer per append. A
confirmation goes out only while `may_confirm()` (the primary's etcd lease is surely
alive): a frozen primary that comes back can make nothing durable. `confirm_sent` is the
greatest offset a confirmation (or self-confirming commit) went out for: when a pipeline
ends with it above `confirmed`, some peer may hold the content up to it as confirmed, so
the primary keeps that content in doubt (`ReplicatedSpool.in_doubt`, noted by
`Replica.close_replication`): a new pipeline never cuts below a confirmation this broker
sent.

Any send or receive error, a response breaking Gazette's rules (counted in
`pygazette_broker_invalid_responses_total`), a refused commit round, or a round unanswered for
ACK_TIMEOUT_SECONDS breaks the pipeline: every open round fails, the streams are dropped, and
the next append builds a new one (and re-synchronises the route). A pipeline older than
MAX_AGE_SECONDS is closed gracefully and replaced the same way (`aged`) before a peer would
end its streams for their expired tokens (`auth.server_interceptor`).

Cost per request. Each peer stream has one writer task fed by a queue: sending a request
queues it for every peer (in the same order everywhere) and returns; the sender waits only
while a peer has more than MAX_QUEUED_BYTES of content queued. So no task is created per
request, and an append's next chunk or commit follows its content without waiting for gRPC
to take it. A small append's content waits in the queue for its commit (DEFER_CONTENT_BYTES),
and both leave in one write. One watchdog timer per pipeline, not a timeout per wait, fails
a round that is unanswered for too long. And a confirmation goes out as soon as the commits
it covers are acknowledged (from the reader that completes them), unless one already in
flight covers them: they coalesce, as they would when each append's waiter asked for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from pygazette.auth.authorizer import DEFAULT_TOKEN_TTL
from pygazette.broker.metrics import INVALID_RESPONSES
from pygazette.broker.peers import Peers, PeerUnavailable
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.stream_write import send
from pygazette.protocol.validation import validate_replicate_response

log = logging.getLogger(__name__)

_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]

# A peer must answer a proposal within this long, or the pipeline is broken.
ACK_TIMEOUT_SECONDS = 30.0
# A pipeline this old is replaced by a new one before its next append: its streams' tokens
# (signed at most half their lifetime before) expire, and a peer then ends them.
MAX_AGE_SECONDS = DEFAULT_TOKEN_TTL / 4
# Content queued for one peer beyond which a sender waits (until it is down to half).
MAX_QUEUED_BYTES = 8 << 20
# Content below this much, queued for a peer, is written only once a request asking for an
# answer follows it (an append's commit, or its rollback) or the pipeline closes: the
# content then goes out with it, gRPC buffering the content's write (`send`'s `buffered`)
# so that both leave in one write, and the peer reads both at once. A small append's
# content is of no use to a replica before its commit anyway.
DEFER_CONTENT_BYTES = 128 << 10


class PipelineBroken(Exception):
    """A peer's stream failed (or refused a round); the pipeline can't be used any more."""


@dataclass(slots=True, eq=False)
class PeerStream:
    index: int  # In the route's members.
    member: pb.ProcessSpec.ID
    call: Any  # grpc.aio.StreamStreamCall[ReplicateRequest, ReplicateResponse]
    header: pb.Header  # The pipeline's Header, as this peer gets it.
    answered: int = 0  # Rounds this peer has answered (since the pipeline opened).
    # Requests for the writer, with their content sizes (None: half-close the stream).
    queue: deque[tuple[pb.ReplicateRequest | None, int]] = field(default_factory=deque)
    queued: int = 0  # Content bytes queued.
    wakeup: asyncio.Future[None] | None = None  # The idle writer waits on it.

    def put(self, req: pb.ReplicateRequest | None, size: int, wake: bool = True) -> None:
        self.queue.append((req, size))
        self.queued += size
        w = self.wakeup
        if w is not None and (wake or self.queued > DEFER_CONTENT_BYTES):
            self.wakeup = None
            if not w.done():
                w.set_result(None)


@dataclass(slots=True, eq=False)
class Round:
    """An acknowledged request in flight: one response from each peer, in route order."""

    future: asyncio.Future[list[pb.ReplicateResponse]]
    responses: list[pb.ReplicateResponse | None]
    remaining: int
    must_be_ok: bool  # A refusal breaks the pipeline (a commit or a confirmation).
    confirms: int = -1  # A confirmation's offset.
    commit: tuple[pb.Fragment, pb.LabelSet] | None = None  # A commit's proposal.
    # A commit's proposal is acknowledged (may be confirmed) only once every peer answered
    # *and* the primary committed it to its own spool (`committed_locally`).
    local: bool = False
    deadline: float = 0.0  # Loop time by which every peer must have answered.


def _retrieve(f: asyncio.Future[Any]) -> None:
    """Take a finished future's error, so that one nobody awaited isn't reported as lost."""
    if not f.cancelled():
        f.exception()


class Pipeline:
    def __init__(
        self,
        header: pb.Header,
        peers: Peers,
        *,
        may_confirm: Callable[[], bool] = lambda: True,
        on_confirmed: Callable[[int], None] = lambda _offset: None,
    ) -> None:
        self.header = header
        self.route = header.route
        self.peers = peers
        self.may_confirm = may_confirm
        self.on_confirmed = on_confirmed
        self.streams: list[PeerStream] = []
        self.broken: str = ""
        self._first = True
        self._loop = asyncio.get_running_loop()
        self.opened_at = self._loop.time()
        self.used_at = self.opened_at  # When its last round began.
        self._rounds: deque[Round] = deque()  # Open rounds, oldest first.
        self._base = 0  # Rounds completed (the sequence number of `_rounds[0]`).
        self._readers: list[asyncio.Task[None]] = []
        self._writers: list[asyncio.Task[None]] = []
        self._drained: asyncio.Event | None = None  # Senders wait on it for the queues.
        self._watchdog: asyncio.TimerHandle | None = None  # Fails an unanswered round.
        self._closing = False
        # The last commit every peer acknowledged, and the confirmations sent.
        self._acked: tuple[pb.Fragment, pb.LabelSet] | None = None
        self._confirmations: deque[Round] = deque()
        self.confirmed = -1  # The greatest offset every peer acknowledged as confirmed.
        # The greatest offset a confirmation went out for (to some peers, at least): below
        # it, a failed pipeline leaves content whose fate is unknown (a peer that took the
        # confirmation keeps it, and may be the one the journal continues from).
        self.confirm_sent = -1
        # Done when the last append to take `barrier()` has been answered.
        self._answered: asyncio.Future[None] | None = None

    @property
    def ok(self) -> bool:
        return not self.broken

    def aged(self) -> bool:
        """Whether it is due for replacement (MAX_AGE_SECONDS)."""
        return self._loop.time() - self.opened_at > MAX_AGE_SECONDS

    def idle_seconds(self) -> float:
        """How long since its last round began (0 while a round is open)."""
        if self._rounds:
            return 0.0
        return self._loop.time() - self.used_at

    @property
    def in_flight(self) -> int:
        """Rounds sent but not yet answered by every peer."""
        return len(self._rounds)

    async def open(self) -> None:
        route = self.route
        for i, member in enumerate(route.members):
            if i == route.primary:
                continue
            endpoint = route.endpoints[i] if i < len(route.endpoints) else ""
            try:
                stub = self.peers.stub(endpoint)
            except PeerUnavailable as exc:
                self.broken = str(exc)
                raise PipelineBroken(self.broken) from exc
            call = stub.Replicate(wait_for_ready=False)
            header = pb.Header()
            header.CopyFrom(self.header)
            header.process_id.CopyFrom(member)
            self.streams.append(PeerStream(i, member, call, header))
        for k, stream in enumerate(self.streams):
            task = asyncio.create_task(self._read_loop(k, stream), name="replicate-acks")
            self._readers.append(task)
            task = asyncio.create_task(self._write_loop(stream), name="replicate-writes")
            self._writers.append(task)

    # Sending.
    def _request_for(self, req: pb.ReplicateRequest, peer: PeerStream) -> pb.ReplicateRequest:
        if not req.HasField("header"):
            return req
        out = pb.ReplicateRequest()
        out.CopyFrom(req)
        out.header.CopyFrom(peer.header)
        return out

    def _enqueue(self, req: pb.ReplicateRequest, rnd: Round | None, size: int = 0) -> None:
        """Queue `req` for every peer's writer (at once: in one order on every stream)."""
        if self.broken:
            raise PipelineBroken(self.broken)
        if self._closing:
            raise PipelineBroken("pipeline is closing")
        if self._first and req.HasField("proposal"):
            req.header.CopyFrom(self.header)
            req.deprecated_journal = req.proposal.journal
            self._first = False
        if rnd is not None:
            if not self.streams:
                self._complete(rnd)
                return
            rnd.deadline = self._loop.time() + ACK_TIMEOUT_SECONDS
            self._rounds.append(rnd)
            if self._watchdog is None:
                self._arm_watchdog()
        # Content with no answer due (a `send`, below DEFER_CONTENT_BYTES queued) waits for
        # the next request that is: see DEFER_CONTENT_BYTES.
        wake = rnd is not None or not size
        for s in self.streams:
            s.put(self._request_for(req, s), size, wake)

    def _backlogged(self) -> bool:
        return any(s.queued > MAX_QUEUED_BYTES for s in self.streams)

    async def send(self, req: pb.ReplicateRequest, size: int = 0) -> None:
        """Send to every peer, asking for no acknowledgement (content of `size` bytes).

        Returns once it is queued for every peer: it waits only while a peer's queue holds
        more than MAX_QUEUED_BYTES of content."""
        while size and self._backlogged() and not self.broken:
            drained = self._drained
            if drained is None:
                drained = self._drained = asyncio.Event()
            await drained.wait()
        self._enqueue(req, None, size)

    async def _write_loop(self, s: PeerStream) -> None:
        """The one writer of a peer's stream: writes its queued requests in order."""
        queue, call = s.queue, s.call
        try:
            while True:
                if not queue:
                    wakeup = s.wakeup = self._loop.create_future()
                    await wakeup
                    continue
                req, size = queue.popleft()
                if req is None:
                    await call.done_writing()
                    return
                # With a request behind it, gRPC may hold this one back to send both at once.
                await send(call, req, buffered=bool(queue))
                if size:
                    s.queued -= size
                    if self._drained is not None and s.queued <= MAX_QUEUED_BYTES // 2:
                        self._wake_senders()
        except asyncio.CancelledError:
            self.fail("pipeline aborted")
        except Exception as exc:
            status = await _call_status(call, exc)
            self.fail(_why(s, status), expected=_handed_off(status))

    def _wake_senders(self) -> None:
        drained = self._drained
        if drained is not None and (self.broken or not self._backlogged()):
            self._drained = None
            drained.set()

    # Acknowledgement deadlines.
    def _arm_watchdog(self) -> None:
        if self._rounds and not self.broken:
            self._watchdog = self._loop.call_at(self._rounds[0].deadline, self._check_deadline)

    def _check_deadline(self) -> None:
        self._watchdog = None
        rounds = self._rounds
        if rounds and rounds[0].deadline <= self._loop.time():
            self.fail(f"no acknowledgement within {ACK_TIMEOUT_SECONDS:.0f}s")
            return
        self._arm_watchdog()

    async def propose(
        self,
        req: pb.ReplicateRequest,
        *,
        must_be_ok: bool = True,
        commit: bool = False,
    ) -> Round:
        """Send a proposal every peer must acknowledge; returns its round (see `wait`).

        With `commit`, it is a commit of the proposal, which later confirmations may cover.
        The first proposal of a pipeline gets its Header.
        """
        req.acknowledge = True
        rnd = self._new_round(must_be_ok)
        if commit:
            rnd.commit = (req.proposal, req.registers)
        self._enqueue(req, rnd)
        return rnd

    async def round(self, req: pb.ReplicateRequest) -> list[pb.ReplicateResponse]:
        """Send a proposal and gather every peer's answer (whatever it is)."""
        return await self.wait(await self.propose(req, must_be_ok=False))

    async def wait(self, rnd: Round) -> list[pb.ReplicateResponse]:
        """The round's responses (in route order, peers only), once every peer answered
        (or the pipeline broke: then PipelineBroken)."""
        fut = rnd.future
        if not fut.done():
            # Shielded: a waiter cut short must not cancel the round for other waiters.
            await asyncio.shield(fut)
        return fut.result()

    async def confirm(self, upto: int) -> None:
        """Return once every peer confirmed content up to `upto` (a commit every peer
        acknowledged already, or the end of a synchronised fragment: see `confirm_fragment`)."""
        if self.confirmed >= upto:
            return
        for rnd in self._confirmations:
            if rnd.confirms >= upto:
                break
        else:
            acked = self._acked
            if acked is None or acked[0].end < upto:
                if not self._rounds:
                    raise PipelineBroken(f"offset {upto} is not acknowledged by every peer")
                await self.wait(self._rounds[-1])  # Commits up to `upto` are in flight.
                return await self.confirm(upto)
            rnd = self._send_confirmation(*acked)
        await self.wait(rnd)

    async def confirm_fragment(self, frag: pb.Fragment, registers: pb.LabelSet) -> None:
        """Confirm everything up to `frag` (a fragment every peer holds, after a round)."""
        if self.confirmed >= frag.end and self.confirmed >= 0:
            return
        await self.wait(self._send_confirmation(frag, registers))

    def _send_confirmation(self, frag: pb.Fragment, registers: pb.LabelSet) -> Round:
        if self.broken:
            raise PipelineBroken(self.broken)
        if self._closing:
            # Checked before the round is registered: one registered but never sent would
            # leave later confirmations waiting on it.
            raise PipelineBroken("pipeline is closing")
        if not self.may_confirm():
            self.fail("etcd lease may have expired; refusing to confirm")
            raise PipelineBroken(self.broken)
        rnd = self._new_round(True)
        rnd.confirms = frag.end
        self._confirmations.append(rnd)
        self.confirm_sent = max(self.confirm_sent, frag.end)
        req = pb.ReplicateRequest(proposal=frag, registers=registers, acknowledge=True)
        req.header.CopyFrom(self.header)
        self._enqueue(req, rnd)
        return rnd

    def check_may_confirm(self) -> None:
        """Raise PipelineBroken (breaking it) unless a confirmation may go out now."""
        if self.broken:
            raise PipelineBroken(self.broken)
        if not self.may_confirm():
            self.fail("etcd lease may have expired; refusing to confirm")
            raise PipelineBroken(self.broken)

    @property
    def pair(self) -> bool:
        """Whether the route is the primary and one peer (see `propose_confirmed_commit`)."""
        return len(self.streams) == 1 and len(self.route.members) == 2

    def propose_confirmed_commit(self, req: pb.ReplicateRequest) -> Round:
        """Send a commit that confirms itself (a route of two, `pair`, only): the primary
        committed it to its own spool already, so once the one peer commits it too, every
        member holds it. It carries the pipeline's Header, as a confirmation does; the peer
        commits it and moves its frontier to its end, and its acknowledgement confirms it
        (no separate confirmation round). It counts as a confirmation sent (`confirm_sent`):
        should the pipeline fail before the peer answers, the append is in doubt."""
        if not self.pair:
            raise ValueError("a self-confirming commit needs a route of exactly two members")
        if self.broken:
            raise PipelineBroken(self.broken)
        if self._closing:
            raise PipelineBroken("pipeline is closing")
        self.check_may_confirm()
        req.acknowledge = True
        req.header.CopyFrom(self.header)
        rnd = self._new_round(True)
        rnd.commit = (req.proposal, req.registers)
        rnd.local = True
        rnd.confirms = req.proposal.end
        self._confirmations.append(rnd)
        self.confirm_sent = max(self.confirm_sent, req.proposal.end)
        self._enqueue(req, rnd)
        return rnd

    def committed_locally(self, rnd: Round) -> None:
        """The primary committed `rnd`'s proposal to its own spool: once every peer has too,
        it may be confirmed (never before: a confirmation of content the primary then failed
        to commit would leave it on every peer while its client hears of a failure)."""
        rnd.local = True
        fut = rnd.future
        answered = fut.done() and not fut.cancelled() and fut.exception() is None
        if answered and not self.broken and rnd.commit is not None:
            acked = self._acked
            if acked is None or acked[0].end < rnd.commit[0].end:
                self._acked = rnd.commit
                self._confirm_acked()

    def _confirm_acked(self) -> None:
        """Confirm the last acknowledged commit now, unless a confirmation already in flight
        (or done) covers it (called as commits complete: see the module docstring)."""
        acked = self._acked
        if acked is None or self._closing or self.broken:
            return
        end = acked[0].end
        if self.confirmed >= end:
            return
        confirmations = self._confirmations
        if confirmations and confirmations[-1].confirms >= end:
            return
        with contextlib.suppress(PipelineBroken):
            self._send_confirmation(*acked)

    def _new_round(self, must_be_ok: bool) -> Round:
        self.used_at = self._loop.time()
        fut: asyncio.Future[list[pb.ReplicateResponse]] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieve)
        n = len(self.streams)
        return Round(fut, [None] * n, n, must_be_ok)

    def barrier(self) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """Take a place in the order appends are answered in (as Gazette's read barrier):
        wait for the first future (the previous append's), answer, then set the second."""
        previous = self._answered
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._answered = mine
        return previous, mine

    # Receiving.
    async def _read_loop(self, k: int, stream: PeerStream) -> None:
        try:
            while True:
                resp = await stream.call.read()
                if resp is _EOF:
                    if self._closing and not self._rounds:
                        return
                    raise PipelineBroken(f"peer {_pid(stream.member)} closed its stream")
                assert isinstance(resp, pb.ReplicateResponse)
                try:
                    validate_replicate_response(resp)
                except ValidationError as err:
                    INVALID_RESPONSES.labels("Replicate").inc()
                    raise PipelineBroken(f"invalid Replicate response: {err}") from None
                self._deliver(k, stream, resp)
        except asyncio.CancelledError:
            self.fail("pipeline aborted")
        except Exception as exc:
            self.fail(_why(stream, exc), expected=_handed_off(exc))

    def _deliver(self, k: int, stream: PeerStream, resp: pb.ReplicateResponse) -> None:
        i = stream.answered - self._base
        if i >= len(self._rounds):
            self.fail(f"unexpected response from {_pid(stream.member)}: {resp}")
            return
        rnd = self._rounds[i]
        rnd.responses[k] = resp
        rnd.remaining -= 1
        stream.answered += 1
        # Each peer answers in order, so rounds complete in order too.
        acked = self._acked
        while self._rounds and self._rounds[0].remaining == 0:
            self._base += 1
            self._complete(self._rounds.popleft())
            if self.broken:
                return
        if self._acked is not acked:
            self._confirm_acked()

    def _complete(self, rnd: Round) -> None:
        resps = [r for r in rnd.responses if r is not None]
        if rnd.must_be_ok:
            bad = [r for r in resps if r.status != pb.OK]
            if bad:
                self.fail(f"a peer refused a proposal: {pb.Status.Name(bad[0].status)}")
                if not rnd.future.done():
                    rnd.future.set_exception(PipelineBroken(self.broken))
                return
        if rnd.commit is not None and rnd.local:
            self._acked = rnd.commit
        if rnd.confirms >= 0:
            while self._confirmations and self._confirmations[0] is not rnd:
                self._confirmations.popleft()
            if self._confirmations:
                self._confirmations.popleft()
            if rnd.confirms > self.confirmed:
                self.confirmed = rnd.confirms
                self.on_confirmed(rnd.confirms)
        if not rnd.future.done():
            rnd.future.set_result(resps)

    # Failure and shutdown.
    def fail(self, why: str, *, expected: bool = False) -> None:
        """Break the pipeline: fail every open round and drop the streams. `expected`: a
        peer let go of the journal (a hand-off), which is logged at info, not as a warning."""
        if not self.broken:
            self.broken = why
            log.log(
                logging.INFO if expected else logging.WARNING,
                "replication pipeline broken",
                extra={"error": why},
            )
        rounds, self._rounds = self._rounds, deque()
        rounds.extend(self._confirmations)  # Normally among the rounds already.
        self._confirmations.clear()
        for rnd in rounds:
            if not rnd.future.done():
                rnd.future.set_exception(PipelineBroken(self.broken))
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        streams, self.streams = self.streams, []
        for s in streams:
            s.call.cancel()
            s.queue.clear()
            s.queued = 0
        self._wake_senders()
        current = asyncio.current_task()
        for task in self._readers:
            if task is not current:
                task.cancel()
        for task in self._writers:
            if task is not current:
                task.cancel()

    async def close(self) -> None:
        """Half-close every stream once its open rounds are answered, and wait (briefly)
        for the peers to end theirs."""
        if self.broken:
            self.fail(self.broken)
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5.0):
                while self._rounds and not self.broken:
                    await self.wait(self._rounds[-1])
        self._closing = True
        for s in self.streams:
            s.put(None, 0)  # Its writer half-closes the stream after what is queued.
        tasks = [*self._writers, *self._readers]
        if tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await asyncio.wait(tasks)
        if not self.broken:
            self.broken = "pipeline closed"
        self.fail(self.broken)

    def abort(self) -> None:
        """Drop every stream at once (no goodbyes)."""
        self.fail(self.broken or "pipeline aborted")


async def _call_status(call: Any, exc: BaseException) -> BaseException:
    """Why a write to `call` failed: a write to a stream the peer already ended fails
    (`CallEnded`), while the call's own status says why the peer ended it (e.g. its disk is
    full). That status, if it comes within a moment and says more; else `exc`."""
    try:
        async with asyncio.timeout(1.0):
            code = await call.code()
            details = await call.details()
    except Exception:
        return exc
    if code in (grpc.StatusCode.OK, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED):
        return exc
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


# How a pygazette peer ends a Replicate stream when the journal's route changed under it, or
# its replica is stopping (a hand-off; the broker leaving): expected, logged quietly.
STALE_STREAM = "the journal's route changed; stream is stale"
REPLICA_STOPPING = "replica is stopping"


def _handed_off(exc: BaseException) -> bool:
    """Whether a peer ended its stream because the journal is being handed off."""
    if not isinstance(exc, grpc.aio.AioRpcError):
        return False
    code, details = exc.code(), exc.details()
    return (code == grpc.StatusCode.ABORTED and details == STALE_STREAM) or (
        code == grpc.StatusCode.UNAVAILABLE and details == REPLICA_STOPPING
    )


def _why(stream: PeerStream, exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        why = f"{exc.code().name}: {exc.details()}"
    else:
        why = str(exc) or type(exc).__name__
    return f"replication to {_pid(stream.member)} failed: {why}"


def _pid(member: pb.ProcessSpec.ID) -> str:
    return f"{member.zone}#{member.suffix}"
