"""`spark.read.format("gazette")`: a batch read of journal ranges fixed at planning time.

Planning (on the driver) resolves the journals, their write heads and fragment listings,
turns startingOffsets / startingTimestamp and endingOffsets into a range per journal, and
plans partitions from the listings (`planning`). Executors read the partitions
(`partition_reader`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceReader, InputPartition

from pygazette.client.journal_client import JournalClient
from pygazette.spark import journals as jn
from pygazette.spark import runtime
from pygazette.spark.options import OptionError, ReadOptions
from pygazette.spark.partition_reader import data_loss, read_partition
from pygazette.spark.planning import GazettePartition, plan
from pygazette.spark.producer_states import assign_start_states
from pygazette.spark.schema import Layout

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


async def batch_ranges(
    client: JournalClient, opts: ReadOptions, heads_out: dict[str, int] | None = None
) -> tuple[dict[str, tuple[int, int]], dict[str, list[jn.FragmentInfo]]]:
    """Each journal's [start, end) and fragment listing (and its write head, to `heads_out`)."""
    journals = await jn.resolve_journals(client, opts.journals, opts.selector)
    opts.check_selected(journals)
    heads = await jn.write_heads(client, journals)
    if heads_out is not None:
        heads_out.update(heads)
    listings = await jn.all_fragments(client, journals)  # After the heads: covers them.
    ranges: dict[str, tuple[int, int]] = {}
    for j in journals:
        head, listing = heads[j], listings[j]
        start = jn.resolve_offset(
            opts.starting, j, listing, head, timestamp_ms=opts.starting_timestamp_ms
        )
        end = jn.resolve_offset(opts.ending, j, listing, head)
        if end > head:
            raise OptionError(f"endingOffsets of {j} is {end}, past its write head {head}")
        if start > end:
            raise OptionError(
                f"startingOffsets of {j} ({start}) is after its ending offset ({end})"
            )
        ranges[j] = (start, end)
    return ranges, listings


class GazetteBatchReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, opts: ReadOptions, layout: Layout) -> None:
        self.opts = opts
        self.layout = layout

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        heads: dict[str, int] = {}
        ranges, listings = runtime.call(opts.target, lambda c: batch_ranges(c, opts, heads))
        parts, losses = plan(
            ranges,
            listings,
            opts.framing,
            min_partitions=opts.min_partitions,
            streaming=False,
        )
        for loss in losses:
            data_loss(loss, opts.fail_on_data_loss)
        if opts.read_committed:
            # Messages are decided against the journals as planned, by every partition alike:
            # one that read ahead to a later head could commit its part of a transaction whose
            # other part another partition, reading earlier, left out as still open.
            for part in parts:
                part.decide_through = {p.journal: heads[p.journal] for p in part.pieces}
            # A partition starting inside a journal's range resumes from the producers'
            # states there (the range's start has none: the read starts without history).
            committed = opts.committed_reads(streaming=False)
            assert committed is not None
            scanned = runtime.call(
                opts.target,
                lambda c: assign_start_states(c, parts, ranges, {}, committed, heads),
            )
            if scanned:
                log.info("scanned %d bytes for producer states at partition starts", scanned)
        log.info(
            "planned %d partitions over %d journals (%d bytes)",
            len(parts),
            len(ranges),
            sum(p.size for p in parts),
        )
        return list(parts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, GazettePartition):
            return iter(())  # Spark's stand-in partition when the plan is empty.
        opts = self.opts
        return read_partition(
            opts.target,
            partition,
            self.layout,
            opts.fail_on_data_loss,
            opts.file_root,
            opts.committed_reads(streaming=False),
        )
