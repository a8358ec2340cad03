"""stream-sum's chunker: generates random streams of chunks, publishes them, and verifies
that the summer publishes each stream's final sum exactly once, with the right value.

    python -m examples.stream_sum.chunker --broker URL [--streams 100] [--chunks 100]
        [--workers 4] [--consumer URL]

As Gazette's `chunker` (GenerateAndVerifyStreams):

1. Before anything is published, an empty append to `examples/stream-sum/sums` (a write
   barrier) learns the journal's write head: sums are read from there on.
2. Each of `--workers` workers generates its share of `--streams` streams of `--chunks`
   chunks of `--chunk-bytes` random bytes (plus a final empty chunk), interleaved at
   random (Go's `generate`), and publishes them committed to the chunk partitions, mapped
   by stream ID (`messages.chunks_mapping`).
3. When a worker completes a stream it waits for the stream's sum to be read from the
   sums journal (read-committed) before publishing anything else, warning as the wait
   grows and failing once it exceeds `--timeout` (Go's escalating deadlines, 40s).
   (Go's `--chunker.streams` counts streams per worker; `--streams` here is the total.)
4. Then an audit: with `--consumer`, each summer shard is first asked (Shard service
   Stat) to read through everything published, so that every sum it will ever write for
   these chunks is written; a second barrier marks the end. Every committed sum between
   the barriers is read again: each generated stream must have exactly one sum, equal to
   the expected one. Sums of streams this run did not generate are ignored (other chunkers
   may share the journal).

Prints one JSON summary (streams, chunks, verified, duplicates, mismatches, missing,
elapsed, chunk rate, and the latency from a stream's final chunk to its verified sum) and
exits 1 if any sum was missing, wrong or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from examples.stream_sum.messages import (
    CHUNKS_SELECTOR,
    FINAL_SUMS_JOURNAL,
    FRAMING,
    Sum,
    chunks_mapping,
    new_chunk,
)
from pygazette.client.append_service import (
    AppendService,
    AsyncAppend,
    is_terminal_append_error,
)
from pygazette.client.appender import append
from pygazette.client.journal_client import JournalClient, broker_address_from_env
from pygazette.client.retry_reader import backoff
from pygazette.client.watched_list import WatchedList
from pygazette.message.framing import CONTENT_TYPE_JSON_LINES, MessageDecodeError
from pygazette.message.publisher import Publisher
from pygazette.message.reader import ReadCommitted
from pygazette.protocol.fragment_name import sha1sum_to_hex

log = logging.getLogger("stream_sum.chunker")

__all__ = ["ChunkerConfig", "SumsVerifier", "audit_sums", "generate", "run_chunker"]

# Go's deadlines for an expected sum: a warning after each, failure after the last.
TIMEOUT_SEQUENCE = (0.1, 0.25, 0.5, 1, 2, 4, 6, 8, 10, 15, 20, 25, 30, 35, 40)


@dataclass(slots=True)
class ChunkerConfig:
    broker: str
    streams: int = 100
    chunks: int = 100
    workers: int = 4
    chunk_bytes: int = 32
    timeout: float = 40.0
    consumer: str = ""  # Shard service address: settle every shard before the audit.
    seed: int | None = None
    # Given, every acknowledged append of chunks is written here as a JSON line
    # {"journal", "begin", "end", "sha1"} (the broker's commit), for an outside audit.
    ack_log: str = ""


class SumTimeout(Exception):
    """An expected sum did not arrive in time."""


def generate(
    num_streams: int, chunks_per_stream: int, rng: random.Random, chunk_bytes: int = 32
) -> Iterator[tuple[dict[str, Any], Sum | None]]:
    """Go's `generate`: chunks of `num_streams` streams, randomly interleaved, each stream
    `chunks_per_stream` chunks of data and a final empty chunk. Yields (chunk, None), and
    (final chunk, the stream's expected Sum) when a stream completes."""
    streams: list[Sum] = []
    remaining = num_streams
    while True:
        n = len(streams)
        if remaining != 0:
            n += 1  # Maybe a new stream.
        elif n == 0:
            return
        i = rng.randrange(n)
        if i == len(streams):
            streams.append(Sum.of_stream(rng.randbytes(16)))
            remaining -= 1
        s = streams[i]
        data = rng.randbytes(chunk_bytes) if s.SeqNo < chunks_per_stream else None
        chunk = new_chunk(s.stream_id, s.SeqNo + 1, data)
        done = s.update(chunk)
        if done:
            streams.pop(i)
            yield chunk, s
        else:
            yield chunk, None


@dataclass(slots=True)
class _Received:
    seq_no: int
    value: int
    at: float  # time.monotonic() when read.


@dataclass
class SumsVerifier:
    """Reads committed sums from `offset` on, and matches them to the streams registered."""

    client: JournalClient
    offset: int
    streams: set[bytes] = field(default_factory=set)
    received: dict[bytes, _Received] = field(default_factory=dict)
    waiters: dict[bytes, asyncio.Future[None]] = field(default_factory=dict)
    duplicates: int = 0
    foreign: int = 0
    undecodable: int = 0
    read_offset: int = 0
    timed_out: list[bytes] = field(default_factory=list)  # Streams whose wait timed out.

    async def run(self) -> None:
        async with ReadCommitted(
            self.client, FINAL_SUMS_JOURNAL, framing=FRAMING, offset=self.offset, block=True
        ) as it:
            while True:
                try:
                    batch = await it.next_batch()
                except MessageDecodeError as exc:
                    self.undecodable += 1
                    log.warning("undecodable sum", extra={"err": str(exc)})
                    continue
                now = time.monotonic()
                for env in batch:
                    self._on_sum(env.message, now)
                    self.read_offset = env.end

    def _on_sum(self, doc: dict[str, Any], now: float) -> None:
        stream_id = bytes(doc["ID"])
        if stream_id not in self.streams:
            self.foreign += 1
            return
        if stream_id in self.received:
            self.duplicates += 1
            log.error("duplicate sum", extra={"id": stream_id.hex(), "sum": doc})
            return
        self.received[stream_id] = _Received(int(doc["SeqNo"]), int(doc["Value"]), now)
        waiter = self.waiters.pop(stream_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, expect: Sum, within: float, journal: str = "") -> _Received:
        """The sum read for `expect`'s stream, waiting for it (warning at Go's deadlines)."""
        stream_id = expect.stream_id
        got = self.received.get(stream_id)
        if got is not None:
            return got
        fut = self.waiters.setdefault(stream_id, asyncio.get_running_loop().create_future())
        start = time.monotonic()
        deadlines = [t for t in TIMEOUT_SEQUENCE if t < within] + [within]
        for deadline in deadlines:
            remaining = start + deadline - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(fut), max(0.0, remaining))
                break
            # Go warns from the first deadline; sub-second delays are common under load.
            if deadline >= within:
                level = logging.ERROR
            else:
                level = logging.WARNING if deadline >= 1 else logging.INFO
            log.log(
                level,
                "delay waiting for expected sum",
                extra={"expect": stream_id.hex(), "journal": journal, "delay": deadline},
            )
        else:
            self.waiters.pop(stream_id, None)
            self.timed_out.append(stream_id)
            raise SumTimeout(
                f"timeout waiting for the sum of stream {stream_id.hex()} "
                f"(final chunk in {journal or '?'}; sums read through {self.read_offset})"
            )
        return self.received[stream_id]


