"""Cover sets of fragments: the persisted fragments that serve each offset of a journal.

A cover set holds fragments ordered on begin (and so on end) such that no fragment is wholly
covered by another, as Gazette's CoverSet does. Adding a fragment covered by one already
present changes nothing; adding one that covers others replaces them; a fragment with the
same [begin, end) as one present replaces it (the later listing wins). Fragments that only
partly overlap — left by forks, re-persists, or stores written by different brokers — are
all kept, and a read picks the one with the most content past its offset.

Gazette's fast path for adding past the last fragment can leave a covered fragment in
place when several are covered at once; here every add restores the invariant.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Generic, Protocol, TypeVar


class Span(Protocol):
    @property
    def begin(self) -> int: ...

    @property
    def end(self) -> int: ...


S = TypeVar("S", bound=Span)


def _begin(s: Span) -> int:
    return s.begin


def _end(s: Span) -> int:
    return s.end


class CoverSet(Generic[S]):
    """Fragments with no one wholly covered by another, sorted on (begin, end)."""

    def __init__(self, items: Sequence[S] = ()) -> None:
        self._items: list[S] = []
        for item in items:
            self.add(item)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[S]:
        return iter(self._items)

    def __getitem__(self, i: int) -> S:
        return self._items[i]

    def items(self) -> list[S]:
        return list(self._items)

    @property
    def begin_offset(self) -> int:
        return _begin(self._items[0]) if self._items else 0

    @property
    def end_offset(self) -> int:
        return _end(self._items[-1]) if self._items else 0

    def add(self, item: S) -> bool:
        """Add `item` unless a fragment present covers it; True if the set changed."""
        begin, end = _begin(item), _end(item)
        if begin >= end:
            return False  # Empty fragments cover nothing.
        items = self._items
        # The last fragment beginning at or before `begin` has the largest end of those that
        # do (ends rise with begins): it alone can cover `item`.
        i = bisect.bisect_right(items, begin, key=_begin) - 1
        if i >= 0:
            b, e = _begin(items[i]), _end(items[i])
            if e >= end and (b, e) != (begin, end):
                return False
        # Replace every fragment that `item` covers (an equal span included).
        j = bisect.bisect_left(items, begin, key=_begin)
        k = j
        while k < len(items) and _end(items[k]) <= end:
            k += 1
        items[j:k] = [item]
        return True

    def longest_overlapping(self, offset: int) -> tuple[int, bool]:
        """(index, found): the fragment covering `offset` with the most content after it.

        When none covers it, the index of the first fragment beginning after `offset`
        (possibly len(self)), and found is False.
        """
        items = self._items
        ind = bisect.bisect_right(items, offset, key=_end)
        found = ind < len(items) and _begin(items[ind]) <= offset
        while ind + 1 < len(items) and _begin(items[ind + 1]) <= offset:
            ind += 1
        return ind, found

    def covers(self, begin: int, end: int) -> bool:
        """Whether a contiguous run of fragments of the set covers all of [begin, end)."""
        if begin >= end:
            return True
        ind, found = self.longest_overlapping(begin)
        if not found:
            return False
        reach = _end(self._items[ind])
        while reach < end:
            ind += 1
            if ind == len(self._items) or _begin(self._items[ind]) > reach:
                return False
            reach = max(reach, _end(self._items[ind]))
        return True


def cover_set_difference(a: Sequence[S], b: CoverSet[S]) -> list[S]:
    """The fragments of `a` holding offsets that no run of fragments of `b` covers."""
    return [f for f in a if not b.covers(f.begin, f.end)]
