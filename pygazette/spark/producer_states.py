"""Producer states at the offsets where read-committed ranges begin, found on the driver.

A partition decides its messages from the producers' states where its range begins
(`read_committed`): otherwise a re-sent copy of a message (a retried append, a recovered
producer re-publishing) whose first copy lies before the range would be a second row. The
driver finds those states by reading the message UUIDs (not the rows) of the journal from an
offset whose states it knows:

- a stream's micro-batch starts from the states its start offsets carry (the end offsets of
  the batch before, `stream_reader`); `latestOffset` scans the new range to carry the states
  at its end, once per byte a stream reads, and notes on the way those at the cuts where the
  micro-batch's plan will split a journal's range (a micro-batch replayed after a restart
  scans again up to its last cut);
- a batch read's journal range split into several partitions is scanned from its start up
  to its last cut, once, to give each partition the states at its own start. Ranges read
  whole by one partition are not scanned.

Journals are scanned concurrently. A scan reads through the brokers, as read-aheads do:
about 700,000 messages (75 MB) a second of 110-byte JSON messages (bench/spark_read.py
--read-committed, planning_seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping

from pygazette.client.journal_client import JournalClient
from pygazette.spark.partition_reader import _envelopes_after
from pygazette.spark.planning import DataLoss, GazettePartition
from pygazette.spark.read_committed import CommittedReads, ProducerStates, TransactionResolver


async def states_at(
    client: JournalClient,
    *,
    journal: str,
    begin: int,
    states: ProducerStates | None,
    cuts: list[int],
    committed: CommittedReads,
    end: int = 0,
) -> list[ProducerStates]:
    """The producers' states at each of `cuts` (ascending): after every record of `journal`
    that begins before it, reading from `begin` (a record boundary), where they are `states`,
    up to `end` (0: the write head). Lost bytes are skipped, as the partitions skip them."""
    resolver = TransactionResolver(journal, states)
    out: list[ProducerStates] = []
    i = 0
    while i < len(cuts) and cuts[i] <= begin:
        out.append(resolver.states())
        i += 1
    if i < len(cuts):
        scan = CommittedReads(committed.framing, wait=False)
        envelopes = _envelopes_after(client, journal=journal, offset=begin, committed=scan, end=end)
        async with contextlib.aclosing(envelopes) as items:
            async for item in items:
                if isinstance(item, DataLoss):
                    continue  # The partition reading it reports it (or fails).
                for offset, producer, clock, flags in item:
                    while i < len(cuts) and offset >= cuts[i]:
                        out.append(resolver.states())
                        i += 1
                    if i == len(cuts):
                        break
                    resolver.add(offset, None, producer, clock, flags)
                if i == len(cuts):
                    break
    while len(out) < len(cuts):
        out.append(resolver.states())
    return out


# States at cuts of journal ranges: (journal, range begin, cut) -> states.
CutStates = dict[tuple[str, int, int], ProducerStates]


async def states_at_ends(
    client: JournalClient,
    ranges: Mapping[str, tuple[int, int]],
    starts: Mapping[str, ProducerStates],
    committed: CommittedReads,
    inner: Mapping[str, list[int]] | None = None,
) -> tuple[dict[str, ProducerStates], CutStates]:
    """Each journal's states at the end of its range [begin, end) (a record boundary), and at
    the `inner` cuts of the range (ascending, inside it), found in the same scan."""
    journals = [j for j, (begin, end) in ranges.items() if end > begin]
    cuts = {j: [*(inner or {}).get(j, []), ranges[j][1]] for j in journals}
    found = await asyncio.gather(
        *(
            states_at(
                client,
                journal=j,
                begin=ranges[j][0],
                states=starts.get(j),
                cuts=cuts[j],
                committed=committed,
                end=ranges[j][1],
            )
            for j in journals
        )
    )
    ends: dict[str, ProducerStates] = {}
    at_cuts: CutStates = {}
    for j, states in zip(journals, found, strict=True):
        ends[j] = states[-1]
        begin = ranges[j][0]
        at_cuts.update(((j, begin, c), s) for c, s in zip(cuts[j][:-1], states, strict=False))
    return ends, at_cuts


async def assign_start_states(
    client: JournalClient,
    parts: Iterable[GazettePartition],
    ranges: Mapping[str, tuple[int, int]],
    starts: Mapping[str, ProducerStates],
    committed: CommittedReads,
    ends: Mapping[str, int],
    known: CutStates | None = None,
) -> int:
    """Give each partition the states where its journal ranges begin: `starts` at a journal
    range's start; at a cut inside it, those `known` already (a stream's `latestOffset` found
    them), else found by scanning from the range's start up to `ends` (a batch read's heads,
    a micro-batch's end offsets) at most. Returns the bytes scanned."""
    parts = list(parts)
    known = known or {}
    cuts: dict[str, set[int]] = {}
    for part in parts:
        for journal, offset in part.range_starts():
            cuts.setdefault(journal, set()).add(offset)
    found: dict[tuple[str, int], ProducerStates] = {}
    inner: dict[str, list[int]] = {}
    for j, offsets in cuts.items():
        begin = ranges[j][0]
        c = sorted(offset for offset in offsets if offset > begin)
        if all((j, begin, offset) in known for offset in c):
            found.update(((j, offset), known[(j, begin, offset)]) for offset in c)
        else:
            inner[j] = c
    scanned = await asyncio.gather(
        *(
            states_at(
                client,
                journal=j,
                begin=ranges[j][0],
                states=starts.get(j),
                cuts=c,
                committed=committed,
                end=ends.get(j, 0),
            )
            for j, c in inner.items()
        )
    )
    for (j, c), at_cuts in zip(inner.items(), scanned, strict=True):
        found.update(((j, offset), s) for offset, s in zip(c, at_cuts, strict=True))
    for j, s in starts.items():
        if j in ranges and s:
            found[(j, ranges[j][0])] = s
    for part in parts:
        part.start_states = {key: found[key] for key in part.range_starts() if found.get(key)}
    return sum(c[-1] - ranges[j][0] for j, c in inner.items())
