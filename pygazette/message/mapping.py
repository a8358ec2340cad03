"""Mapping messages to journals: random, modulo and rendezvous mappings over a set of
partitions (a listing of journals, usually a `WatchedList`'s).

A mapping takes a message and returns `(journal, content_type)`; the content type (the
journal's `content-type` label) selects the framing the message is written with. Modulo and
rendezvous mappings hash a key of the message with 32-bit FNV-1a, exactly as Gazette does,
so Go and Python producers map the same key to the same journal of the same listing:

- modulo: `fnv1a(key) % len(partitions)` (stable while the partitions are);
- rendezvous (highest random weight): the journal maximizing `fnv1a(key) ^ fnv1a(name)`,
  which moves few keys when partitions come and go.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, TypeAlias

from pygazette.client.watched_list import WatchedList
from pygazette.protocol.labels import label_value
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import CONTENT_TYPE_LABEL

__all__ = [
    "EmptyPartitions",
    "MappingFunc",
    "MappingKeyFunc",
    "PartitionsFunc",
    "fnv1a32",
    "modulo_mapping",
    "partitions_of",
    "random_mapping",
    "rendezvous_mapping",
]

MappingFunc: TypeAlias = Callable[[Any], tuple[str, str]]
MappingKeyFunc: TypeAlias = Callable[[Any], bytes | str]
PartitionsFunc: TypeAlias = Callable[[], pb.ListResponse]

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


class EmptyPartitions(LookupError):
    """The mapping's partitions hold no journal (Gazette's ErrEmptyListResponse)."""


def _fnv1a32(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


_fnv1a32_cached = lru_cache(maxsize=1 << 16)(_fnv1a32)


def fnv1a32(data: bytes | str) -> int:
    """32-bit FNV-1a of `data` (text is hashed as UTF-8)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if len(raw) > 64:
        return _fnv1a32(raw)
    return _fnv1a32_cached(raw)


def partitions_of(source: WatchedList | PartitionsFunc | pb.ListResponse) -> PartitionsFunc:
    """A PartitionsFunc of a WatchedList, a fixed ListResponse, or a PartitionsFunc."""
    if isinstance(source, WatchedList):
        return source.snapshot
    if isinstance(source, pb.ListResponse):
        return lambda: source
    return source


class _Listing:
    """Derived data of one listing. Never changed once made: threads mapping at once each
    use the one they took, whole, while another is made for a new listing."""

    __slots__ = ("content_types", "hashes", "listing", "names")

    def __init__(self, listing: pb.ListResponse | None, with_hashes: bool) -> None:
        journals = listing.journals if listing is not None else ()
        self.listing = listing
        self.names = [j.spec.name for j in journals]
        self.content_types = [label_value(j.spec.labels, CONTENT_TYPE_LABEL) for j in journals]
        self.hashes = [fnv1a32(n) for n in self.names] if with_hashes else []


class _Partitions:
    """Derived data of the latest listing, made again only when the listing object changes."""

    __slots__ = ("_latest", "_source")

    def __init__(self, source: PartitionsFunc) -> None:
        self._source = source
        self._latest = _Listing(None, False)

    def current(self, with_hashes: bool = False) -> _Listing:
        listing = self._source()
        latest = self._latest
        if listing is not latest.listing or (
            with_hashes and len(latest.hashes) != len(latest.names)
        ):
            latest = self._latest = _Listing(listing, with_hashes)
        if not latest.names:
            raise EmptyPartitions("no journal matches the mapping's partitions")
        return latest


class _RandomMapping:
    """Maps each message to a journal of the partitions, at random."""

    def __init__(self, parts: _Partitions, rng: random.Random) -> None:
        self._parts = parts
        self._random = rng.random

    def __call__(self, msg: Any) -> tuple[str, str]:
        p = self._parts.current()
        i = int(self._random() * len(p.names))
        return p.names[i], p.content_types[i]

    def map_many(self, msgs: Sequence[Any]) -> list[tuple[str, str]]:
        """The mapping of each message of `msgs` (one listing for them all)."""
        p = self._parts.current()
        pairs = list(zip(p.names, p.content_types, strict=True))
        n = len(pairs)
        rnd = self._random
        return [pairs[int(rnd() * n)] for _ in range(len(msgs))]


def random_mapping(
    partitions: WatchedList | PartitionsFunc | pb.ListResponse,
    rng: random.Random | None = None,
) -> MappingFunc:
    """Map each message to a journal of the partitions, at random."""
    return _RandomMapping(_Partitions(partitions_of(partitions)), rng or random.Random())


def _key_bytes(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else key


def modulo_mapping(
    key: MappingKeyFunc, partitions: WatchedList | PartitionsFunc | pb.ListResponse
) -> MappingFunc:
    """Map each message to journal `fnv1a32(key(msg)) % len(partitions)`."""
    parts = _Partitions(partitions_of(partitions))

    def mapping(msg: Any) -> tuple[str, str]:
        p = parts.current()
        i = fnv1a32(_key_bytes(key(msg))) % len(p.names)
        return p.names[i], p.content_types[i]

    return mapping


def rendezvous_mapping(
    key: MappingKeyFunc, partitions: WatchedList | PartitionsFunc | pb.ListResponse
) -> MappingFunc:
    """Map each message to the journal of highest `fnv1a32(key) ^ fnv1a32(name)`."""
    parts = _Partitions(partitions_of(partitions))

    def mapping(msg: Any) -> tuple[str, str]:
        p = parts.current(with_hashes=True)
        h = fnv1a32(_key_bytes(key(msg)))
        best, index = 0, 0
        for i, name_hash in enumerate(p.hashes):
            w = h ^ name_hash
            if w > best:
                best, index = w, i
        return p.names[index], p.content_types[index]

    return mapping
