"""Executor side of reads: a partition's pieces into Arrow record batches.

Each piece's bytes come from its fragment file when the executor can open the fragment's
URL, else (or when that read fails part-way) from a broker, from the offset reached.
`file://` URLs are signed relative to the brokers' file root (as Gazette signs them), so
they are read directly only under the `fileRoot` option's directory; without it, through
a broker. Bytes
are cut into records by the framing; a piece emits the records that begin in its owned
range and stops reading once a record begins past it.

Bytes that turn out to be missing while reading (a broker reports an offset jump, or no
longer has a planned range) are a data loss: an error with `failOnDataLoss`, else logged
and skipped. Raw rows are the bytes between append boundaries the reader knows: its piece's
ends, and the ends of a skipped span.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from pygazette.client.errors import FragmentReadError, OffsetJump
from pygazette.client.fragment_reader import open_fragment_url
from pygazette.client.journal_client import JournalClient
from pygazette.client.retry_reader import RetryReader
from pygazette.protocol.errors import (
    GazetteError,
    JournalNotFound,
    OffsetNotYetAvailable,
    Suspended,
)
from pygazette.spark import framing as fr
from pygazette.spark import runtime
from pygazette.spark.framing import Framing, RecordError, RecordSpans
from pygazette.spark.planning import DataLoss, GazettePartition, JournalDeleted, Piece
from pygazette.spark.read_committed import CommittedReads, TransactionResolver, uuid_parts
from pygazette.spark.schema import FRAGMENT_MOD_TIME, JOURNAL, OFFSET, VALUE, Layout

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

# Bytes of whole records parsed into one record batch.
BLOCK_BYTES = 4 << 20


class DataLossError(GazetteError):
    """Journal content a read needs is gone (and failOnDataLoss is true)."""


def data_loss(loss: DataLoss, fail: bool) -> None:
    """Fail the read on a data loss, or log it and carry on."""
    if fail:
        raise DataLossError(
            f"{loss}. Set option failOnDataLoss to false to skip lost data and continue."
        )
    log.warning("%s; skipping it (failOnDataLoss is false)", loss)


def _direct_readable(url: str, file_root: str | None) -> bool:
    """Whether to try reading a fragment URL directly (a `file://` URL needs a file root)."""
    if not url:
        return False
    return file_root is not None or not url.startswith("file:")


async def piece_bytes(
    client: JournalClient, *, piece: Piece, file_root: str | None = None
) -> AsyncIterator[tuple[int, bytes] | DataLoss]:
    """The bytes of [piece.scan_from, piece.read_end), as (offset, chunk) in order, with a
    `DataLoss` item wherever bytes are missing (reading resumes after them)."""
    offset = piece.scan_from
    end = piece.read_end
    frag = piece.fragment
    if frag is not None and _direct_readable(frag.url, file_root):
        try:
            reader = await open_fragment_url(
                frag.fragment(), offset, frag.url, file_root=file_root
            )
        except FragmentReadError as exc:
            log.info("reading %s through a broker: %s", piece.journal, exc)
        else:
            try:
                while offset < end:
                    chunk = await reader.read(end - offset)
                    if not chunk:
                        break
                    yield offset, chunk
                    offset += len(chunk)
            except FragmentReadError as exc:
                log.warning(
                    "direct read of %s failed at %d; continuing through a broker: %s",
                    piece.journal,
                    offset,
                    exc,
                )
            finally:
                await reader.aclose()
    if offset >= end:
        return
    rr = RetryReader(client, piece.journal, offset=offset, end_offset=end, block=False)
    try:
        while offset < end:
            try:
                chunk = await rr.read()
            except OffsetJump as jump:
                yield DataLoss(piece.journal, jump.requested, min(jump.offset, end))
                offset = rr.offset
                continue
            except (OffsetNotYetAvailable, Suspended):
                # Planned bytes are below the head, so they were readable: they are gone (a
                # journal fully suspended holds no content at all).
                yield DataLoss(piece.journal, offset, end)
                return
            except JournalNotFound:
                # The journal was deleted since its bytes were planned (the reader has asked
                # again, in case a broker had not heard of it yet).
                yield JournalDeleted(piece.journal, offset, end)
                return
            if not chunk:
                return
            yield offset, chunk
            offset += len(chunk)
    finally:
        await rr.aclose()


def read_partition(
    broker: runtime.Broker,
    partition: GazettePartition,
    layout: Layout,
    fail_on_data_loss: bool,
    file_root: str | None = None,
    committed: CommittedReads | None = None,
) -> Iterator[pa.RecordBatch]:
    """The partition's rows. With `committed`, those of committed messages only: the pieces of
    one journal range share a `TransactionResolver` (starting from the producer states the
    plan gives the range), and after the range's last piece the
    reader reads ahead until each message it owns is decided (`read_committed`)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(layout.schema, timezone="UTC")
    data_schema = to_arrow_schema(layout.data, timezone="UTC") if layout.has_data else None
    resolver: TransactionResolver | None = None
    decoder: PieceDecoder | None = None
    range_pieces: list[Piece] = []  # The resolver's pieces, so far: its rows' fragments.
    for piece in partition.pieces:
        if committed is not None and (
            decoder is None
            or resolver is None
            or piece.journal != resolver.journal
            or piece.own_begin != decoder.piece.own_end
        ):  # As GazettePartition.range_starts.
            if decoder is not None and resolver is not None:
                yield from _decide_owned(
                    broker, decoder, resolver, committed, fail_on_data_loss, partition
                )
            resolver = TransactionResolver(
                piece.journal, partition.start_states.get((piece.journal, piece.own_begin))
            )
            range_pieces = []
        range_pieces.append(piece)
        decoder = PieceDecoder(
            piece,
            layout,
            arrow_schema,
            data_schema,
            resolver=resolver,
            committed=committed,
            range_pieces=range_pieces,
        )
        items = runtime.iterate(
            broker, functools.partial(piece_bytes, piece=piece, file_root=file_root)
        )
        try:
            for item in items:
                if isinstance(item, DataLoss):
                    data_loss(item, fail_on_data_loss)
                    yield from decoder.skip_to(item.end)
                else:
                    yield from decoder.feed(*item)
                if decoder.done:
                    break
            else:
                yield from decoder.finish()
        finally:
            items.close()
    if committed is not None and decoder is not None and resolver is not None:
        yield from _decide_owned(
            broker, decoder, resolver, committed, fail_on_data_loss, partition
        )