@dataclass(slots=True)
class AuditResult:
    verified: int = 0
    duplicates: int = 0
    mismatches: int = 0
    missing: int = 0
    missing_ids: set[bytes] = field(default_factory=set)
    foreign: int = 0
    sums_read: int = 0
    problems: list[dict[str, Any]] = field(default_factory=list)


async def audit_sums(
    client: JournalClient, expected: dict[bytes, Sum], begin: int, end: int
) -> AuditResult:
    """Every committed sum in [begin, end) of the sums journal, checked against `expected`:
    each expected stream exactly once, with its value."""
    seen: dict[bytes, int] = {}
    result = AuditResult()
    async with ReadCommitted(
        client, FINAL_SUMS_JOURNAL, framing=FRAMING, offset=begin, end_offset=end
    ) as it:
        while True:
            try:
                env = await it.__anext__()
            except StopAsyncIteration:
                break
            except MessageDecodeError as exc:
                result.problems.append({"undecodable": str(exc)})
                continue
            result.sums_read += 1
            doc = env.message
            stream_id = bytes(doc["ID"])
            want = expected.get(stream_id)
            if want is None:
                result.foreign += 1
                continue
            seen[stream_id] = seen.get(stream_id, 0) + 1
            if seen[stream_id] > 1:
                result.duplicates += 1
                result.problems.append({"duplicate": stream_id.hex(), "offset": env.begin})
            elif int(doc["SeqNo"]) != want.SeqNo or int(doc["Value"]) != want.Value:
                result.mismatches += 1
                result.problems.append(
                    {
                        "mismatch": stream_id.hex(),
                        "actual": [doc["SeqNo"], doc["Value"]],
                        "expect": [want.SeqNo, want.Value],
                    }
                )
            else:
                result.verified += 1
    for stream_id in expected:
        if stream_id not in seen:
            result.missing += 1
            result.missing_ids.add(stream_id)
            if len(result.problems) < 20:
                result.problems.append({"missing": stream_id.hex()})
    del result.problems[20:]
    return result


