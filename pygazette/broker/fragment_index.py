"""The fragment index: which fragment serves a journal offset.

It unions two kinds of fragments: local spools (the open one and closed ones waiting to be
persisted) and persisted fragments from store listings, kept as a cover set (a fragment
wholly covered by another is dropped). Local spools win where both cover an offset, since
they are read without touching the store.
"""

from __future__ import annotations

import asyncio
import bisect
import time

from pygazette.broker.spool import Spool
from pygazette.protocol.pb import protocol_pb2 as pb

# A read of an offset that no fragment covers skips ahead to the next fragment only if that
# fragment was persisted at least this long ago. A younger gap may just be a fragment that is
# still being persisted, and the read must wait for it rather than skip it (Gazette's rule).
OFFSET_JUMP_AGE_SECONDS = 6 * 3600


class FragmentIndex:
    def __init__(self, journal: str) -> None:
        self.journal = journal
        self._persisted: list[pb.Fragment] = []  # Cover set, sorted on (begin, end).
        self._local: list[Spool] = []  # Sorted on begin.
        self.changed = asyncio.Event()
        self.first_refresh_done = asyncio.Event()
        self._recent: list[pb.Fragment] = []  # Persisted since the last listing began.

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
        """Add a persisted fragment unless it is covered; drop what it covers."""
        for other in self._persisted:
            if other.begin <= frag.begin and frag.end <= other.end:
                return False
        self._persisted = [
            f for f in self._persisted if not (frag.begin <= f.begin and f.end <= frag.end)
        ]
        bisect.insort(self._persisted, frag, key=lambda f: (f.begin, f.end))
        self._recent.append(frag)
        self._signal()
        return True

    def begin_listing(self) -> None:
        """A store listing starts: fragments added from now on are kept by its replacement."""
        self._recent = []

    def replace_persisted(self, frags: list[pb.Fragment]) -> None:
        """Install a fresh store listing (keeping what was added since the listing began)."""
        merged = FragmentIndex(self.journal)
        for f in sorted([*frags, *self._recent], key=lambda f: (f.begin, -f.end)):
            merged.add_persisted(f)
        self._recent = []
        self._persisted = merged._persisted
        self.first_refresh_done.set()
        self._signal()

    # Queries.
    @property
    def end_offset(self) -> int:
        """The largest offset any fragment reaches."""
        end = self._persisted[-1].end if self._persisted else 0
        for f in self._persisted:
            end = max(end, f.end)
        for s in self._local:
            end = max(end, s.end)
        return end

    @property
    def begin_offset(self) -> int:
        begins = [f.begin for f in self._persisted] + [
            s.begin for s in self._local if s.end > s.begin
        ]
        return min(begins) if begins else 0

    def next_begin(self, offset: int) -> int:
        """The lowest begin of a fragment starting after `offset` (0 if there is none)."""
        begins = [f.begin for f in self._persisted if f.begin > offset]
        begins += [s.begin for s in self._local if s.begin > offset and s.end > s.begin]
        return min(begins, default=0)

    def persisted(self) -> list[pb.Fragment]:
        return list(self._persisted)

    def local_spools(self) -> list[Spool]:
        return list(self._local)

    def query(self, offset: int) -> tuple[pb.Fragment | None, Spool | None, int]:
        """The fragment to read `offset` from, the spool backing it if local, and the offset.

        The returned offset is larger than `offset` only for an offset jump over a gap
        (Gazette's rule: the next fragment must be older than OFFSET_JUMP_AGE_SECONDS).
        (None, None, offset) means nothing is readable at `offset` yet.
        """
        for spool in self._local:
            if spool.begin <= offset < spool.end:
                return spool.fragment(), spool, offset
        best: pb.Fragment | None = None
        i = bisect.bisect_right(self._persisted, offset, key=lambda f: f.begin)
        for f in self._persisted[:i]:
            if f.begin <= offset < f.end and (best is None or f.end > best.end):
                best = f
        if best is not None:
            return best, None, offset
        nxt = self._persisted[i] if i < len(self._persisted) else None
        if (
            nxt is not None
            and nxt.mod_time
            and nxt.mod_time < time.time() - OFFSET_JUMP_AGE_SECONDS
        ):
            return nxt, None, nxt.begin
        return None, None, offset