class ReadCommittedTimeout(GazetteError):
    """A stream's read-committed partition waited too long for a transaction's ACK."""


def _decide_owned(
    broker: runtime.Broker,
    decoder: PieceDecoder,
    resolver: TransactionResolver,
    committed: CommittedReads,
    fail_on_data_loss: bool,
    partition: GazettePartition,
) -> Iterator[pa.RecordBatch]:
    """Read the journal on from the end of the last piece's records until every message the
    partition owns is decided, feeding what is read to `resolver`; then the rows committed.
    A batch read reads ahead up to the head its plan saw (`decide_through`), if it has one."""
    end = partition.decide_through.get(resolver.journal, 0)
    if resolver.pending_owned and (not end or decoder.next_record_at < end):
        items = runtime.iterate(
            broker,
            functools.partial(
                _envelopes_after,
                journal=resolver.journal,
                offset=decoder.next_record_at,
                committed=committed,
                end=end,
            ),
        )
        try:
            for item in items:
                if isinstance(item, DataLoss):
                    data_loss(item, fail_on_data_loss)
                    continue
                for offset, producer, clock, flags in item:
                    resolver.add(offset, None, producer, clock, flags)
                if not resolver.pending_owned:
                    break
        except TimeoutError:
            oldest = resolver.oldest_pending()
            where = (
                f" (the oldest begins at offset {oldest[0]}, producer {oldest[1].hex()})"
                if oldest
                else ""
            )
            open_txns = (
                f"journal {resolver.journal}: {resolver.pending_owned} message(s) of open "
                f"transactions{where} were not committed or rolled back within "
                f"{committed.wait_seconds:g} s"
            )
            if not committed.skip_open:
                raise ReadCommittedTimeout(
                    f"{open_txns}; a stream reading committed messages waits for their ACK "
                    "(raise readCommittedWaitSeconds, set readCommittedOnTimeout=skip to "
                    "leave them out, or read without readCommitted)"
                ) from None
            log.warning("%s: left out (readCommittedOnTimeout=skip)", open_txns)
            resolver.abandon()
        finally:
            items.close()
    left = resolver.abandon() if resolver.pending_owned else 0
    if left:
        log.info(
            "%s: left out %d message(s) of transactions still open at the write head",
            resolver.journal,
            left,
        )
    yield from decoder.committed_rows()


