"""The Read RPC: streams a journal from an offset, out of local spools or persisted fragments.

Each fragment read begins with a metadata response (offset, write head, fragment and, for a
persisted fragment, its URL), followed by content chunks. Offset -1 reads from the write head.
A blocking read waits for commits; a non-blocking one answers OFFSET_NOT_YET_AVAILABLE at the
head. `do_not_proxy` reads of persisted fragments get the fragment URL and no content;
`metadata_only` reads get one metadata response.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from pygazette.broker.replica import Replica
from pygazette.broker.resolver import Resolver
from pygazette.broker.spool import Spool
from pygazette.protocol.fragment_name import fragment_content_path
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import journal_spec_flags_allow_read
from pygazette.stores import codecs
from pygazette.stores.store import StoreRegistry

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20
# In cluster mode, how often and how long a read waits for the index to fill a gap below the
# write head (a fragment a peer persisted) before answering without it.
GAP_WAITS = 3
GAP_WAIT_SECONDS = 2.0
# In cluster mode, how long a non-blocking read waits for committed content to be confirmed
# by every replica (normally a round trip) before answering without it.
CONFIRM_WAIT_SECONDS = 2.0
# Fragment URLs in Read responses stay valid this long.
FRAGMENT_URL_TTL_SECONDS = 3600.0


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
    async for resp in serve_local_read(req, replica, resolver.header(), stores):
        yield resp


# Reads [offset, end) of the journal from a peer broker that holds it (cluster mode).
PeerRead = Callable[[int, int], AsyncIterator[pb.ReadResponse]]


async def serve_local_read(
    req: pb.ReadRequest,
    replica: Replica,
    first_header: pb.Header,
    stores: StoreRegistry,
    peer_read: PeerRead | None = None,
) -> AsyncIterator[pb.ReadResponse]:
    """Serve a read from this broker's replica of the journal (`first_header` goes first).

    In cluster mode, a gap below the head (content this broker never held, and whose
    fragment its store listing doesn't show yet) is first looked for by listing the stores
    again, then read from a peer that holds it (`peer_read`).
    """
    await replica.index.first_refresh_done.wait()

    header: pb.Header | None = first_header
    if req.offset == -1 and replica.rspool is not None:
        # Cluster mode: a just-acknowledged append is committed but shown to readers only
        # once every replica confirmed it (a moment later). Let the head include it.
        await _await_readable(replica, replica.rspool.end)
    offset = replica.head if req.offset == -1 else req.offset
    gap_waits = 0
    peer_gap = -1
    while True:
        if req.end_offset and offset >= req.end_offset:
            return
        changed = replica.index.changed
        frag, spool, offset = replica.index.query(offset)
        limit = replica.readable_limit(frag.end) if frag is not None else None
        if limit is not None and offset >= limit:
            frag = spool = None  # Held here, but not yet confirmed everywhere (cluster mode).
            if not req.block and await _await_readable(replica, offset + 1):
                continue
        if frag is None and replica.clustered and offset < replica.head:
            # A gap below the head: content a peer holds or persisted that this broker's
            # index doesn't show. List the stores again; then ask the peers.
            if gap_waits == 0:
                gap_waits += 1
                replica.request_refresh()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), GAP_WAIT_SECONDS)
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
                async for resp in peer_read(offset, gap_end):
                    resp.ClearField("header")
                    resp.write_head = max(resp.write_head, replica.head)
                    if header is not None:
                        resp.header.CopyFrom(header)
                        header = None
                    if resp.content:
                        offset = resp.offset + len(resp.content)
                    yield resp
                continue
            if gap_waits < GAP_WAITS:
                gap_waits += 1
                replica.request_refresh()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), GAP_WAIT_SECONDS)
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
            await changed.wait()
            continue

        resp = pb.ReadResponse(status=pb.OK, offset=offset, write_head=replica.head, fragment=frag)
        if header is not None:
            resp.header.CopyFrom(header)
            header = None
        if frag.backing_store and spool is None:
            store = stores.get(frag.backing_store)
            resp.fragment_url = store.signed_url(
                fragment_content_path(frag), FRAGMENT_URL_TTL_SECONDS
            )
        yield resp
        if req.metadata_only or (req.do_not_proxy and spool is None):
            return

        until = frag.end if not req.end_offset else min(frag.end, req.end_offset)
        if limit is not None:
            until = min(until, limit)
        if spool is not None:
            chunks = _spool_chunks(spool, offset, until)
        else:
            chunks = _fragment_chunks(frag, offset, until, stores)
        try:
            async for chunk in chunks:
                yield pb.ReadResponse(offset=offset, content=chunk)
                offset += len(chunk)
        except FileNotFoundError:
            continue  # The spool persisted and went away mid-read: query again.


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
        chunk = spool.read(offset, min(READ_CHUNK, until - offset))
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
    local = store.local_path(path)
    if frag.compression_codec == pb.NONE:
        pos = offset - frag.begin
        end = until - frag.begin
        while pos < end:
            n = min(READ_CHUNK, end - pos)
            if local is not None:
                chunk = await asyncio.to_thread(_pread_file, local, pos, n)
            else:
                chunk = await store.get(path, start=pos, length=n)
            if not chunk:
                raise OSError(f"fragment {path} is shorter than its name says")
            yield chunk
            pos += len(chunk)
        return

    decompressor = codecs.new_decompressor(frag.compression_codec)
    pos = frag.begin  # Journal offset of the next decompressed byte.
    raw_pos = 0
    while pos < until:
        if local is not None:
            raw = await asyncio.to_thread(_pread_file, local, raw_pos, READ_CHUNK)
        else:
            raw = await store.get(path, start=raw_pos, length=READ_CHUNK)
        raw_pos += len(raw)
        data = await asyncio.to_thread(decompressor.feed, raw) if raw else decompressor.finish()
        if not raw and not data:
            raise OSError(f"fragment {path} ended at {pos}, before {until}")
        if pos + len(data) > offset:
            lo = max(0, offset - pos)
            hi = min(len(data), until - pos)
            if hi > lo:
                yield data[lo:hi]
        pos += len(data)


def _pread_file(path: object, pos: int, n: int) -> bytes:
    with open(str(path), "rb") as f:
        f.seek(pos)
        return f.read(n)
