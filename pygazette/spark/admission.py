"""Admission control of streams: how far each journal may advance in one micro-batch.

Budgets (bytes and/or records per trigger) are shared out over journals in proportion to
their unread bytes, and every end offset is a record boundary: a budget never splits a
record. Finding boundaries reads journal content on the driver, as little as the framing
allows: the bytes just before a byte cut for newline framings, fragment ends for raw,
everything from the start for record counts and for CSV and fixed framing (whose records
can only be found from a known boundary).

A record larger than a journal's share is admitted only when nothing else could advance, so
a stream always progresses and no record is ever split.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass

import numpy as np

from pygazette.client.errors import OffsetJump
from pygazette.client.journal_client import JournalClient
from pygazette.client.retry_reader import RetryReader
from pygazette.protocol.errors import JournalNotFound, OffsetNotYetAvailable, Suspended
from pygazette.spark import framing as fr
from pygazette.spark.framing import Framing
from pygazette.spark.journals import FragmentInfo

# First window read back from a byte cut to find the newline before it.
WINDOW_BYTES = 64 << 10


@dataclass(frozen=True)
class Budget:
    max_bytes: int | None
    max_records: int | None

    @property
    def unlimited(self) -> bool:
        return self.max_bytes is None and self.max_records is None


def split_evenly(total: int, weights: Mapping[str, int]) -> dict[str, int]:
    """Split `total` over keys in proportion to their weights, exactly: the largest
    remainders get the leftover units (ties to the first key in order); no key gets more
    than its weight."""
    out = dict.fromkeys(weights, 0)
    positive = {k: w for k, w in weights.items() if w > 0}
    whole = sum(positive.values())
    if whole == 0 or total <= 0:
        return out
    if total >= whole:
        out.update(positive)
        return out
    shares = {k: total * w / whole for k, w in positive.items()}
    for k, s in shares.items():
        out[k] = min(positive[k], math.floor(s))
    left = total - sum(out.values())
    for k in sorted(positive, key=lambda k: (-(shares[k] - out[k]), k)):
        if left <= 0:
            break
        if out[k] < positive[k]:
            out[k] += 1
            left -= 1
    return out


async def admit(
    client: JournalClient,
    framing: Framing,
    start: Mapping[str, int],
    heads: Mapping[str, int],
    listings: Mapping[str, list[FragmentInfo]],
    budget: Budget,
) -> dict[str, int]:
    """End offsets, at record boundaries, for the journals of `start` (each <= its head)."""
    available = {j: max(0, heads.get(j, s) - s) for j, s in start.items()}
    end = {j: start[j] + available[j] for j in start}
    if budget.unlimited or not any(available.values()):
        return end
    finder = _Boundaries(client, framing, listings)
    gone: set[str] = set()

    async def boundary(j: str, find: Awaitable[int]) -> int:
        # A journal deleted since its head was read stays where it was, as one deleted
        # before (the trigger leaves it out of its heads).
        try:
            return await find
        except JournalNotFound:
            gone.add(j)
            return start[j]

    if budget.max_bytes is not None:
        shares = split_evenly(budget.max_bytes, available)
        for j, share in shares.items():
            if share < available[j]:
                cut = start[j] + share
                end[j] = await boundary(j, finder.last_before(j, start[j], cut, heads[j]))
    if budget.max_records is not None:
        shares = split_evenly(budget.max_records, available)
        for j, share in shares.items():
            if end[j] > start[j] and j not in gone:
                find = finder.after_records(j, start[j], share, end[j], heads[j])
                end[j] = await boundary(j, find)
    if all(end[j] == start[j] for j in start):
        # Nothing fits a share: admit one record of the journal with the most to read.
        left = [k for k in sorted(available) if k not in gone]
        if left:
            j = max(left, key=lambda k: available[k])
            end[j] = await boundary(j, finder.after_records(j, start[j], 1, heads[j], heads[j]))
    return end


class _Boundaries:
    def __init__(
        self, client: JournalClient, framing: Framing, listings: Mapping[str, list[FragmentInfo]]
    ) -> None:
        self.client = client
        self.framing = framing
        self.listings = listings

    def _fragment_ends(self, journal: str, start: int, head: int) -> list[int]:
        ends = sorted({f.end for f in self.listings.get(journal, []) if start < f.end < head})
        return [*ends, head]

    async def last_before(self, journal: str, start: int, cut: int, head: int) -> int:
        """The largest record boundary in (start, cut], or start if there is none."""
        if cut >= head:
            return head
        if cut <= start:
            return start
        if self.framing is Framing.RAW:
            ends = [e for e in self._fragment_ends(journal, start, head) if e <= cut]
            return ends[-1] if ends else start
        if self.framing.resyncs:
            lo = max(start, cut - WINDOW_BYTES)
            while True:
                data, at = await self._read(journal, lo, cut)
                nl = data.rfind(b"\n")
                if nl >= 0:
                    return at + nl + 1
                if lo == start:
                    return start
                lo = max(start, lo - 4 * (cut - lo))
        boundary, _ = await self._scan(journal, start, cut, head, limit=None)
        return boundary

    async def after_records(
        self, journal: str, start: int, count: int, stop: int, head: int
    ) -> int:
        """The boundary after `count` more records from `start`, or the last one <= stop."""
        if count <= 0:
            return start
        if self.framing is Framing.RAW:
            rows = self._fragment_ends(journal, start, head)
            rows = [e for e in rows if e <= max(stop, rows[0])]
            return rows[min(count, len(rows)) - 1]
        boundary, _ = await self._scan(journal, start, stop, head, limit=count)
        if boundary == start and stop == head:
            return head
        return boundary

    async def _read(self, journal: str, begin: int, end: int) -> tuple[bytes, int]:
        """Bytes of [begin, end) (after any removed span: then from where content resumes)."""
        if end <= begin:
            return b"", begin
        rr = RetryReader(self.client, journal, offset=begin, end_offset=end, block=False)
        parts: list[bytes] = []
        at = begin
        try:
            while True:
                try:
                    chunk = await rr.read()
                except OffsetJump:
                    parts, at = [], rr.offset
                    continue
                except (OffsetNotYetAvailable, Suspended):  # Content gone (see partition_reader).
                    break
                if not chunk:
                    break
                parts.append(chunk)
        finally:
            await rr.aclose()
        return b"".join(parts), at

    async def _scan(
        self, journal: str, start: int, stop: int, head: int, *, limit: int | None
    ) -> tuple[int, int]:
        """Scan records from the boundary `start`: (the end of the last whole record within
        stop, or of record number `limit`; the records counted)."""
        if stop <= start:
            return start, 0
        rr = RetryReader(self.client, journal, offset=start, end_offset=stop, block=False)
        buf = b""
        base = start
        boundary = start
        count = 0
        try:
            while True:
                try:
                    chunk = await rr.read()
                except OffsetJump:
                    buf, base = b"", rr.offset
                    boundary = base
                    continue
                except (OffsetNotYetAvailable, Suspended):
                    chunk = b""
                final = not chunk and base + len(buf) >= stop and stop == head
                buf += chunk
                spans = fr.scan(self.framing, buf, final=final) if buf else fr.empty_spans()
                n = self._count(buf, spans)
                if limit is not None and count + int(n[-1] if len(n) else 0) >= limit:
                    i = int(np.searchsorted(n, limit - count, side="left"))
                    return base + _record_end(buf, spans, i), limit
                if len(spans):
                    count += int(n[-1])
                    boundary = base + spans.consumed
                    buf = buf[spans.consumed :]
                    base = boundary
                if not chunk:
                    return boundary, count
        finally:
            await rr.aclose()

    def _count(self, buf: bytes, spans: fr.RecordSpans) -> np.ndarray:  # type: ignore[type-arg]
        """Cumulative row counts of the records (blank JSON/CSV lines are not rows)."""
        if self.framing in (Framing.JSON, Framing.CSV) and len(spans):
            rows = ~fr.blank_records(self.framing, buf, spans)
            return np.cumsum(rows)
        return np.arange(1, len(spans) + 1)


def _record_end(buf: bytes, spans: fr.RecordSpans, i: int) -> int:
    """The offset in `buf` just past record i (with its delimiter)."""
    if i + 1 < len(spans):
        return int(spans.starts[i + 1])
    return spans.consumed
