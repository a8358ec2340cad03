"""The `gazette` Spark data source: batch and streaming reads, batch and streaming writes.

Spark finds it by itself through the top-level module `pyspark_gazette` (its
`DefaultSource`); `spark.dataSource.register(GazetteDataSource)` registers it by hand.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pygazette.client.journal_client import JournalClient
from pygazette.spark import inference, runtime
from pygazette.spark import journals as jn
from pygazette.spark.batch_reader import GazetteBatchReader
from pygazette.spark.framing import Framing
from pygazette.spark.options import (
    OptionError,
    ReadOptions,
    parse_read_options,
    parse_write_options,
)
from pygazette.spark.schema import default_schema, layout
from pygazette.spark.sink import GazetteBatchWriter, GazetteStreamWriter, make_plan
from pygazette.spark.stream_reader import GazetteStreamReader

FORMAT = "gazette"


class GazetteDataSource(DataSource):  # type: ignore[misc]
    """Journals of a Gazette (or pygazette) broker as a Spark data source."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        opts = parse_read_options(self.options, streaming=None)
        if opts.framing is Framing.JSON:
            return default_schema(opts.framing, inference.infer_json(_samples(opts)))
        if opts.framing is Framing.CSV:
            return default_schema(opts.framing, inference.infer_csv(_samples(opts)))
        return default_schema(opts.framing)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_read_options(self.options, streaming=False)
        return GazetteBatchReader(opts, layout(schema, opts.framing))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_read_options(self.options, streaming=True)
        return GazetteStreamReader(opts, layout(schema, opts.framing))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        _no_overwrite(overwrite)
        opts = parse_write_options(self.options)
        return GazetteBatchWriter(make_plan(opts, schema, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Complete output mode asks to overwrite: each micro-batch's whole result is appended.
        opts = parse_write_options(self.options)
        return GazetteStreamWriter(make_plan(opts, schema, streaming=True))


def _no_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise OptionError("journals are append-only: write with mode append, not overwrite")


def _samples(opts: ReadOptions) -> list[bytes]:
    """Whole records from the start of each journal's range (else from its earliest
    content), for schema inference."""

    async def go(client: JournalClient) -> list[bytes]:
        journals = await jn.resolve_journals(client, opts.journals, opts.selector)
        journals = journals[: inference.SAMPLE_JOURNALS]
        heads = await jn.write_heads(client, journals)
        listings = await jn.all_fragments(client, journals)
        out = []
        for j in journals:
            head, listing = heads[j], listings[j]
            start = jn.resolve_offset(
                opts.starting, j, listing, head, timestamp_ms=opts.starting_timestamp_ms
            )
            data = await inference.sample(client, j, start, head)
            if not data.strip():
                data = await inference.sample(client, j, jn.earliest_offset(listing, head), head)
            out.append(data)
        return out

    return runtime.call(opts.target, go)
