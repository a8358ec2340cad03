"""Mapping rows to journals by key, as Gazette's message mappings do.

`modulo` is Gazette's ModuloMapping: FNV-1a 32 of the key, modulo the number of journals
in name order. `rendezvous` is Gazette's RendezvousMapping: the journal whose FNV-1a 32 of
its name XOR the key's hash is largest (the first, in name order, on a tie), which moves
only about 1/n of the keys when a journal is added. Both are computed over whole Arrow
columns with numpy, one pass per key byte position.

Keys are the UTF-8 bytes of strings, raw binary, and the decimal text of numbers (what
`str()` of the value gives otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

FNV32_OFFSET = 2166136261
FNV32_PRIME = 16777619


def fnv1a32(data: bytes) -> int:
    h = FNV32_OFFSET
    for b in data:
        h = ((h ^ b) * FNV32_PRIME) & 0xFFFFFFFF
    return h


def _key_bytes(keys: pa.Array) -> pa.Array:
    import pyarrow as pa
    import pyarrow.compute as pc

    t = keys.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return keys.cast(pa.large_binary())
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return keys.cast(pa.large_string()).cast(pa.large_binary())
    try:
        return pc.cast(keys, pa.large_string()).cast(pa.large_binary())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.array(
            [None if v is None else str(v).encode() for v in keys.to_pylist()],
            type=pa.large_binary(),
        )


def hash_keys(keys: pa.Array) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """FNV-1a 32 of every key (null keys hash as empty)."""
    arr = _key_bytes(keys)
    n = len(arr)
    h = np.full(n, FNV32_OFFSET, dtype=np.uint32)
    if n == 0:
        return h
    _validity, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset : arr.offset + n + 1]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    begins = offsets[:-1]
    lengths = offsets[1:] - begins
    if arr.null_count:
        lengths = np.where(np.asarray(arr.is_null()), 0, lengths)
    prime = np.uint32(FNV32_PRIME)
    for k in range(int(lengths.max(initial=0))):
        active = np.flatnonzero(lengths > k)
        byte = data[begins[active] + k].astype(np.uint32)
        with np.errstate(over="ignore"):
            h[active] = (h[active] ^ byte) * prime
    return h


def route_modulo(keys: pa.Array, journals: list[str]) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Index into `journals` (sorted by name) of each key's journal."""
    return (hash_keys(keys) % np.uint32(len(journals))).astype(np.int64)


def route_rendezvous(keys: pa.Array, journals: list[str]) -> np.ndarray[Any, np.dtype[np.int64]]:
    hashes = np.asarray([fnv1a32(j.encode()) for j in journals], dtype=np.uint32)
    weights = hash_keys(keys)[:, None] ^ hashes[None, :]
    chosen: np.ndarray[Any, np.dtype[np.int64]] = np.argmax(weights, axis=1).astype(np.int64)
    return chosen


def route(
    keys: pa.Array, journals: list[str], partitioner: str
) -> np.ndarray[Any, np.dtype[np.int64]]:
    if not journals:
        raise ValueError("no journals to map rows to")
    if partitioner == "rendezvous":
        return route_rendezvous(keys, journals)
    return route_modulo(keys, journals)
