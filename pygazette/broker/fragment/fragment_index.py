"""The fragment index: which fragment serves a journal offset.

It unions two kinds of fragments: local spools (the open one and closed ones waiting to be
persisted) and persisted fragments from store listings, kept as a cover set (see
`cover_set`). Local spools win where both cover an offset, since they are read without
touching a store.

Store listings replace the persisted set every refresh interval. A fragment this broker
persisted after a listing began is kept across that listing's replacement, so a read never
loses sight of it until the next refresh; and a closed spool that a listing shows is already
persisted (a restart after the upload but before the spool was removed, or another broker
persisting it) is dropped from the index and handed back to be deleted, as Gazette drops
local fragments that a listing covers.

A local spool serves readers only up to its `readable_end`, and the fragment a query returns
for it is its `readable_fragment`: in cluster mode the open spool's committed content that
not every replica confirmed yet is neither served nor counted in the fragment's end and sum
(it would run past the journal's write head).

Reads move forward over a gap in the offsets only under Gazette's rules: to the first
fragment when the offset lies before every fragment of the journal (content removed by
retention), or to the next persisted fragment once it has been in the store for
OFFSET_JUMP_AGE_SECONDS (a younger gap may be a fragment still being persisted, which the
read must wait for). Persisted fragments older than a read's `begin_mod_time` are skipped.
"""

from __future__ import annotations

import asyncio
import bisect
import time

from pygazette.broker.fragment.cover_set import CoverSet
from pygazette.broker.fragment.spool import Spool
from pygazette.protocol.pb import protocol_pb2 as pb

OFFSET_JUMP_AGE_SECONDS = 6 * 3600


