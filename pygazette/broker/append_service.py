"""The Append RPC: one atomic append, streamed into the journal's spool under its pipeline.

The first request names the journal and the append's preconditions (offset, registers);
each following request carries a content chunk; an empty chunk followed by the end of the
stream commits. Anything else — the stream ending without the empty chunk, the client
falling below the minimum append rate, a broker error — rolls the append back: its bytes
lie past the spool's committed end and are overwritten by the next append.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from pygazette.broker.flow_control import (
    FlowControlUnderflow,
    MinRatePolicer,
    RateLimiter,
    next_policed,
    throttle,
)
from pygazette.broker.fragment.spool import InsufficientStorage, PendingAppend
from pygazette.broker.invalidation import first_listing_or_invalidated
from pygazette.broker.journal_runtime import LocalJournal
from pygazette.broker.metrics import record_append, record_rollback
from pygazette.broker.resolver import Resolver
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import sha1sum_from_digest
from pygazette.protocol.labels import subtract_label_sets, union_label_sets
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import selector_matches
from pygazette.protocol.validation import (
    journal_spec_flags_allow_write,
    validate_append_request,
)

log = logging.getLogger(__name__)

# How a content chunk is written and hashed. Each is written (pwrite), folded into the
# append's SHA-1, which the AppendResponse reports, and folded into a copy of the spool's
# running SHA-1 (the open fragment's sum), which the commit installs.
# - A chunk below _PARALLEL_MIN is cheap: all three happen right here, on the event loop.
# - For a larger one, this task first starts receiving the next request, then hands the
#   running sum to a worker thread and writes and hashes the chunk here meanwhile:
#   receiving, writing and both hashes overlap. The acknowledgement waits for the write and
#   the append's hash, not for the running sum: the spool takes over the worker's pending
#   fold and waits for it only before it next reads or extends the sum (Spool.commit),
#   which is when the next append starts, one network round trip later. Measured with
#   bench/append_read.py on its 2-vCPU VM: folding the running sum in after the commit on a
#   background thread that re-read the bytes cost ~10% of 1 MiB append throughput; waiting
#   for it before acknowledging, ~0.3 ms an append. The append's own hash costs no thread
#   hand-offs (waking a worker, then being woken by it, took 0.2-0.5 ms on that VM,
#   against 0.55 ms to hash 1 MiB).
# - Above _INLINE_HASH_MAX, or while other appends stream large chunks too, the hash goes to
#   a worker as well: the event loop must not stall long, and concurrent appends then hash
#   in parallel.
_PARALLEL_MIN = 128 * 1024
_INLINE_HASH_MAX = 1 << 20
_big_appends = 0  # Appends of this process now streaming chunks of at least _PARALLEL_MIN.
# The suspend modes of an append asking to suspend its journal (`journals suspend`).
SUSPENDING = (pb.AppendRequest.SUSPEND_IF_FLUSHED, pb.AppendRequest.SUSPEND_NOW)
# Folds large chunks into running sums. Two threads: appends to different journals fold in
# parallel; chunks of one append are folded one after the other (each waits for the last).
_SUMMER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pygazette-running-sum")


async def _settle(*futures: asyncio.Future[None] | None, check: bool = True) -> None:
    """Wait for every future (none may outlive the append); then, with `check`, raise the
    first one's error."""
    live: list[asyncio.Future[None]] = [f for f in futures if f is not None]
    if not all(f.done() for f in live):
        await asyncio.wait(live)
    for f in live:
        if check:
            f.result()
        elif not f.cancelled():
            f.exception()  # Retrieved: the append failed already.


def _wrap(future: Future[None] | None) -> asyncio.Future[None] | None:
    return None if future is None else asyncio.wrap_future(future)


def _write_and_sum(pending: PendingAppend, running: hashlib._Hash, content: bytes, at: int) -> None:
    """Write a chunk at `at` bytes into the append and fold it into the running sum."""
    pending.write_at(content, at)
    running.update(content)


@dataclass(slots=True)
class AppendLimits:
    min_rate: int  # Bytes/s a client must sustain while it holds a pipeline.
    max_append_rate: int  # Caps each journal's max_append_rate (0: no cap), as Gazette's.


