"""The Append RPC: one atomic append, streamed into the journal's spool under its pipeline.

The first request names the journal and the append's preconditions (offset, registers);
each following request carries a content chunk; an empty chunk followed by the end of the
stream commits. Anything else — the stream ending without the empty chunk, the client
falling below the minimum append rate, a broker error — rolls the append back: its bytes
lie past the spool's committed end and are overwritten by the next append.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from pygazette.broker.flow_control import (
    FlowControlUnderflow,
    MinRatePolicer,
    RateLimiter,
    throttle,
)
from pygazette.broker.replica import Replica
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

# Chunks at least this large are written and hashed on a worker thread, overlapping the
# receipt of the next chunk; smaller ones are cheaper to handle inline.
_THREAD_CHUNK = 128 * 1024
import os as _os  # noqa: E402

_MODE = _os.environ.get("PGZ_MODE", "")


async def _settle(inflight: list[asyncio.Future[None]]) -> None:
    """Wait for every future (so none outlives the append), then raise the first error."""
    for fut in inflight:
        await asyncio.wait([fut])
    for fut in inflight:
        fut.result()
    inflight.clear()


@dataclass(slots=True)
class AppendLimits:
    min_rate: int  # Bytes/s a client must sustain while it holds a pipeline.
    global_limiter: RateLimiter  # The broker-wide maximum append rate.


class AppendAborted(Exception):
    """The append was rolled back; carries the gRPC status to fail the RPC with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


async def serve_append(
    requests: AsyncIterator[pb.AppendRequest],
    resolver: Resolver,
    limits: AppendLimits,
) -> pb.AppendResponse:
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

    replica = resolver.resolve(first.journal)
    if replica is None:
        return pb.AppendResponse(status=pb.JOURNAL_NOT_FOUND, header=resolver.header(routed=False))
    header = resolver.header()
    if not journal_spec_flags_allow_write(replica.spec):
        return pb.AppendResponse(status=pb.NOT_ALLOWED, header=header)
    if replica.spec.replication > len(header.route.members):
        return pb.AppendResponse(status=pb.INSUFFICIENT_JOURNAL_BROKERS, header=header)
    # Refused while the journal's store fails and its spools piled up, or can't be listed.
    if refusal := replica.append_refusal() or await replica.await_first_listing():
        return pb.AppendResponse(
            status=pb.FRAGMENT_STORE_UNHEALTHY, header=header, store_health_error=refusal
        )

    async with replica.pipeline:
        await replica.index.first_refresh_done.wait()
        return await _append_locked(first, it, replica, resolver, limits)


async def _append_locked(
    first: pb.AppendRequest,
    it: AsyncIterator[pb.AppendRequest],
    replica: Replica,
    resolver: Resolver,
    limits: AppendLimits,
) -> pb.AppendResponse:
    header = resolver.header()
    # As Gazette: a journal without registers passes any check (nothing has claimed it yet).
    if (
        first.HasField("check_registers")
        and replica.registers.labels
        and not selector_matches(first.check_registers, replica.registers)
    ):
        return pb.AppendResponse(
            status=pb.REGISTER_MISMATCH, header=header, registers=replica.registers
        )

    # Persisted fragments beyond what this broker spooled mean replication consistency
    # was lost; the client may roll the journal forward by appending at that offset.
    persisted_end = max((f.end for f in replica.index.persisted()), default=0)
    local_end = max((s.end for s in replica.index.local_spools()), default=0)
    head = replica.head
    if first.offset and first.offset != head:
        return pb.AppendResponse(status=pb.WRONG_APPEND_OFFSET, header=header)
    if replica.spool is not None and persisted_end > local_end and not first.offset:
        return pb.AppendResponse(status=pb.INDEX_HAS_GREATER_OFFSET, header=header)

    spool = replica.open_spool(head)
    pending = spool.start_append()
    policer = MinRatePolicer(limits.min_rate)
    limiters = [replica.limiter, limits.global_limiter]
    loop = asyncio.get_running_loop()
    # The previous chunk's write and hash, still running on worker threads.
    inflight: list[asyncio.Future[None]] = []
    total_chunks = delayed_chunks = 0

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
                raise AppendAborted(
                    grpc.StatusCode.ABORTED,
                    "append stream ended without its final empty chunk; nothing was appended",
                )
            if req.journal or req.HasField("header") or req.offset:
                raise AppendAborted(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "only the first AppendRequest may carry options; later ones carry content",
                )
            content = req.content  # Each access of a bytes field copies it: take it once.
            size = len(content)
            if not size:
                total_chunks += 1  # Gazette counts the commit chunk too.
                break
            total_chunks += 1
            policer.received(size)
            waited = await throttle(limiters, size)
            if waited:
                delayed_chunks += 1
                policer.excuse(waited)
            if inflight:
                await _settle(inflight)
            if size < _THREAD_CHUNK:
                pending.write(content)
            elif _MODE == "split":
                # Write and hash on two threads at once; the next chunk is received meanwhile.
                at = pending.length
                pending.advance(size)
                inflight = [
                    loop.run_in_executor(None, pending.write_at, content, at),
                    loop.run_in_executor(None, pending.hash, content),
                ]
            elif _MODE == "inline_write":
                at = pending.length
                pending.advance(size)
                inflight = [loop.run_in_executor(None, pending.hash, content)]
                pending.write_at(content, at)
            else:
                inflight = [loop.run_in_executor(None, pending.write, content)]
        if inflight:
            await _settle(inflight)
        if await receive() is not None:
            raise AppendAborted(
                grpc.StatusCode.INVALID_ARGUMENT, "expected end of stream after the empty chunk"
            )
    except FlowControlUnderflow as exc:
        raise AppendAborted(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from exc
    finally:
        if inflight:
            await asyncio.wait(inflight)

    commit = pb.Fragment(
        journal=replica.name,
        begin=pending.begin,
        end=pending.begin + pending.length,
        sum=sha1sum_from_digest(pending.sha.digest()),
        compression_codec=spool.codec,
    )
    if pending.length:
        registers = pb.LabelSet()
        registers.CopyFrom(replica.registers)
        # Subtract, then union, in Gazette's order (they differ when both name a label).
        if first.HasField("subtract_registers"):
            registers = subtract_label_sets(registers, first.subtract_registers)
        if first.HasField("union_registers"):
            registers = union_label_sets(first.union_registers, registers)
        changed = registers if registers != replica.registers else None
        if spool.sync:
            await asyncio.to_thread(spool.commit, pending, changed)
        else:
            spool.commit(pending, changed)
        replica.registers = registers
        replica.index.spool_committed()
        if replica.spool_needs_roll(spool.last_append_time or 0.0):
            replica.close_spool()
    else:
        # An empty append commits nothing; drop a spool opened for it alone.
        if spool.end == spool.begin and replica.spool is spool:
            replica.spool = None
            replica.index.remove_local(spool)
            spool.delete()
        if first.HasField("union_registers") or first.HasField("subtract_registers"):
            raise AppendAborted(
                grpc.StatusCode.INVALID_ARGUMENT,
                "append stream: register modification requires non-empty Append",
            )
    return pb.AppendResponse(
        status=pb.OK,
        header=header,
        commit=commit,
        registers=replica.registers,
        total_chunks=total_chunks,
        delayed_chunks=delayed_chunks,
    )