class FragmentIndex:
    def __init__(self, journal: str) -> None:
        self.journal = journal
        self._persisted: CoverSet[pb.Fragment] = CoverSet()
        self._local: list[Spool] = []  # Sorted on begin.
        # Fragments added by add_persisted, numbered, until a listing begun after them lands.
        self._recent: list[tuple[int, pb.Fragment]] = []
        # Numbers adds and listing starts, in the order they happen.
        self._seq = 0
        self._installed = 0  # The start of the latest listing installed.
        self.changed = asyncio.Event()
        self.first_refresh_done = asyncio.Event()

    # Mutation.
    def _signal(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def add_local(self, spool: Spool) -> None:
        bisect.insort(self._local, spool, key=lambda s: s.begin)
        self._signal()

    def remove_local(self, spool: Spool) -> None:
        self._local = [s for s in self._local if s is not spool]
        self._signal()

    def spool_committed(self) -> None:
        """Readers waiting on new content should look again."""
        self._signal()

    def add_persisted(self, frag: pb.Fragment) -> bool:
        """Add a fragment this broker just persisted (unless covered)."""
        self._seq += 1
        self._recent.append((self._seq, frag))
        added = self._persisted.add(frag)
        self._signal()
        return added

    def listing_started(self) -> int:
        """A token to pass to `replace_persisted` with the listing begun now."""
        self._seq += 1
        return self._seq

    def replace_persisted(
        self, frags: list[pb.Fragment], started: int | None = None
    ) -> list[Spool]:
        """Install a fresh store listing; returns closed spools it shows are persisted.

        With `started` (from `listing_started`), fragments added since the listing began
        are kept even if the listing missed them, and a listing begun before the latest one
        installed (listings overlap: the refresher's, a read's, retention's) changes nothing:
        the later one saw the store as it is since.
        """
        if started is not None:
            if started < self._installed:
                return []
            self._installed = started
        cover: CoverSet[pb.Fragment] = CoverSet()
        # Larger fragments first at each begin, so that smaller covered ones are no-ops.
        for f in sorted(frags, key=lambda f: (f.begin, -f.end)):
            cover.add(f)
        if started is not None:
            self._recent = [(seq, f) for seq, f in self._recent if seq > started]
            for _seq, f in self._recent:
                cover.add(f)
        else:
            self._recent = []
        self._persisted = cover
        dropped = [
            s for s in self._local if s.closed and s.end > s.begin and cover.covers(s.begin, s.end)
        ]
        if dropped:
            self._local = [s for s in self._local if not any(s is d for d in dropped)]
        self.first_refresh_done.set()
        self._signal()
        return dropped

    # Queries.
    @property
    def persisted_end(self) -> int:
        """The largest offset a persisted fragment reaches (the last one: in a cover set,
        ends grow with begins)."""
        return self._persisted.end_offset

    @property
    def local_end(self) -> int:
        """The largest offset a local spool reaches."""
        return max((s.end for s in self._local), default=0)

    @property
    def end_offset(self) -> int:
        """The largest offset any fragment reaches."""
        end = self._persisted.end_offset
        for s in self._local:
            end = max(end, s.end)
        return end

    @property
    def begin_offset(self) -> int:
        begins = [s.begin for s in self._local if s.end > s.begin]
        if len(self._persisted):
            begins.append(self._persisted.begin_offset)
        return min(begins) if begins else 0

    def summary(self) -> tuple[int, int, int]:
        """As Gazette's `Index.Summary`: the lowest and greatest offsets a fragment with
        content covers (0, 0 with none), and the modification time of the fragment reaching
        the greatest (0 when that is a local spool: not persisted yet)."""
        spools = [s for s in self._local if s.end > s.begin]
        if not spools and not len(self._persisted):
            return 0, 0, 0
        low = self.begin_offset
        local_end = max((s.end for s in spools), default=0)
        if not len(self._persisted) or (spools and local_end >= self._persisted.end_offset):
            return low, local_end, 0
        last = self._persisted[len(self._persisted) - 1]
        return low, last.end, last.mod_time

    def next_begin(self, offset: int) -> int:
        """The lowest begin of a fragment starting after `offset` (0 if there is none)."""
        begins = [f.begin for f in self._persisted.items() if f.begin > offset]
        begins += [s.begin for s in self._local if s.begin > offset and s.end > s.begin]
        return min(begins, default=0)

    def persisted(self) -> list[pb.Fragment]:
        return self._persisted.items()

    def local_spools(self) -> list[Spool]:
        return list(self._local)

    def query(
        self, offset: int, *, begin_mod_time: int = 0, now: float | None = None
    ) -> tuple[pb.Fragment | None, Spool | None, int]:
        """The fragment to read `offset` from, the spool backing it if local, and the offset.

        The returned offset is larger than `offset` only for an offset jump over a gap or
        over fragments older than `begin_mod_time`. (None, None, offset) means nothing is
        readable at `offset` yet.
        """
        now = time.time() if now is None else now
        while True:
            # A spool serves only what readers may see (`Spool.readable_end`: in cluster
            # mode, what every replica confirmed), and is described as just that.
            local, local_end = None, 0
            for spool in self._local:
                end = spool.readable_end
                if spool.begin <= offset < end and (local is None or end > local_end):
                    local, local_end = spool, end
            if local is not None:
                return local.readable_fragment(), local, offset

            ind, found = self._persisted.longest_overlapping(offset)
            if not found:
                nxt = self._persisted[ind] if ind < len(self._persisted) else None
                later_local = [s for s in self._local if s.begin > offset and s.end > s.begin]
                if later_local and (nxt is None or later_local[0].begin < nxt.begin):
                    return None, None, offset  # The next content is not persisted yet: wait.
                if nxt is None or not nxt.mod_time:
                    return None, None, offset
                before_everything = offset < self.begin_offset
                if not before_everything and nxt.mod_time >= now - OFFSET_JUMP_AGE_SECONDS:
                    return None, None, offset
                offset = nxt.begin  # Jump over the gap (Gazette's rules).
                continue
            frag = self._persisted[ind]
            if frag.mod_time and frag.mod_time < begin_mod_time:
                offset = frag.end  # Older than the reader asked for: skip its content.
                continue
            return frag, None, offset