async def _envelopes_after(
    client: JournalClient,
    *,
    journal: str,
    offset: int,
    committed: CommittedReads,
    end: int = 0,
) -> AsyncGenerator[list[tuple[int, bytes, int, int]] | DataLoss, None]:
    """(offset, producer, clock, flags) of the journal's messages from `offset` (a record
    boundary), a list per read chunk: up to `end` (if not 0) or the write head for a batch
    read; for a stream, blocking for new appends, waiting for content within
    `committed.wait_seconds` in all."""
    import asyncio

    framing = committed.framing
    terminator = framing.frame_terminator
    rr = RetryReader(client, journal, offset=offset, end_offset=end, block=committed.wait)
    # Chunks of a record not complete yet, joined and split only once a chunk may complete
    # it (it holds the framing's terminator, or the frame's known size is here): re-splitting
    # all of it at every chunk was quadratic in a long record.
    held: list[bytes] = []
    held_size = 0
    need = 0
    pos = offset
    loop = asyncio.get_running_loop()
    # A stream's wait: only time spent waiting for content counts, not time decoding it or
    # handing it over (an ACK already written, but far on, is no transaction left open).
    wait_left = committed.wait_seconds
    try:
        while True:
            try:
                if committed.wait:
                    began = loop.time()
                    try:
                        chunk = await asyncio.wait_for(rr.read(), max(0.0, wait_left))
                    finally:
                        wait_left -= loop.time() - began
                else:
                    chunk = await rr.read()
            except OffsetJump as jump:
                yield DataLoss(journal, jump.requested, jump.offset)
                held, held_size, need, pos = [], 0, 0, rr.offset
                continue
            except (OffsetNotYetAvailable, Suspended, JournalNotFound):
                return  # At the head (or nothing more to read): undecided stays so.
            if not chunk:
                return
            if held:
                if (terminator is not None and terminator not in chunk) or (
                    held_size + len(chunk) < need
                ):
                    held.append(chunk)
                    held_size += len(chunk)
                    continue
                pending = b"".join([*held, chunk])
            else:
                pending = chunk
            frames, used = framing.split(pending)
            out: list[tuple[int, bytes, int, int]] = []
            for payload in frames:
                if not framing.is_blank(payload):
                    out.append((pos, *uuid_parts(framing, payload)))
                pos += len(payload) + framing.overhead
            rest = pending[used:]
            held, held_size = ([rest], len(rest)) if rest else ([], 0)
            need = (framing.frame_size(rest) or 0) if rest else 0
            if out:
                yield out
    finally:
        await rr.aclose()


