"""`spark.readStream.format("gazette")`: journals as a micro-batch stream.

Offsets are JSON objects ``{journal: [byte offset, create revision]}`` with keys in sorted
order, each byte offset a record boundary. The create revision (of the journal's spec, in
the coordination store) is the journal's identity: a journal deleted and created again has
another one. An offset of a checkpoint written before revisions were kept is a bare byte
offset, accepted as such (its journal gets its revision with the next offsets). With
readCommitted, a journal's offset also carries its producer states there, when it has any:
``[byte offset, create revision, {producer hex: [last ACK clock, largest pending clock,
open transaction's begin or -1]}]``; the next micro-batch's partitions start from them
(`pygazette.spark.producer_states`), and so does a query restarted from its checkpoint.

Every trigger the driver lists the journals again (a selector discovers new ones, which
enter the offsets at their earliest offset and are read from the next micro-batch), fetches
write heads, and advances each journal to its head or as far as the admission budget allows
(`admission`). Trigger.AvailableNow fixes the heads (and the set of journals) when the query
starts, and the query stops once it has read up to them.

A journal whose create revision changed (deleted and created again) is data loss: it fails
the query when failOnDataLoss is true; otherwise it is logged, and the new journal is read
from its beginning (its earliest offset), as a journal discovered now. A write head below
the committed offset (a journal of an old checkpoint recreated, or one that lost data) is
data loss too, and reading continues from the new head. Removed fragments, and journals
deleted or recreated under a planned micro-batch, are detected when micro-batches are
planned and read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pygazette.client.journal_client import JournalClient
from pygazette.spark import journals as jn
from pygazette.spark import runtime
from pygazette.spark.admission import Budget, admit
from pygazette.spark.options import OptionError, ReadOptions
from pygazette.spark.partition_reader import data_loss, read_partition
from pygazette.spark.planning import (
    DataLoss,
    GazettePartition,
    chunk_bounds,
    partition_target,
    plan,
)
from pygazette.spark.producer_states import CutStates, assign_start_states, states_at_ends
from pygazette.spark.read_committed import (
    ProducerStates,
    decode_states,
    encode_states,
    prune_states,
)
from pygazette.spark.schema import Layout

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


def _sorted(offsets: dict[str, int]) -> dict[str, int]:
    return {j: int(offsets[j]) for j in sorted(offsets)}


def _split(offsets: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """Byte offsets and create revisions of Spark's offsets (a bare byte offset, from a
    checkpoint older than revisions, has no revision)."""
    out: dict[str, int] = {}
    revisions: dict[str, int] = {}
    for journal, value in offsets.items():
        if isinstance(value, list):
            out[journal], revisions[journal] = int(value[0]), int(value[1])
        else:
            out[journal] = int(value)
    return out, revisions


def _states(offsets: dict[str, Any]) -> dict[str, ProducerStates]:
    """Producer states of Spark's offsets (readCommitted), by journal."""
    out: dict[str, ProducerStates] = {}
    for journal, value in offsets.items():
        if isinstance(value, list) and len(value) > 2:
            out[journal] = decode_states(value[2])
    return out


def _joined(
    offsets: dict[str, int],
    revisions: dict[str, int],
    states: dict[str, ProducerStates] | None = None,
) -> dict[str, Any]:
    """Spark's offsets: `[byte offset, create revision]` per journal, keys sorted, and the
    journal's producer states at that offset (readCommitted) when it has any."""
    out: dict[str, Any] = {}
    for j in sorted(offsets):
        if j not in revisions:
            out[j] = int(offsets[j])
        elif states and states.get(j):
            out[j] = [int(offsets[j]), revisions[j], encode_states(states[j])]
        else:
            out[j] = [int(offsets[j]), revisions[j]]
    return out


class HeadBelowOffset(DataLoss):
    """The write head is below an offset the query already read up to."""

    def __str__(self) -> str:
        return (
            f"data loss in journal {self.journal}: its write head {self.begin} is below the "
            f"offset {self.end} the query has read up to (was it deleted and recreated?)"
        )


@dataclass(frozen=True, slots=True)
class JournalRecreated(DataLoss):
    """The journal was deleted and created again since the query read it up to `end`: its
    create revision was `old`, and is `new`."""

    old: int = 0
    new: int = 0

    def __str__(self) -> str:
        return (
            f"data loss in journal {self.journal}: it was deleted and created again (create "
            f"revision {self.old}, now {self.new}); what the old journal held past offset "
            f"{self.end} is lost, and the new journal is read from its beginning"
        )


async def _served_heads(
    client: JournalClient, opts: ReadOptions, revisions: Mapping[str, int]
) -> dict[str, int]:
    """The write heads of the journals of a query's start (`revisions`). With a selector, a
    journal listed but not served yet (just created: its assignment is on its way) is left
    out; a journal named by option journals must be served."""
    absent_ok = frozenset(revisions) if opts.selector else frozenset()
    return await jn.write_heads(client, sorted(revisions), absent_ok=absent_ok)


class GazetteStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    def __init__(self, opts: ReadOptions, layout: Layout) -> None:
        self.opts = opts
        self.layout = layout
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow's end offsets.
        self._target_revisions: dict[str, int] = {}  # ...of the journals they are offsets of.
        self._heads: dict[str, int] = {}
        self._cut_states: CutStates = {}  # readCommitted: states at the last plan's cuts.

    # Offsets --------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        opts = self.opts

        async def go(client: JournalClient) -> dict[str, Any]:
            revisions = await jn.journal_revisions(client, opts.journals, opts.selector)
            opts.check_selected(revisions)
            # A selected journal not served yet is left to the first trigger, which finds it
            # (at its earliest offset) once it is served, as it finds journals created later.
            heads = await _served_heads(client, opts, revisions)
            listings = await jn.all_fragments(client, sorted(heads), absent_ok=bool(opts.selector))
            journals = sorted(listings)
            revisions = {j: revisions[j] for j in journals}
            offsets = {
                j: jn.resolve_offset(
                    opts.starting, j, listings[j], heads[j], timestamp_ms=opts.starting_timestamp_ms
                )
                for j in journals
            }
            for j in journals:
                if offsets[j] > heads[j]:
                    # Nothing is there to read yet: the first trigger would take the head
                    # below it for a data loss.
                    raise OptionError(
                        f"startingOffsets of {j} ({offsets[j]}) is past its write head {heads[j]}"
                    )
            return _joined(offsets, revisions)

        offsets = runtime.call(opts.target, go)
        log.info("stream starts at %s", offsets)
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def _budget(self, limit: ReadLimit) -> Budget:
        """The engine's limit, with the other option's limit too (the engine passes one)."""
        if isinstance(limit, ReadMaxBytes):
            return Budget(limit.max_bytes, self.opts.max_records_per_trigger)
        if isinstance(limit, ReadMaxRows):
            return Budget(self.opts.max_bytes_per_trigger, limit.max_rows)
        return Budget(None, None)

    def prepareForTriggerAvailableNow(self) -> None:
        opts = self.opts

        async def go(client: JournalClient) -> tuple[dict[str, int], dict[str, int]]:
            revisions = await jn.journal_revisions(client, opts.journals, opts.selector)
            # A selected journal not served yet has nothing available now: it is not read.
            heads = await _served_heads(client, opts, revisions)
            return heads, {j: revisions[j] for j in heads}

        heads, self._target_revisions = runtime.call(opts.target, go)
        self._target = _sorted(heads)
        log.info("Trigger.AvailableNow reads up to %s", self._target)

    def latestOffset(self, start_offsets: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        opts = self.opts
        budget = self._budget(limit)
        target = self._target
        target_revisions = self._target_revisions
        start, start_revisions = _split(start_offsets)
        start_states = _states(start_offsets)

        async def go(client: JournalClient) -> dict[str, Any]:
            listed_revisions = await jn.journal_revisions(
                client, opts.journals, opts.selector, must_exist=False
            )
            listed = sorted(listed_revisions)
            if target is not None:
                listed = [j for j in listed if j in target]
            # A journal listed but not served yet (just created) is discovered next time; one
            # deleted since it was listed stays where it is, as if it had not been listed.
            heads = await jn.write_heads(client, listed, absent_ok=frozenset(listed))
            # A journal deleted and created again since the start offsets is another journal:
            # what the old one held past them is lost, and the new one is read from its
            # beginning, as a journal discovered now.
            recreated = [
                j
                for j in listed
                if j in start
                and j in heads
                and start_revisions.get(j, listed_revisions[j]) != listed_revisions[j]
            ]
            for j in recreated:
                loss = JournalRecreated(
                    j, start[j], start[j], start_revisions[j], listed_revisions[j]
                )
                data_loss(loss, opts.fail_on_data_loss)
            known = [j for j in listed if j in start and j in heads and j not in recreated]
            new = [j for j in listed if (j not in start or j in recreated) and j in heads]
            self._heads = dict(heads)
            end = dict(start)
            revisions = dict(start_revisions)
            revisions.update((j, listed_revisions[j]) for j in known)
            reading: dict[str, int] = {}
            for j in known:
                head = heads[j]
                if head < start[j]:
                    data_loss(HeadBelowOffset(j, head, start[j]), opts.fail_on_data_loss)
                    end[j] = head
                    continue
                if target is not None:
                    # A journal recreated since the query started (a journal other than the
                    # one its target offset is of) is not read by it: that offset may fall
                    # anywhere in the new journal's records.
                    if target_revisions.get(j, listed_revisions[j]) != listed_revisions[j]:
                        head = start[j]
                    head = min(head, max(target[j], start[j]))
                heads[j] = head
                reading[j] = start[j]
            listings: dict[str, list[jn.FragmentInfo]] = {}
            need_listings = new or (not budget.unlimited and opts.framing.value == "raw")
            if need_listings:
                listings = await jn.all_fragments(
                    client, new + (list(reading) if not budget.unlimited else []), absent_ok=True
                )
            for j in new:
                if j not in listings:
                    continue  # Deleted since it was listed.
                # A journal found by the selector enters at its earliest offset; its content
                # is read from the next micro-batch on.
                end[j] = jn.earliest_offset(listings[j], heads[j])
                revisions[j] = listed_revisions[j]
                log.info("discovered journal %s at offset %d", j, end[j])
            admitted = await admit(client, opts.framing, reading, heads, listings, budget)
            end.update(admitted)
            if not opts.read_committed:
                return _joined(end, revisions)
            # The producers' states at the end offsets, from those at the start offsets and
            # the messages between: the next micro-batch starts from them. A journal
            # recreated, or whose head fell below its offset, starts again without history.
            states = {
                j: s
                for j, s in start_states.items()
                if j in end and j not in recreated and end[j] >= start[j]
            }
            moved = {j: (start[j], end[j]) for j in reading if end[j] > start[j]}
            committed = opts.committed_reads(streaming=False)
            assert committed is not None
            # The micro-batch's partitions start at the cuts its plan will make in these
            # ranges (`planning.chunk_bounds`, which for these framings depends only on the
            # ranges and options): the same scan finds their states, kept for `partitions`.
            part_target = partition_target(
                sum(e - b for b, e in moved.values()), opts.min_partitions, streaming=True
            )
            inner = {
                j: chunk_bounds(b, e, [], opts.framing, part_target, streaming=True)[1:-1]
                for j, (b, e) in moved.items()
            }
            found, self._cut_states = await states_at_ends(client, moved, states, committed, inner)
            for j, s in found.items():
                states[j] = prune_states(s, journal=j)
            return _joined(end, revisions, states)

        return runtime.call(opts.target, jn.patiently(go))

    def reportLatestOffset(self) -> dict[str, int] | None:
        return _sorted(self._heads) if self._heads else None

    def commit(self, end: dict[str, Any]) -> None:
        log.debug("committed %s", end)

    # Partitions -----------------------------------------------------------------------------

    def partitions(
        self, start_offsets: dict[str, Any], end_offsets: dict[str, Any]
    ) -> list[InputPartition]:
        opts = self.opts
        start, start_revisions = _split(start_offsets)
        end, end_revisions = _split(end_offsets)
        # A journal recreated at the end offsets enters this micro-batch at its earliest
        # offset: it has no range to read yet (the start offset is the old journal's).
        ranges = {
            j: (start.get(j, e), e)
            for j, e in end.items()
            if e > start.get(j, e) and start_revisions.get(j, -1) in (end_revisions.get(j, -1), -1)
        }
        if not ranges:
            return []
        # A journal deleted since this micro-batch was planned (a replay after a restart, or a
        # deletion between latestOffset and now) lost its range, as did one deleted and
        # created again (its create revision is not the end offsets' one); the others are read.
        named = tuple(sorted(j for j in ranges if j in end_revisions))

        async def go(client: JournalClient) -> tuple[dict[str, int], dict[str, Any]]:
            revisions = (
                await jn.journal_revisions(client, named, "", must_exist=False) if named else {}
            )
            return revisions, await jn.all_fragments(client, sorted(ranges), absent_ok=True)

        revisions, listings = runtime.call(opts.target, jn.patiently(go))
        recreated = {j for j in named if revisions.get(j, end_revisions[j]) != end_revisions[j]}
        parts, losses = plan(
            ranges,
            {j: listing for j, listing in listings.items() if j not in recreated},
            opts.framing,
            min_partitions=opts.min_partitions,
            streaming=True,
            gone=(frozenset(ranges) - frozenset(listings)) | recreated,
        )
        for loss in losses:
            data_loss(loss, opts.fail_on_data_loss)
        committed = opts.committed_reads(streaming=False)
        if committed is not None:
            # Each range resumes from the producers' states of the start offsets (those at
            # the end of the micro-batch before); one split into several partitions is
            # scanned for the states at its cuts.
            starts = _states(start_offsets)
            ends = {j: e for j, (_b, e) in ranges.items()}
            known = self._cut_states  # Found by latestOffset (not after a restart).
            runtime.call(
                opts.target,
                jn.patiently(
                    lambda c: assign_start_states(c, parts, ranges, starts, committed, ends, known)
                ),
            )
        return list(parts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, GazettePartition):
            return iter(())
        opts = self.opts
        return read_partition(
            opts.target,
            partition,
            self.layout,
            opts.fail_on_data_loss,
            opts.file_root,
            opts.committed_reads(streaming=True),
        )

    def stop(self) -> None:
        log.debug("stream reader stopped")