class _AckLog:
    """Writes each acknowledged append's commit once, as a JSON line (see `ack_log`)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")
        self._seen: set[tuple[str, int, int]] = set()

    def record(self, op: Any) -> None:
        # Called once per AsyncAppend, on the thread that resolves it; AsyncAppends of one
        # batch share its response, written once.
        if op.error() is not None or op.response is None or self._file.closed:
            return
        commit = op.response.commit
        key = (commit.journal, int(commit.begin), int(commit.end))
        if key in self._seen or key[1] == key[2]:
            return
        self._seen.add(key)
        sha1 = sha1sum_to_hex(commit.sum)
        doc = {"journal": key[0], "begin": key[1], "end": key[2], "sha1": sha1}
        self._file.write(json.dumps(doc) + "\n")

    def close(self) -> None:
        self._file.close()


async def barrier(client: JournalClient, journal: str) -> int:
    """The journal's write head, by an empty append (Go's write barrier), retried through
    broker restarts and hand-offs as Go's AppendService retries it."""
    attempt = 0
    while True:
        try:
            resp = await append(client, journal, b"")
            return int(resp.commit.end)
        except Exception as exc:
            if is_terminal_append_error(exc) or attempt >= 30:
                raise
            await asyncio.sleep(backoff(attempt))
            attempt += 1


async def _chunk_partitions(client: JournalClient) -> WatchedList:
    parts = WatchedList(client, CHUNKS_SELECTOR)
    await parts.start()
    while not parts.snapshot().journals:
        log.info("waiting for chunk partition journals to be created")
        await parts.wait_update()
    return parts


async def settle_shards(
    consumer: str, published: dict[str, int], within: float
) -> dict[str, dict[str, int]]:
    """Ask every shard reading a journal of `published` to read through its offset
    (Shard Stat): once each answers, every sum of those chunks has been committed."""
    from pygazette.consumer.shard_client import ShardClient

    deadline = time.monotonic() + within
    out: dict[str, dict[str, int]] = {}
    async with ShardClient(consumer) as shards:
        attempt = 0
        while True:
            try:
                listed = await shards.list_shards(within=max(0.1, deadline - time.monotonic()))
                break
            except Exception as exc:
                # The consumer asked may be restarting (its process killed or frozen).
                if not _transient_stat_error(exc) or time.monotonic() >= deadline:
                    raise RuntimeError(f"listing shards at {consumer}: {exc!r}") from exc
                log.info("shard list (will retry)", extra={"consumer": consumer})
                await asyncio.sleep(backoff(attempt))
                attempt += 1
        for shard in listed:
            read_through = {
                src.journal: published[src.journal]
                for src in shard.spec.sources
                if src.journal in published
            }
            if not read_through:
                continue
            attempt = 0
            while True:
                try:
                    resp = await shards.stat(
                        shard.spec.id,
                        read_through,
                        within=max(0.1, deadline - time.monotonic()),
                    )
                    break
                except Exception as exc:
                    # The primary may be handing off (stopped, not yet assigned, or its
                    # process gone): ask again until the deadline, as for a sum.
                    if not _transient_stat_error(exc) or time.monotonic() >= deadline:
                        raise RuntimeError(
                            f"shard {shard.spec.id} did not read through {read_through} "
                            f"within {within:g} s: {exc!r}"
                        ) from exc
                    log.info("shard stat (will retry)", extra={"shard": shard.spec.id})
                    await asyncio.sleep(backoff(attempt))
                    attempt += 1
            out[shard.spec.id] = dict(resp.publish_at)
    return out