class PieceDecoder:
    """Cuts one piece's bytes into records and builds record batches of the owned ones."""

    def __init__(
        self,
        piece: Piece,
        layout: Layout,
        arrow_schema: pa.Schema,
        data_schema: pa.Schema | None,
        *,
        resolver: TransactionResolver | None = None,
        committed: CommittedReads | None = None,
        range_pieces: list[Piece] | None = None,
    ) -> None:
        self.piece = piece
        # Read committed: the pieces sharing `resolver` (this one last), in offset order. A
        # row it commits may be a record of an earlier one (another fragment).
        self.range_pieces = range_pieces or [piece]
        self.layout = layout
        self.framing = layout.framing
        self.arrow_schema = arrow_schema
        self.data_schema = data_schema
        self.resolver = resolver if committed is not None else None
        self.committed = committed
        self.done = False
        # Where the first record after the owned ones begins, once known (read-committed
        # reads read ahead from there).
        self.next_record_at = piece.own_end
        self._chunks: list[bytes] = []
        self._size = 0
        self._base = piece.scan_from  # Journal offset of the first pending byte.
        self._resync = piece.resync

    # Input ---------------------------------------------------------------------------------

    def feed(self, offset: int, chunk: bytes) -> Iterator[pa.RecordBatch]:
        if offset != self._base + self._size:
            raise RecordError(
                f"{self.piece.journal}: read returned offset {offset}, expected "
                f"{self._base + self._size}"
            )
        if self.framing is Framing.RAW:
            yield from self._feed_raw(chunk)
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._resync and not self._do_resync():
            return
        end = self._base + self._size
        if self._size >= BLOCK_BYTES or (end > self.piece.own_end and self._may_end(chunk)):
            yield from self._process(final=False)

    def skip_to(self, offset: int) -> Iterator[pa.RecordBatch]:
        """Bytes up to `offset` are lost: finish what was read before them, restart after."""
        if self.framing is Framing.RAW:
            yield from self._flush_raw()
        # Whole records already read are kept; a partial one before the hole is lost.
        elif not self._resync:
            yield from self._process(final=False)
        self._chunks, self._size = [], 0
        self._base = offset
        self._resync = False  # Content after a hole begins a fragment: a record boundary.
        # Nothing from `offset` on was decoded yet (a read-ahead re-reading the hole would
        # report it again).
        self.next_record_at = offset
        if offset >= self.piece.own_end:
            self.done = True

    def finish(self) -> Iterator[pa.RecordBatch]:
        if self.framing is Framing.RAW:
            yield from self._flush_raw()
        elif not self._resync:
            yield from self._process(final=True)
        self.done = True

    # Raw -------------------------------------------------------------------------------------

    def _feed_raw(self, chunk: bytes) -> Iterator[pa.RecordBatch]:
        room = self.piece.own_end - (self._base + self._size)
        if room <= 0:
            self.done = True
            return
        chunk = chunk[:room]
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._base + self._size >= self.piece.own_end:
            yield from self._flush_raw()
            self.done = True
        yield from ()

    def _flush_raw(self) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        if not self._size:
            return
        data = b"".join(self._chunks)
        offsets = np.asarray([self._base], dtype=np.int64)
        value = pa.array([data], type=pa.binary())
        self._base += self._size
        self._chunks, self._size = [], 0
        yield self._batch(offsets, value=value)

    # Records ---------------------------------------------------------------------------------

    def _may_end(self, chunk: bytes) -> bool:
        """Whether `chunk` may complete the record that crosses own_end."""
        if self.framing in (Framing.LINES, Framing.JSON, Framing.CSV):
            return b"\n" in chunk
        return True

    def _do_resync(self) -> bool:
        """Drop the partial record before the first boundary at or after scan_from + 1."""
        buf = self._joined()
        start = fr.resync(buf)
        if start < 0:
            self._base += len(buf)
            self._chunks, self._size = [], 0
            if self._base >= self.piece.own_end:
                self.done = True
            return False
        self._chunks = [buf[start:]] if start < len(buf) else []
        self._size = len(buf) - start
        self._base += start
        self._resync = False
        if self._base >= self.piece.own_end:
            self.done = True
            return False
        return True

    def _joined(self) -> bytes:
        if len(self._chunks) == 1:
            return self._chunks[0]
        buf = b"".join(self._chunks)
        self._chunks = [buf]
        return buf

    def _process(self, *, final: bool) -> Iterator[pa.RecordBatch]:
        if not self._size:
            return
        buf = self._joined()
        try:
            spans = fr.scan(self.framing, buf, final=final)
        except RecordError as exc:
            raise RecordError(f"{self._describe(None)}: {exc}") from None
        begins = spans.starts + self._base
        own_end = self.piece.own_end
        lo = int(np.searchsorted(begins, self.piece.own_begin, side="left"))
        hi = int(np.searchsorted(begins, own_end, side="left"))
        if hi < len(spans) or (spans.consumed and self._base + spans.consumed >= own_end):
            self.done = True
        if hi > lo or hi < len(spans):
            self.next_record_at = (
                int(begins[hi]) if hi < len(spans) else self._base + spans.consumed
            )
        owned = spans.select(lo, hi)
        if len(owned):
            yield from self._records(buf, owned)
        rest = buf[spans.consumed :]
        self._base += spans.consumed
        self._chunks = [rest] if rest else []
        self._size = len(rest)

    def _describe(self, start: int | None) -> str:
        where = f"journal {self.piece.journal}"
        if start is not None:
            where += f" at offset {self._base + start}"
        return where

    def _records(self, buf: bytes, spans: RecordSpans) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        framing = self.framing
        if framing in (Framing.JSON, Framing.CSV):
            blank = fr.blank_records(framing, buf, spans)
            if blank.any():
                spans = spans.mask(~blank)
            if not len(spans):
                return
            if self.resolver is not None:
                self._resolve(buf, spans)
                yield from self.committed_rows()
                return
            offsets = spans.starts + self._base
            yield self._batch(offsets, table=self._parse(buf, spans))
            return
        offsets = spans.starts + self._base
        value: pa.Array | None = None
        if self.layout.value_type is not None:
            value = fr.binary_values(buf, spans, newline_framed=framing is Framing.LINES)
            if self.layout.value_type == "string":
                try:
                    value = value.cast(pa.string())
                except pa.ArrowInvalid:
                    raise RecordError(
                        f"{self._describe(None)}: a line is not valid UTF-8; "
                        "read column value as binary"
                    ) from None
        yield self._batch(offsets, value=value)

    def _parse(self, buf: bytes, spans: RecordSpans) -> pa.Table:
        """The data columns of JSON or CSV records."""
        assert self.data_schema is not None
        if self.framing is Framing.JSON:
            return fr.parse_json(buf, spans, self.data_schema, describe=self._describe)
        return fr.parse_csv(
            buf,
            spans,
            [f.name for f in self.data_schema],
            self.data_schema,
            describe=self._describe,
        )

    # Read committed --------------------------------------------------------------------------

    def _resolve(self, buf: bytes, spans: RecordSpans) -> None:
        """Feed the owned records to the resolver, with their payloads (kept until decided)."""
        assert self.resolver is not None and self.committed is not None
        framing = self.committed.framing
        add = self.resolver.add
        base = self._base
        for start, vs, ve in zip(
            spans.starts.tolist(),
            spans.value_starts.tolist(),
            spans.value_ends.tolist(),
            strict=True,
        ):
            payload = buf[vs:ve]
            add(base + start, payload, *uuid_parts(framing, payload))

    def committed_rows(self) -> Iterator[pa.RecordBatch]:
        """A record batch of the rows the resolver committed since the last call."""
        if self.resolver is None:
            return
        rows = self.resolver.take()
        if not rows:
            return
        n = len(rows)
        buf = b"\n".join(payload for _, payload in rows) + b"\n"
        lengths = np.fromiter((len(p) + 1 for _, p in rows), dtype=np.int64, count=n)
        starts = np.zeros(n, dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        spans = RecordSpans(starts, starts, starts + lengths - 1, len(buf))
        offsets = np.fromiter((offset for offset, _ in rows), dtype=np.int64, count=n)
        mod_times = None
        if any(FRAGMENT_MOD_TIME == f.name for f in self.arrow_schema):
            # Each row's own fragment: the piece of the range its record begins in.
            begins = np.asarray([p.own_begin for p in self.range_pieces], dtype=np.int64)
            times = np.asarray([p.mod_time for p in self.range_pieces], dtype=np.int64)
            at = np.searchsorted(begins, offsets, side="right") - 1
            mod_times = times[np.clip(at, 0, len(times) - 1)]
        yield self._batch(
            offsets,
            table=self._parse(buf, spans) if self.data_schema else None,
            mod_times=mod_times,
        )

    # Batches ---------------------------------------------------------------------------------

    def _batch(
        self,
        offsets: np.ndarray[Any, np.dtype[np.int64]],
        *,
        value: pa.Array | None = None,
        table: pa.Table | None = None,
        mod_times: np.ndarray[Any, np.dtype[np.int64]] | None = None,
    ) -> pa.RecordBatch:
        import pyarrow as pa

        n = len(offsets)
        columns = []
        for field in self.arrow_schema:
            name = field.name
            if name == JOURNAL:
                columns.append(_repeat_string(self.piece.journal, n))
            elif name == OFFSET:
                columns.append(pa.array(offsets, type=pa.int64()))
            elif name == FRAGMENT_MOD_TIME:
                mod_time = self.piece.mod_time
                if mod_times is not None:  # Unix seconds, 0 for none (a broker's spool).
                    micros = mod_times * 1_000_000
                    columns.append(pa.array(micros, type=field.type, mask=mod_times == 0))
                elif mod_time:
                    columns.append(
                        pa.array(np.full(n, mod_time * 1_000_000, dtype=np.int64), type=field.type)
                    )
                else:
                    columns.append(pa.nulls(n, type=field.type))
            elif table is not None:
                columns.append(table.column(name).combine_chunks())
            elif name == VALUE and value is not None:
                columns.append(value)
            else:
                columns.append(pa.nulls(n, type=field.type))
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)


def _repeat_string(text: str, n: int) -> pa.Array:
    import pyarrow as pa

    data = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)]
    )
