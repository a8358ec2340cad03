"""Exactly-once appends of a sink task, fenced by journal registers.

Every (writer, Spark partition) owns one register label of each journal it writes, e.g.
``spark.q/3f1c9a0b2d4e6f70/7``. A task writes all of its rows for a journal in ONE atomic
append, whose request checks the label (`check_registers`) and, when the append commits,
sets it (`union_registers`) in the same step. So the rows and the mark that they were
written commit together, or neither does.

- Streams: the label holds the micro-batch id of the last batch the partition committed,
  and the query that committed it (``<batch id>.<query>``, a digest of Spark's query id,
  which a restart from the checkpoint keeps). An attempt of batch N appends only if the
  label is below N; if it is N or more, the rows are already there (an earlier attempt, or
  a replay after a restart from the checkpoint), and the attempt skips the journal. A label
  of another query (a new checkpoint under the same `writerId`, whose batch ids start again
  from 0) says nothing about this query's batches: the attempt appends. (A label of only a
  batch id, by an older pygazette, is taken as this query's.)
- Batch writes: the label holds ``<commit time>.<run>.<rows>``: when it was written, by
  which run of the write (one `df.write`: its tasks, retries and speculative attempts), and
  an order-independent fingerprint of the rows the partition wrote to the journal
  (`RowsDigest`). It says "already written" to an attempt of the same run, or to a re-run
  (the same `writerId`) whose partition holds the same rows, and only while it is younger
  than `BATCH_LABEL_TTL_SECONDS`: a later write with other rows, or one made after the
  label expired, appends. (A label of only a time, by an older pygazette, says "already
  written" to any attempt until it expires.)

The check is a compare-and-swap: an append asserts the exact value it believes current
(``label = V``, or ``!label`` when absent). A broker answering REGISTER_MISMATCH returns
the current registers, from which the attempt decides to skip or to retry against the
actual value. Speculative or retried attempts of a task therefore commit at most once,
and a late (zombie) attempt of an older batch never overwrites a newer one.

Batch-write labels are removed (piggybacked on later sink appends to the same journal)
once older than `BATCH_LABEL_TTL_SECONDS`; stream labels stay (one per partition).
Gazette treats a journal with no registers at all as matching any check, and keeps registers
only in its replicas' memory: on Gazette, a journal whose brokers all restart loses its
labels, and an attempt that comes after appends again. pygazette recovers them from its
local spools, and keeps those at a persisted spool's end (`broker.fragment.kept_registers`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import BinaryIO

from pygazette.client.appender import Appender
from pygazette.client.journal_client import JournalClient
from pygazette.protocol.errors import GazetteError, RegisterMismatch
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.spark.journals import retry_unavailable

log = logging.getLogger(__name__)

STREAM_LABEL = "spark.q"
BATCH_LABEL = "spark.w"
BATCH_LABEL_TTL_SECONDS = 24 * 3600
MAX_ATTEMPTS = 16
CHUNK = 1 << 20

# Registers last seen per journal in this process: guesses for the next append's check, for
# the journals appended to last (a Python worker lives on across tasks, and a sink may write
# to ever more journals).
REGISTER_CACHE_JOURNALS = 1024
_registers: OrderedDict[str, pb.LabelSet] = OrderedDict()


def _remember(journal: str, registers: pb.LabelSet) -> None:
    _registers[journal] = registers
    _registers.move_to_end(journal)
    while len(_registers) > REGISTER_CACHE_JOURNALS:
        _registers.popitem(last=False)


class FenceError(GazetteError):
    """The register fence of a sink journal holds something the sink did not write."""


@dataclass(frozen=True, slots=True)
class Fence:
    """The register label of one writer's partition, and what this attempt sets it to."""

    name: str
    epoch: int | None  # Stream micro-batch id; None for a batch write.
    run: str = ""  # Batch writes: the run of the write; streams: the query (its digest).
    rows: str = ""  # Batch writes: the fingerprint of the rows this attempt appends.

    @staticmethod
    def for_stream(identity: str, partition: int, batch_id: int, query: str = "") -> Fence:
        """The fence of a stream's partition; `query` is Spark's query id ("" if unknown)."""
        run = hashlib.sha1(query.encode()).hexdigest()[:12] if query else ""
        return Fence(_label(STREAM_LABEL, identity, partition), batch_id, run)

    @staticmethod
    def for_batch(identity: str, partition: int, run: str = "", rows: str = "") -> Fence:
        return Fence(_label(BATCH_LABEL, identity, partition), None, run, rows)

    def with_rows(self, rows: str) -> Fence:
        return replace(self, rows=rows)

    def value(self) -> str:
        if self.epoch is not None:
            return f"{self.epoch}.{self.run}" if self.run else str(self.epoch)
        return f"{int(time.time())}.{self.run}.{self.rows}"

    def committed(self, current: str | None, now: float | None = None) -> bool:
        """Whether the label's current value says this attempt's rows are already written."""
        if current is None:
            return False
        if self.epoch is None:
            return self._batch_committed(current, time.time() if now is None else now)
        batch, dot, query = current.partition(".")
        try:
            written = int(batch)
        except ValueError:
            written = -1
        if written < 0 or (dot and not query):
            raise FenceError(f"register {self.name} holds {current!r}, not a micro-batch id")
        if query and self.run and query != self.run:
            return False  # Another query's batches: nothing of this one's.
        return written >= self.epoch

    def _batch_committed(self, current: str, now: float) -> bool:
        written, *rest = current.split(".")
        try:
            when = int(written)
        except ValueError:
            raise FenceError(
                f"register {self.name} holds {current!r}, not a batch-write mark"
            ) from None
        if when < now - BATCH_LABEL_TTL_SECONDS:
            return False  # Expired: it no longer says anything.
        if len(rest) != 2:
            return True  # An older pygazette's mark: written by this writerId, rows unknown.
        run, rows = rest
        return run == self.run or rows == self.rows

    def guess(self) -> str | None:
        """The value to expect when nothing is known: the previous micro-batch's."""
        if self.epoch is not None and self.epoch > 0:
            return replace(self, epoch=self.epoch - 1).value()
        return None


