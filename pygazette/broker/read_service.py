"""The Read RPC: streams a journal from an offset, out of local spools or persisted fragments.

Each fragment read begins with a metadata response (offset, write head, fragment and, for a
persisted fragment, its URL), followed by content chunks. As Gazette checks, the fragment never
ends past the write head: in cluster mode a local spool is described, and served, only up to
what every replica confirmed (`Spool.readable_fragment`), and the write head counts persisted
fragments (`Replica.head`). Offset -1 reads from the write head.
A blocking read waits for commits; a non-blocking one answers OFFSET_NOT_YET_AVAILABLE at the
head. `do_not_proxy` reads of persisted fragments get the fragment URL (a presigned store
URL, or a file:// path) and no content; `metadata_only` reads get one metadata response.

Proxied reads of persisted fragments read each fragment over one request, as Gazette's
broker does (a file opened once; one GET of a cloud store, streamed as the read goes on, so
that retention removing the fragment meanwhile doesn't cut the read short), and decompress
it off the event loop, a READ_CHUNK of content at a time (memory stays bounded however
compressed a fragment is). A GZIP_OFFLOAD_DECOMPRESSION fragment is decompressed here when
the store hands back gzip bytes (it says so with Content-Encoding, and file stores always
do), and passed through when the store decompressed it already (GCS transcoding) — where
Gazette's broker passes it through either way, serving gzip bytes as content from stores
that don't decompress.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from pygazette.broker.fragment.spool import Spool
from pygazette.broker.invalidation import first_listing_or_invalidated
from pygazette.broker.metrics import ReadMeter
from pygazette.broker.replica import Replica
from pygazette.broker.resolver import Resolver
from pygazette.protocol.fragment_name import fragment_content_path
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import journal_spec_flags_allow_read
from pygazette.stores import codecs
from pygazette.stores.store import (
    FragmentStore,
    ObjectReader,
    StoreError,
    StoreNotFound,
    StoreRegistry,
)

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20
# Raw bytes pulled from a cloud store's GET at a time (at least; a network read more, at
# most: some 300 KiB).
STORE_CHUNK = READ_CHUNK
# How often a read re-lists the stores after finding a fragment gone, without reading
# anything in between, before giving up.
MISSING_FRAGMENT_RETRIES = 2
# In cluster mode, how often and how long a read waits for the index to fill a gap below the
# write head (a fragment a peer persisted) before answering without it.
GAP_WAITS = 3
GAP_WAIT_SECONDS = 2.0
# In cluster mode, how long a non-blocking read waits for committed content to be confirmed
# by every replica (normally a round trip) before answering without it.
CONFIRM_WAIT_SECONDS = 2.0
# Fragment URLs in Read responses stay valid this long: a minute, as Gazette's broker signs
# them (fragment.Index.Query: SignGetURL(..., time.Minute)); the reader opens one at once.
FRAGMENT_URL_TTL_SECONDS = 60.0


async def serve_read(
    req: pb.ReadRequest, resolver: Resolver, stores: StoreRegistry
) -> AsyncIterator[pb.ReadResponse]:
    replica = resolver.resolve(req.journal)
    if replica is None:
        yield pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND, header=resolver.header(routed=False))
        return
    if not journal_spec_flags_allow_read(replica.spec):
        yield pb.ReadResponse(status=pb.NOT_ALLOWED, header=resolver.header())
        return
    meter = ReadMeter(replica.name)
    try:
        async for resp in serve_local_read(
            req,
            replica,
            resolver.header(),
            stores,
            meter=meter,
            invalidated=replica.invalidated,  # Set when the replica stops (deleted journal).
        ):
            yield resp
    finally:
        meter.close()


# Reads [offset, end) of the journal from a peer broker that holds it (cluster mode): the
# peer's responses from `offset` on, up to where a peer would jump over offsets it lacks
# (whether the read may jump is this broker's index's to say, under Gazette's rules).
PeerRead = Callable[[int, int], AsyncGenerator[pb.ReadResponse, None]]


async def serve_local_read(
    req: pb.ReadRequest,
    replica: Replica,
    first_header: pb.Header,
    stores: StoreRegistry,
    peer_read: PeerRead | None = None,
    meter: ReadMeter | None = None,
    invalidated: asyncio.Event | None = None,
) -> AsyncIterator[pb.ReadResponse]:
    """Serve a read from this broker's replica of the journal (`first_header` goes first).

    In cluster mode, a gap below the head (content this broker never held, and whose
    fragment its store listing doesn't show yet) is first looked for by listing the stores
    again, then read from a peer that holds it (`peer_read`). A blocking read waiting at the
    head ends once `invalidated` is set (the journal's assignments changed: this broker may
    no longer be its primary, or hold it at all, and would wait forever; single-node, its
    replica stopped: the journal was deleted), so the client resolves the journal again and
    goes on from where it was.
    """
    if req.offset == -1:
        # The write head isn't known without the stores. (No listing of a replica that
        # stopped meanwhile ever comes: the stream ends, as at the head below.)
        failure = await first_listing_or_invalidated(replica, invalidated)
        if failure is None:
            return
        if failure:
            raise StoreError(failure)

    header: pb.Header | None = first_header
    if req.offset == -1 and replica.rspool is not None:
        # Cluster mode: a just-acknowledged append is committed but shown to readers only
        # once every replica confirmed it (a moment later). Let the head include it.
        await _await_readable(replica, replica.rspool.end)
    offset = replica.head if req.offset == -1 else req.offset
    missing = 0
    gap_waits = 0
    peer_gap = -1
    while True:
        # As Gazette: a read whose offset is already at its end offset still gets the
        # fragment's metadata (checked below) before the stream ends.
        if req.end_offset and offset >= req.end_offset and header is None:
            return
        changed = replica.index.changed
        frag, spool, offset = replica.index.query(offset, begin_mod_time=req.begin_mod_time)
        if spool is None and not replica.index.first_refresh_done.is_set():
            # Only local spools are known yet: wait for the stores before answering.
            failure = await first_listing_or_invalidated(replica, invalidated)
            if failure is None:
                return
            if failure:
                raise StoreError(failure)
            continue
        if (
            frag is None
            and not req.block
            and replica.holds_unconfirmed(offset)
            and await _await_readable(replica, offset + 1)
        ):
            continue  # Held here, and now confirmed everywhere (cluster mode).
        if frag is None and replica.clustered and offset < replica.head:
            # A gap below the head: content a peer holds or persisted that this broker's
            # index doesn't show. List the stores again; then ask the peers.
            if gap_waits == 0:
                gap_waits += 1
                replica.request_refresh()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(GAP_WAIT_SECONDS):
                        await changed.wait()
                continue
            usable = peer_read is not None and not (req.metadata_only or req.do_not_proxy)
            if usable and peer_gap != offset:
                assert peer_read is not None
                peer_gap = offset
                gap_end = replica.index.next_begin(offset) or replica.head
                if req.end_offset:
                    gap_end = min(gap_end, req.end_offset)
                log.info(
                    "reading a gap from peers",
                    extra={"journal": replica.name, "begin": offset, "end": gap_end},
                )
                async with contextlib.aclosing(peer_read(offset, gap_end)) as reads:
                    async for resp in reads:
                        resp.ClearField("header")
                        if resp.content:
                            # Content chunks carry neither a header nor a write head
                            # (Gazette's ReadResponse rules): only metadata responses
                            # describe the head.
                            resp.write_head = 0
                            offset = resp.offset + len(resp.content)
                        elif resp.fragment.mod_time and (
                            resp.fragment.mod_time < req.begin_mod_time
                        ):
                            # Persisted before the reader's lower bound: skip its content,
                            # as the index skips this broker's own (the peer is asked
                            # without the bound, as it would jump over gaps as well).
                            offset = min(resp.fragment.end, gap_end)
                            break
                        else:
                            resp.write_head = max(resp.write_head, replica.head)
                            if header is not None:
                                resp.header.CopyFrom(header)
                                header = None
                        yield resp
                continue
            if gap_waits < GAP_WAITS:
                gap_waits += 1
                replica.request_refresh()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(GAP_WAIT_SECONDS):
                        await changed.wait()
                continue
        if frag is None:
            if not req.block:
                resp = pb.ReadResponse(
                    status=pb.OFFSET_NOT_YET_AVAILABLE, offset=offset, write_head=replica.head
                )
                if header is not None:
                    resp.header.CopyFrom(header)
                yield resp
                return
            if invalidated is not None and invalidated.is_set():
                return
            await changed.wait()  # Invalidating the replica signals it too.
            if invalidated is not None and invalidated.is_set():
                return
            continue

        resp = pb.ReadResponse(status=pb.OK, offset=offset, write_head=replica.head, fragment=frag)
        if header is not None:
            resp.header.CopyFrom(header)
            header = None
        if frag.backing_store and frag.mod_time and spool is None:
            try:
                store = stores.get(frag.backing_store)
                resp.fragment_url = await store.signed_url(
                    fragment_content_path(frag), FRAGMENT_URL_TTL_SECONDS
                )
            except StoreError as exc:
                # No URL to hand out: serve the content through this broker instead.
                log.warning("cannot sign fragment URL", extra={"error": str(exc)})
        yield resp
        if req.metadata_only or (req.do_not_proxy and resp.fragment_url):
            return
        if req.end_offset and offset >= req.end_offset:
            return

        until = frag.end if not req.end_offset else min(frag.end, req.end_offset)
        if spool is not None:
            chunks = _spool_chunks(spool, offset, until)
        else:
            chunks = _fragment_chunks(frag, offset, until, stores)
        try:
            async for chunk in chunks:
                yield pb.ReadResponse(offset=offset, content=chunk)
                offset += len(chunk)
                missing = 0  # Read on: count fragments found missing at this point only.
                if meter is not None:
                    meter.add(len(chunk))
        except FileNotFoundError:
            continue  # The spool persisted and went away mid-read: query again.
        except StoreNotFound:
            # Removed from the store (retention, or by hand) since the last listing.
            missing += 1
            if missing > MISSING_FRAGMENT_RETRIES:
                raise
            await replica.refresh()


async def _await_readable(replica: Replica, offset: int) -> bool:
    """Wait (briefly) until readers may see `offset`; whether they may."""
    try:
        async with asyncio.timeout(CONFIRM_WAIT_SECONDS):
            while replica.readable_end is not None and replica.readable_end < offset:
                await replica.index.changed.wait()
    except TimeoutError:
        return False
    return True


async def _spool_chunks(spool: Spool, offset: int, until: int) -> AsyncIterator[bytes]:
    while offset < until:
        n = min(READ_CHUNK, until - offset)
        if spool.read_may_block(offset):  # Older content the page cache let go of.
            chunk = await asyncio.to_thread(spool.read_blocking, offset, n)
        else:
            chunk = spool.read(offset, n)
        if not chunk:
            return
        yield chunk
        offset += len(chunk)


async def _fragment_chunks(
    frag: pb.Fragment, offset: int, until: int, stores: StoreRegistry
) -> AsyncIterator[bytes]:
    """Content [offset, until) of a persisted fragment, decompressed off the event loop."""
    store = stores.get(frag.backing_store)
    path = fragment_content_path(frag)
    local_path = store.local_path(path)
    # A file is opened once and read to the end: one that retention removes meanwhile is
    # still read through, as Gazette's broker reads the file it opened.
    local = None if local_path is None else await asyncio.to_thread(_FragmentFile, local_path)
    try:
        chunks = _decoded_chunks(frag, offset, until, store, path, local)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield chunk
    finally:
        if local is not None:
            local.close_soon()


async def _decoded_chunks(
    frag: pb.Fragment,
    offset: int,
    until: int,
    store: FragmentStore,
    path: str,
    local: _FragmentFile | None,
) -> AsyncGenerator[bytes, None]:
    """`_fragment_chunks`, of `local` if the store is a file system, else from `store`.

    A fragment is read over one request (one GET of a cloud store, streamed as the read goes
    on), as Gazette's broker reads it: an uncompressed one from the offset, a compressed one
    from its start, its content decoded and discarded up to the offset.
    """
    to_end = until == frag.end  # Read to the fragment's end: check the file ends there too.
    if frag.compression_codec == pb.NONE:
        pos = offset - frag.begin
        end = until - frag.begin
        if local is not None:
            src: ObjectReader = _LocalRaw(local, pos)
        else:
            # To the object's end if read to the fragment's: one longer than its name
            # says shows it.
            length = -1 if to_end else end - pos
            src = await store.open_read(path, start=pos, length=length, chunk_size=STORE_CHUNK)
        try:
            longer = False
            pending = b""  # Less than a READ_CHUNK, held back for the next content response.
            while pos < end:
                chunk = await src.next()
                if not chunk:
                    raise StoreError(f"fragment {path} is shorter than its name says")
                if pos + len(chunk) > end:
                    longer = to_end
                    chunk = chunk[: end - pos]
                pos += len(chunk)
                # A store's chunks come as the network delivers them (1-1.3 MiB): served as
                # whole READ_CHUNKs, not as a READ_CHUNK and a sliver each.
                data = pending + chunk if pending else chunk
                whole = len(data) if pos == end else len(data) - len(data) % READ_CHUNK
                for i in range(0, whole, READ_CHUNK):
                    yield data[i : min(whole, i + READ_CHUNK)]
                pending = data[whole:]
            if to_end and (longer or await src.next()):
                raise StoreError(_longer(path))
        finally:
            await src.aclose()
        return

    if local is not None:
        src = _LocalRaw(local, 0)
    else:
        src = await store.open_read(path, chunk_size=STORE_CHUNK)
    try:
        codec = frag.compression_codec
        if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
            codec = pb.GZIP if src.content_encoding == "gzip" else pb.NONE
        pos = frag.begin  # Journal offset of the next decompressed byte.
        decoded = _decompressed(src, codecs.new_decompressor(codec), path)
        async with contextlib.aclosing(decoded):
            async for data in decoded:
                if pos + len(data) > offset and pos < until:
                    lo = max(0, offset - pos)
                    hi = min(len(data), until - pos)
                    for i in range(lo, hi, READ_CHUNK):
                        yield data[i : min(hi, i + READ_CHUNK)]
                pos += len(data)
                if pos >= until and not to_end:
                    return
                if pos > frag.end:
                    # As Gazette's fragment reader: the file holds more than its name says.
                    raise StoreError(_longer(path))
        if pos < until:
            raise StoreError(f"fragment {path} ended at {pos}, before {until}")
    finally:
        await src.aclose()


async def _decompressed(
    src: ObjectReader, decompressor: codecs.StreamDecompressor, path: str
) -> AsyncGenerator[bytes, None]:
    """The content of a compressed file, decoded off the event loop about a READ_CHUNK at a
    time: a few KiB of a highly compressed fragment may hold all of its content."""

    async def step(fn: Callable[[], bytes]) -> bytes:
        try:
            return await asyncio.to_thread(fn)
        except ValueError as exc:
            raise StoreError(f"fragment {path} is corrupt: {exc}") from exc

    while True:
        raw = await src.next()
        if not raw:
            if rest := await step(decompressor.finish):
                yield rest
            return
        data = await step(functools.partial(decompressor.feed, raw, READ_CHUNK))
        while data:
            yield data
            data = await step(functools.partial(decompressor.feed, b"", READ_CHUNK))


class _LocalRaw(ObjectReader):
    """The bytes of a file:// store's fragment file from `pos`, a READ_CHUNK at a time."""

    content_encoding = "gzip"  # A file holds the bytes as written.

    def __init__(self, local: _FragmentFile, pos: int) -> None:
        self._local, self._pos = local, pos

    async def next(self) -> bytes:
        data = await asyncio.to_thread(self._local.pread, self._pos, READ_CHUNK)
        self._pos += len(data)
        return data


def _longer(path: str) -> str:
    return f"fragment {path} holds more content than its name says"


class _FragmentFile:
    """A fragment file of a file:// store, open while a read serves it (made and read on
    worker threads)."""

    def __init__(self, path: object) -> None:
        try:
            self._fd = os.open(str(path), os.O_RDONLY)
        except FileNotFoundError as exc:
            # Removed from the store since the last listing, as an object store's missing
            # object (a FileNotFoundError would be taken for a spool that persisted).
            raise StoreNotFound(f"no such fragment file {path}") from exc
        self._lock = threading.Lock()  # A read in flight holds it: closing waits for it.

    def pread(self, pos: int, n: int) -> bytes:
        """Up to `n` bytes at `pos` (fewer only at the end of the file)."""
        out = b""
        with self._lock:
            while len(out) < n:
                data = os.pread(self._fd, n - len(out), pos + len(out))
                if not data:
                    break
                out += data
        return out

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __del__(self) -> None:
        # Opened for a read cancelled meanwhile (by its client), and never used.
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)

    def close_soon(self) -> None:
        """Close it on a worker thread, once a read still in flight there (its reader was
        cancelled) returns."""
        try:
            asyncio.get_running_loop().run_in_executor(None, self.close)
        except RuntimeError:  # The loop's executor is shut down (the broker is stopping).
            self.close()
