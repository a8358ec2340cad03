"""`spark.readStream.format("gazette")`: journals as a micro-batch stream.

Offsets are JSON objects ``{journal: byte offset}`` with keys in sorted order, each value a
record boundary. Every trigger the driver lists the journals again (a selector discovers
new ones, which enter the offsets at their earliest offset and are read from the next
micro-batch), fetches write heads, and advances each journal to its head or as far as the
admission budget allows (`admission`). Trigger.AvailableNow fixes the heads (and the set of
journals) when the query starts, and the query stops once it has read up to them.

A write head below the committed offset (the journal was recreated, or lost data) fails
the query when failOnDataLoss is true; otherwise it is logged and reading continues from
the new head. Removed fragments are detected when micro-batches are planned and read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

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
from pygazette.spark.options import ReadOptions
from pygazette.spark.partition_reader import data_loss, read_partition
from pygazette.spark.planning import DataLoss, GazettePartition, plan
from pygazette.spark.schema import Layout

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


def _sorted(offsets: dict[str, int]) -> dict[str, int]:
    return {j: int(offsets[j]) for j in sorted(offsets)}


class HeadBelowOffset(DataLoss):
    """The write head is below an offset the query already read up to."""

    def __str__(self) -> str:
        return (
            f"data loss in journal {self.journal}: its write head {self.begin} is below the "
            f"offset {self.end} the query has read up to (was it deleted and recreated?)"
        )


class GazetteStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    def __init__(self, opts: ReadOptions, layout: Layout) -> None:
        self.opts = opts
        self.layout = layout
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow's end offsets.
        self._heads: dict[str, int] = {}

    # Offsets --------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        opts = self.opts

        async def go(client: JournalClient) -> dict[str, int]:
            journals = await jn.resolve_journals(client, opts.journals, opts.selector)
            heads = await jn.write_heads(client, journals)
            listings = await jn.all_fragments(client, journals)
            return {
                j: jn.resolve_offset(
                    opts.starting, j, listings[j], heads[j], timestamp_ms=opts.starting_timestamp_ms
                )
                for j in journals
            }

        offsets = _sorted(runtime.call(opts.target, go))
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

        async def go(client: JournalClient) -> dict[str, int]:
            journals = await jn.resolve_journals(client, opts.journals, opts.selector)
            return await jn.write_heads(client, journals)

        self._target = _sorted(runtime.call(opts.target, go))
        log.info("Trigger.AvailableNow reads up to %s", self._target)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        opts = self.opts
        budget = self._budget(limit)
        target = self._target

        async def go(client: JournalClient) -> dict[str, int]:
            listed = await jn.resolve_journals(
                client, opts.journals, opts.selector, must_exist=False
            )
            if target is not None:
                listed = [j for j in listed if j in target]
            # A journal listed but not served yet (just created) is discovered next time; one
            # deleted since it was listed stays where it is, as if it had not been listed.
            heads = await jn.write_heads(client, listed, absent_ok=frozenset(listed))
            known = [j for j in listed if j in start and j in heads]
            new = [j for j in listed if j not in start and j in heads]
            self._heads = dict(heads)
            end = dict(start)
            reading: dict[str, int] = {}
            for j in known:
                head = heads[j]
                if head < start[j]:
                    data_loss(HeadBelowOffset(j, head, start[j]), opts.fail_on_data_loss)
                    end[j] = head
                    continue
                if target is not None:
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
                log.info("discovered journal %s at offset %d", j, end[j])
            admitted = await admit(client, opts.framing, reading, heads, listings, budget)
            end.update(admitted)
            return end

        return _sorted(runtime.call(opts.target, go))

    def reportLatestOffset(self) -> dict[str, int] | None:
        return _sorted(self._heads) if self._heads else None

    def commit(self, end: dict[str, int]) -> None:
        log.debug("committed %s", end)

    # Partitions -----------------------------------------------------------------------------

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        opts = self.opts
        ranges = {j: (start.get(j, e), e) for j, e in end.items() if e > start.get(j, e)}
        if not ranges:
            return []
        # A journal deleted since this micro-batch was planned (a replay after a restart, or a
        # deletion between latestOffset and now) lost its range; the others are read.
        listings = runtime.call(
            opts.target, lambda c: jn.all_fragments(c, sorted(ranges), absent_ok=True)
        )
        parts, losses = plan(
            ranges,
            listings,
            opts.framing,
            min_partitions=opts.min_partitions,
            streaming=True,
            gone=frozenset(ranges) - frozenset(listings),
        )
        for loss in losses:
            data_loss(loss, opts.fail_on_data_loss)
        return list(parts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, GazettePartition):
            return iter(())
        opts = self.opts
        return read_partition(
            opts.target, partition, self.layout, opts.fail_on_data_loss, opts.file_root
        )

    def stop(self) -> None:
        log.debug("stream reader stopped")