class AppendAborted(Exception):
    """The append was rolled back; carries the gRPC status to fail the RPC with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def chunk_error(req: pb.AppendRequest, committing: bool) -> AppendAborted | None:
    """Why `req`, a request after an append's first, is refused (None if it isn't), in
    Gazette's words (appendFSM.onStreamContent): each is validated, carries content alone
    (an empty one commits), and only the end of the stream may follow the commit."""
    if (
        req.journal
        or req.offset
        or req.suspend
        or req.do_not_proxy
        or req.HasField("header")
        or req.HasField("check_registers")
        or req.HasField("union_registers")
        or req.HasField("subtract_registers")
    ):
        try:
            validate_append_request(req, first=bool(req.journal))
        except ValidationError as exc:
            return AppendAborted(grpc.StatusCode.INVALID_ARGUMENT, f"append stream: {exc}")
        return AppendAborted(
            grpc.StatusCode.INVALID_ARGUMENT, "append stream: expected Content chunk"
        )
    if committing:
        return AppendAborted(
            grpc.StatusCode.INVALID_ARGUMENT,
            "append stream: expected EOF after empty Content chunk",
        )
    return None


async def answer_append(
    serving: Awaitable[pb.AppendResponse], context: grpc.aio.ServicerContext[Any, Any]
) -> pb.AppendResponse:
    """The response of an append being served, or the RPC failed with its status: the
    status an `AppendAborted` carries, or RESOURCE_EXHAUSTED for a full spool disk (the
    append was rolled back whole, see fragment/spool.py)."""
    try:
        return await serving
    except AppendAborted as exc:
        await context.abort(exc.code, str(exc))
        raise  # Not reached: abort raises.
    except InsufficientStorage as exc:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        raise  # Not reached: abort raises.


async def serve_append(
    requests: AsyncIterator[pb.AppendRequest],
    resolver: Resolver,
    limits: AppendLimits,
) -> pb.AppendResponse:
    started = time.monotonic()
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

    while True:
        replica = resolver.resolve(first.journal)
        if replica is None:
            return pb.AppendResponse(
                status=pb.JOURNAL_NOT_FOUND, header=resolver.header(routed=False)
            )
        invalidated = replica.invalidated  # Set when the replica stops.
        header = resolver.header()
        if replica.spec.replication > len(header.route.members):
            return pb.AppendResponse(status=pb.INSUFFICIENT_JOURNAL_BROKERS, header=header)
        # Refused while the journal's store fails and its spools piled up, or can't be
        # listed. The wait for the first listing ends if the replica stops meanwhile (no
        # listing of it comes then): the journal was deleted (or created again), or the
        # broker is shutting down.
        refusal = replica.append_refusal() or await first_listing_or_invalidated(
            replica, invalidated
        )
        if refusal is not None:
            break
        if not resolver.serving:
            raise AppendAborted(grpc.StatusCode.UNAVAILABLE, "this broker is shutting down")
    if refusal:
        return pb.AppendResponse(
            status=pb.FRAGMENT_STORE_UNHEALTHY, header=header, store_health_error=refusal
        )

    async with replica.pipeline:
        writable = journal_spec_flags_allow_write(replica.spec)
        resp = await _append_locked(first, it, replica, resolver.header(), limits, writable)
    if resp.status == pb.OK:
        record_append(resp.commit, started)
    return resp


async def _append_locked(
    first: pb.AppendRequest,
    it: AsyncIterator[pb.AppendRequest],
    journal: LocalJournal,
    header: pb.Header,
    limits: AppendLimits,
    writable: bool,
) -> pb.AppendResponse:
    refused = _precondition_failure(first, journal, header, writable)
    if refused is not None:
        return refused
    spool, pending, running = journal.start_append()
    received = await _receive_content(
        it,
        pending,
        running,
        MinRatePolicer(limits.min_rate),
        [journal.limiter.capped(limits.max_append_rate)],
        # As Gazette's: a journal that isn't writable takes empty appends alone (barriers),
        # and an append asking to suspend its journal carries no content. (A lone broker's
        # journal has no replicas to give up: an empty one is answered OK.)
        refuse_content=not writable or first.suspend in SUSPENDING,
    )
    if received.refused:
        journal.drop_empty_append(spool)
        return pb.AppendResponse(status=pb.NOT_ALLOWED, header=header)
    commit = pb.Fragment(
        journal=journal.name,
        begin=pending.begin,
        end=pending.begin + pending.length,
        sum=sha1sum_from_digest(pending.sha.digest()),
        compression_codec=spool.codec,
    )
    if pending.length:
        # Subtract, then union, in Gazette's order (they differ when both name a label).
        registers = pb.LabelSet()
        registers.CopyFrom(journal.registers)
        if first.HasField("subtract_registers"):
            registers = subtract_label_sets(registers, first.subtract_registers)
        if first.HasField("union_registers"):
            registers = union_label_sets(first.union_registers, registers)
        await journal.commit_append(spool, pending, running, received.summing, registers)
    else:
        journal.drop_empty_append(spool)
        if first.HasField("union_registers") or first.HasField("subtract_registers"):
            raise AppendAborted(
                grpc.StatusCode.INVALID_ARGUMENT,
                "append stream: register modification requires non-empty Append",
            )
    return pb.AppendResponse(
        status=pb.OK,
        header=header,
        commit=commit,
        registers=journal.registers,
        total_chunks=received.total_chunks,
        delayed_chunks=received.delayed_chunks,
    )


def _precondition_failure(
    first: pb.AppendRequest, journal: LocalJournal, header: pb.Header, writable: bool
) -> pb.AppendResponse | None:
    """The response refusing the append, or None if it may go ahead."""
    # As Gazette: a journal without registers passes any check (nothing has claimed it yet).
    registers = journal.registers
    if (
        first.HasField("check_registers")
        and registers.labels
        and not selector_matches(first.check_registers, registers)
    ):
        return pb.AppendResponse(status=pb.REGISTER_MISMATCH, header=header, registers=registers)
    # Persisted fragments beyond what this broker spooled mean replication consistency
    # was lost; the client may roll the journal forward by appending at that offset. (Not
    # for a journal that isn't writable, as Gazette's: its empty appends write nothing.)
    if first.offset and first.offset != journal.head:
        return pb.AppendResponse(status=pb.WRONG_APPEND_OFFSET, header=header)
    index = journal.index
    if (
        journal.spool is not None
        and index.persisted_end > index.local_end
        and not first.offset
        and writable
    ):
        return pb.AppendResponse(status=pb.INDEX_HAS_GREATER_OFFSET, header=header)
    return None


@dataclass(slots=True)
class _Received:
    total_chunks: int
    delayed_chunks: int
    summing: Future[None] | None  # The running sum's fold of the last chunk, if pending.
    refused: bool = False  # It carried content, which was refused (`refuse_content`).


async def _receive_content(
    it: AsyncIterator[pb.AppendRequest],
    pending: PendingAppend,
    running: hashlib._Hash,
    policer: MinRatePolicer,
    limiters: list[RateLimiter],
    refuse_content: bool = False,
) -> _Received:
    """Stream the append's chunks into `pending` (and `running`) up to its commit chunk and
    the end of the stream; on any failure, the append is rolled back (its bytes lie past
    the spool's committed end) and the error raised."""
    loop = asyncio.get_running_loop()
    total_chunks = delayed_chunks = 0
    # A large chunk's work on worker threads: its write, and its hash when not done here.
    # And the next request, received meanwhile.
    writing: asyncio.Future[None] | None = None
    hashing: asyncio.Future[None] | None = None
    summing: Future[None] | None = None  # The running sum's fold of the last chunk.
    ahead: asyncio.Task[pb.AppendRequest | None] | None = None
    big = False

    async def receive() -> pb.AppendRequest | None:
        return await next_policed(it, policer)

    global _big_appends
    try:
        req = await receive()
        while True:
            if req is None:
                raise AppendAborted(
                    grpc.StatusCode.ABORTED,
                    "append stream ended without its final empty chunk; nothing was appended",
                )
            error = chunk_error(req, False)
            if error is not None:
                raise error
            content = req.content  # Each read of a bytes field copies it: read it once.
            size = len(content)
            if not size:
                total_chunks += 1  # Gazette counts the commit chunk too.
                break
            if refuse_content:
                return _Received(total_chunks, delayed_chunks, None, refused=True)
            total_chunks += 1
            policer.received(size)
            waited = await throttle(limiters, size)
            if waited:
                delayed_chunks += 1
                policer.excuse(waited)
            # The previous chunk's work finishes first: hashes take chunks in order.
            await _settle(writing, hashing, _wrap(summing))
            writing = hashing = summing = None
            if size < _PARALLEL_MIN:
                pending.write(content)
                running.update(content)
                req = await receive()
                continue

            if not big:
                big = True
                _big_appends += 1
            ahead = asyncio.ensure_future(receive())
            await asyncio.sleep(0)  # Let `ahead` ask gRPC for the next request first.
            at = pending.length
            pending.advance(size)
            if size <= _INLINE_HASH_MAX and _big_appends == 1:
                summing = _SUMMER.submit(running.update, content)
                pending.write_at(content, at)
                pending.hash(content)
            else:
                writing = loop.run_in_executor(None, _write_and_sum, pending, running, content, at)
                hashing = loop.run_in_executor(None, pending.hash, content)
            req = await ahead
            ahead = None
        await _settle(writing, hashing)
        writing = hashing = None
        if (req := await receive()) is not None:
            error = chunk_error(req, True)
            assert error is not None  # Only the end of the stream may follow the commit.
            raise error
    except FlowControlUnderflow as exc:
        record_rollback(pending.length)
        raise AppendAborted(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from exc
    except BaseException:
        record_rollback(pending.length)
        raise
    finally:
        if big:
            _big_appends -= 1
        if ahead is not None:
            if not ahead.done():
                ahead.cancel()
            elif not ahead.cancelled():
                ahead.exception()  # Retrieved: the append already failed for another reason.
        # On a rollback too: no write of this append may land after the next append's.
        # (A fold into `running`, a copy of the spool's sum, may go on: a rolled-back
        # append drops it, a committed one hands it to the spool.)
        await _settle(writing, hashing, check=False)
    return _Received(total_chunks, delayed_chunks, summing)