def _transient_stat_error(exc: BaseException) -> bool:
    """Whether a Stat failed only because the shard's primary is changing hands."""
    import grpc
    import grpc.aio

    from pygazette.consumer.shard_client import NoShardPrimary, NotShardPrimary, ShardStopped

    if isinstance(exc, (ShardStopped, NoShardPrimary, NotShardPrimary)):
        return True
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_chunker(cfg: ChunkerConfig) -> dict[str, Any]:
    """Generate, publish and verify (see the module docstring); the JSON summary."""
    rng = random.Random(cfg.seed)
    started = time.monotonic()
    async with JournalClient(cfg.broker) as client:
        parts = await _chunk_partitions(client)
        mapping = chunks_mapping(parts)
        begin = await barrier(client, FINAL_SUMS_JOURNAL)
        verifier = SumsVerifier(client, begin)
        reader = asyncio.create_task(verifier.run(), name="sums-reader")
        expected: dict[bytes, Sum] = {}
        latencies: list[float] = []
        last_appends: dict[str, AsyncAppend] = {}
        chunks = 0
        failure = ""
        service = AppendService(client)
        publisher = Publisher(service, framings={CONTENT_TYPE_JSON_LINES: FRAMING})
        acks = _AckLog(cfg.ack_log) if cfg.ack_log else None

        async def worker(n_streams: int, wrng: random.Random) -> None:
            nonlocal chunks
            since_yield = 0
            for chunk, expect in generate(n_streams, cfg.chunks, wrng, cfg.chunk_bytes):
                if chunk["SeqNo"] == 1:
                    verifier.streams.add(bytes(chunk["ID"]))
                aa = publisher.publish_committed(mapping, chunk)
                if acks is not None and last_appends.get(aa.journal) is not aa:
                    aa.add_done_callback(acks.record)
                last_appends[aa.journal] = aa
                chunks += 1
                since_yield += 1
                if expect is None:
                    if since_yield >= 64:
                        since_yield = 0
                        await asyncio.sleep(0)  # Let the appends go out.
                    continue
                expected[expect.stream_id] = expect
                t0 = time.monotonic()
                got = await verifier.wait(expect, cfg.timeout, aa.journal)
                latencies.append(max(0.0, got.at - t0))
                since_yield = 0

        shares = [cfg.streams // cfg.workers] * cfg.workers
        for i in range(cfg.streams % cfg.workers):
            shares[i] += 1
        tasks = [
            asyncio.create_task(worker(n, random.Random(rng.getrandbits(64)))) for n in shares if n
        ]
        try:
            _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in pending:
                t.cancel()
            for t in tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    failure = f"{type(t.exception()).__name__}: {t.exception()}"
                    break
            await service.wait_all()
            generated = time.monotonic() - started
            published = {
                j: int(aa.response.commit.end)
                for j, aa in last_appends.items()
                if aa.response is not None
            }
            settled: dict[str, dict[str, int]] = {}
            if cfg.consumer and not failure:
                settled = await settle_shards(cfg.consumer, published, cfg.timeout)
            end = await barrier(client, FINAL_SUMS_JOURNAL)
            result = await audit_sums(client, expected, begin, end)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            await service.close(cancel=True)
            await parts.stop()
            if acks is not None:
                acks.close()
    elapsed = time.monotonic() - started
    ok = not failure and not (result.duplicates or result.mismatches or result.missing)
    summary: dict[str, Any] = {
        "ok": ok,
        "streams": len(expected),
        "streams_requested": cfg.streams,
        "chunks": chunks,
        "verified": result.verified,
        "duplicates": result.duplicates,
        "mismatches": result.mismatches,
        "missing": result.missing,
        "foreign_sums": result.foreign,
        "sums_read": result.sums_read,
        "elapsed": round(elapsed, 3),
        "generate_seconds": round(generated, 3),
        "chunks_per_s": round(chunks / generated) if generated > 0 else 0,
        "sum_latency_ms": {
            "p50": round(_percentile(latencies, 0.5) * 1e3, 1),
            "p99": round(_percentile(latencies, 0.99) * 1e3, 1),
            "max": round(max(latencies, default=0.0) * 1e3, 1),
        },
        "sums_journal": {"begin": begin, "end": end},
        "settled_shards": sorted(settled),
    }
    if failure:
        summary["failure"] = failure
        summary["failed_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # A sum that timed out yet is in the audit was late (the verifier's read lagged),
        # not lost: the audit reads the sums journal afresh.
        summary["late_sums"] = [
            i.hex() for i in verifier.timed_out if i not in result.missing_ids and i in expected
        ]
    if result.problems:
        summary["problems"] = result.problems
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.stream_sum.chunker", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--broker", default=broker_address_from_env(), help="broker URL")
    parser.add_argument("--streams", type=int, default=100, help="streams in total")
    parser.add_argument("--chunks", type=int, default=100, help="data chunks per stream")
    parser.add_argument("--workers", type=int, default=4, help="parallel workers")
    parser.add_argument("--chunk-bytes", type=int, default=32, help="bytes of data per chunk")
    parser.add_argument(
        "--timeout", type=float, default=40.0, help="seconds to wait for an expected sum"
    )
    parser.add_argument(
        "--consumer", default="", help="summer's Shard service: settle shards before the audit"
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--ack-log", default="", help="append every acknowledged chunk append here (JSON lines)"
    )
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "warning"))
    args = parser.parse_args(argv)
    if args.streams < 1 or args.chunks < 0 or args.workers < 1 or args.chunk_bytes < 1:
        parser.error("--streams and --workers must be >= 1, --chunks >= 0, --chunk-bytes >= 1")
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    cfg = ChunkerConfig(
        broker=args.broker,
        streams=args.streams,
        chunks=args.chunks,
        workers=args.workers,
        chunk_bytes=args.chunk_bytes,
        timeout=args.timeout,
        consumer=args.consumer,
        seed=args.seed,
        ack_log=args.ack_log,
    )
    try:
        summary = asyncio.run(run_chunker(cfg))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"chunker: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
