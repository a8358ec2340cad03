"""Key mapping of the sink: Gazette's FNV-1a modulo and rendezvous mappings."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.spark.routing import fnv1a32, hash_keys, route


def test_fnv1a32_known_values() -> None:
    # Reference values of FNV-1a 32 (as Go's hash/fnv New32a computes them).
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32(b"foobar") == 0xBF9CF968


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=20)), max_size=50))
def test_vectorised_hash_matches_the_scalar_one(keys: list[bytes | None]) -> None:
    got = hash_keys(pa.array(keys, type=pa.binary())).tolist()
    assert got == [fnv1a32(k or b"") for k in keys]


@settings(deadline=None)
@given(st.lists(st.text(max_size=12), max_size=30), st.integers(1, 7))
def test_routes_match_gazettes_mappings(keys: list[str], n: int) -> None:
    journals = [f"out/part-{i:03d}" for i in range(n)]
    arr = pa.array(keys, type=pa.string())
    modulo = route(arr, journals, "modulo").tolist()
    assert modulo == [fnv1a32(k.encode()) % n for k in keys]

    def rendezvous(key: str) -> int:  # Gazette's RendezvousMapping loop.
        best, index = 0, 0
        for i, j in enumerate(journals):
            w = fnv1a32(key.encode()) ^ fnv1a32(j.encode())
            if w > best:
                best, index = w, i
        return index

    assert route(arr, journals, "rendezvous").tolist() == [rendezvous(k) for k in keys]


def test_numbers_hash_as_their_decimal_text() -> None:
    assert hash_keys(pa.array([7, -12], type=pa.int64())).tolist() == [
        fnv1a32(b"7"),
        fnv1a32(b"-12"),
    ]