class RowsDigest:
    """An order-independent fingerprint of a multiset of records: their count, and the sums
    (mod 2**64) of their 64-bit hashes and of those hashes squared. A re-run whose partition
    holds the same rows in another order (a shuffle's fetch order varies) has the same one.

    The hashes are pandas' `hash_array` (SipHash-2-4 under a fixed key, so the same in every
    process), vectorized: 5-6 times faster than a hashlib call per record."""

    __slots__ = ("count", "squares", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.squares = 0

    def add(self, records: Sequence[bytes]) -> None:
        if not records:
            return
        import numpy as np
        import pandas as pd  # type: ignore[import-untyped]

        values = np.empty(len(records), dtype=object)
        values[:] = records
        hashes = pd.util.hash_array(values, categorize=False)
        self.count += len(records)
        self.total = (self.total + int(hashes.sum(dtype=np.uint64))) & _MASK64
        self.squares = (self.squares + int((hashes * hashes).sum(dtype=np.uint64))) & _MASK64

    def hexdigest(self) -> str:
        state = f"{self.count}.{self.total:016x}.{self.squares:016x}".encode()
        return hashlib.blake2b(state, digest_size=12).hexdigest()


_MASK64 = (1 << 64) - 1


def _label(kind: str, identity: str, partition: int) -> str:
    digest = hashlib.sha1(identity.encode()).hexdigest()[:16]
    return f"{kind}/{digest}/{partition}"


def _value(registers: pb.LabelSet, name: str) -> str | None:
    for label in registers.labels:
        if label.name == name:
            return str(label.value)
    return None


def _expired(registers: pb.LabelSet, now: float) -> pb.LabelSet:
    """Batch-write labels older than the TTL."""
    out = pb.LabelSet()
    for label in registers.labels:
        if not label.name.startswith(BATCH_LABEL + "/"):
            continue
        try:
            written = int(label.value.split(".", 1)[0])
        except ValueError:
            continue
        if written < now - BATCH_LABEL_TTL_SECONDS:
            out.labels.add(name=label.name, value=label.value)
    return out


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    journal: str
    appended: bool  # False: skipped, the rows were already written.
    begin: int = 0
    end: int = 0


async def fenced_append(
    client: JournalClient,
    journal: str,
    content: BinaryIO,
    fence: Fence,
    *,
    on_commit: Callable[[str], None] | None = None,
) -> AppendOutcome:
    """Append `content` (a seekable file) to `journal` unless its fence says it is there."""
    known = _registers.get(journal)
    current = _value(known, fence.name) if known is not None else fence.guess()
    for _attempt in range(MAX_ATTEMPTS):
        if fence.committed(current):
            log.info("%s: %s already holds these rows; skipping", journal, fence.name)
            return AppendOutcome(journal, appended=False)
        check = pb.LabelSelector()
        check.include.SetInParent()
        check.exclude.SetInParent()
        if current is None:
            check.exclude.labels.add(name=fence.name, value="")
        else:
            check.include.labels.add(name=fence.name, value=current)
        subtract = _expired(known, time.time()) if known is not None else pb.LabelSet()
        request = _FencedRequest(journal, content, check, fence.value(), subtract)
        # An append that found no broker (one restarting) is made again, through the same
        # check: if it committed after all, the label it set fails the check, and the next
        # attempt finds its rows there. So it is safe whether or not the commit was sent.
        resp = await retry_unavailable(
            f"appending to {journal}", functools.partial(_fenced_once, client, request, fence)
        )
        if resp.status == pb.REGISTER_MISMATCH:
            known = pb.LabelSet()
            known.CopyFrom(resp.registers)
            _remember(journal, known)
            current = _value(known, fence.name)
            continue
        registers = pb.LabelSet()
        registers.CopyFrom(resp.registers)
        _remember(journal, registers)
        if on_commit is not None:
            on_commit(journal)
        return AppendOutcome(journal, True, resp.commit.begin, resp.commit.end)
    raise FenceError(
        f"{journal}: register {fence.name} kept changing under {MAX_ATTEMPTS} attempts to append"
    )


@dataclass(frozen=True, slots=True)
class _FencedRequest:
    journal: str
    content: BinaryIO
    check: pb.LabelSelector
    value: str  # The label's value once the append commits.
    subtract: pb.LabelSet


async def _fenced_once(
    client: JournalClient, request: _FencedRequest, fence: Fence
) -> pb.AppendResponse:
    """One append of the content: its response, committed or REGISTER_MISMATCH."""
    appender = Appender(
        client,
        request.journal,
        check_registers=request.check,
        union_registers=label_set({fence.name: request.value}),
        subtract_registers=request.subtract if request.subtract.labels else None,
    )
    request.content.seek(0)
    try:
        await appender.start()
        for chunk in _chunks(request.content):
            await appender.write(chunk)
        return await appender.commit()
    except RegisterMismatch:
        await appender.abort()
        if appender.response is None:
            raise
        return appender.response
    except BaseException:
        await appender.abort()
        raise


def _chunks(content: BinaryIO) -> Iterator[bytes]:
    while True:
        chunk = content.read(CHUNK)
        if not chunk:
            return
        yield chunk
