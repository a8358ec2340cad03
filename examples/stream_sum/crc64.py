"""CRC-64 as Go's `hash/crc64` computes it with `crc64.MakeTable(crc64.ECMA)`.

That is the reflected ECMA-182 polynomial (0xC96C5795D7870F42 in reflected form), with
the register inverted before and after each update (CRC-64/XZ): `update(0, b"123456789")`
is 0x995DC9BBDF1939FA. `update(crc, data)` continues a checksum exactly as Go's
`crc64.Update(crc, table, data)` does, so chunking never changes the final value:
`update(update(0, b"battery"), b" horse") == update(0, b"battery horse")`.

Two implementations, with identical results:

- `update`: pure Python, table driven "slice-by-8": each 8 bytes of input cost eight
  lookups into eight 256-entry tables and one XOR of a 64-bit word (about 2.5 us per
  32-byte chunk), with a byte-at-a-time loop for a tail of fewer than 8 bytes.
- `update_many(values, pieces)`: many streams at once, each continued over its pieces
  (the summer's chunks of a transaction), as `update(values[i], b"".join(pieces[i]))`.
  With numpy (a dependency of the development install) the pieces are short messages
  and the CRC is linear, so a piece of length L <= W folds into the register r as

      r' = B(piece) ^ XOR_k X[W - L + k][byte k of r]

  where B(piece) is the raw CRC of the piece (from a zero register, left-padded with zeros
  to W bytes), X[p] the 256-entry table of a byte at position p of a W-byte message
  (positions W..W+7: a plain shift, for pieces shorter than 8 bytes). B of every piece is
  one numpy gather and XOR-reduce over all of them; the registers then advance one piece
  per stream per round (round k takes the k-th piece of every stream that has one), eight
  table lookups each, vectorized across streams. A few tenths of a microsecond per
  32-byte piece. Without numpy, or for few or long pieces, it falls back to `update`.
"""

from __future__ import annotations

import itertools
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

BytesLike = bytes | bytearray | memoryview

__all__ = ["ECMA", "checksum", "update", "update_many"]

ECMA = 0xC96C5795D7870F42  # Reflected ECMA-182 polynomial, as Go's crc64.ECMA.
_MASK = (1 << 64) - 1


def _tables() -> list[list[int]]:
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ ECMA if c & 1 else c >> 1
        t0.append(c)
    tables = [t0]
    for _ in range(7):
        prev = tables[-1]
        tables.append([(v >> 8) ^ t0[v & 0xFF] for v in prev])
    return tables


_TABLES = _tables()


def _make_update() -> Callable[[int, BytesLike], int]:
    t0, t1, t2, t3, t4, t5, t6, t7 = _TABLES
    words = struct.Struct("<Q").iter_unpack
    mask = _MASK

    def update(crc: int, data: BytesLike) -> int:
        """The CRC of `data` continuing from `crc` (0 to start), as Go's crc64.Update."""
        crc = (crc ^ mask) & mask
        n = len(data)
        end = n & ~7
        if end:
            for (w,) in words(data if end == n else memoryview(data)[:end]):
                crc ^= w
                crc = (
                    t7[crc & 0xFF]
                    ^ t6[(crc >> 8) & 0xFF]
                    ^ t5[(crc >> 16) & 0xFF]
                    ^ t4[(crc >> 24) & 0xFF]
                    ^ t3[(crc >> 32) & 0xFF]
                    ^ t2[(crc >> 40) & 0xFF]
                    ^ t1[(crc >> 48) & 0xFF]
                    ^ t0[crc >> 56]
                )
        if end != n:
            for b in memoryview(data)[end:].tobytes():
                crc = t0[(crc ^ b) & 0xFF] ^ (crc >> 8)
        return crc ^ mask

    return update


update = _make_update()


def checksum(data: BytesLike) -> int:
    """The CRC of `data`, as Go's crc64.Checksum(data, crc64.MakeTable(crc64.ECMA))."""
    return update(0, data)


# Many streams at once ----------------------------------------------------------------------

# numpy, imported at the first call that has enough pieces to vectorize (None: not yet;
# False: not installed).
np: Any = None


def _numpy() -> Any:
    global np
    if np is None:
        try:
            import numpy
        except ImportError:  # pragma: no cover - numpy is part of the development install.
            np = False
        else:
            np = numpy
    return np


# Below this many pieces, or once fewer streams than this remain in a round, plain
# `update` is faster than numpy's per-call overhead.
MIN_VECTOR_PIECES = 64
MIN_VECTOR_STREAMS = 8
# Pieces longer than this are not vectorized (the padded width costs every piece).
MAX_VECTOR_PIECE = 256
# Pieces gathered per numpy pass (bounds the temporary arrays to a few MiB).
_SLAB = 8192

_position_tables: dict[int, Any] = {}


def _positions(width: int) -> Any:
    """X of the module docstring for messages of `width` bytes: shape (width + 8, 256)."""
    x = _position_tables.get(width)
    if x is None:
        t0 = np.array(_TABLES[0], dtype=np.uint64)
        x = np.empty((width + 8, 256), dtype=np.uint64)
        # The last byte of a message: one step from a zero register.
        row = t0.copy()
        for p in range(width - 1, -1, -1):
            x[p] = row
            row = t0[(row & np.uint64(0xFF)).astype(np.intp)] ^ (row >> np.uint64(8))
        b = np.arange(256, dtype=np.uint64)
        for j in range(8):
            x[width + j] = b << np.uint64(8 * j)  # Register bytes past the message.
        _position_tables[width] = x
    return x


def update_many(values: Sequence[int], pieces: Sequence[Sequence[BytesLike]]) -> list[int]:
    """`[update(values[i], b"".join(pieces[i])) for i in range(len(values))]`, computed
    together (see the module docstring)."""
    if len(values) != len(pieces):
        raise ValueError("update_many: as many values as sequences of pieces are needed")
    counts = [len(p) for p in pieces]
    total = sum(counts)
    if total < MIN_VECTOR_PIECES or not _numpy():
        return [update(v, b"".join(p)) for v, p in zip(values, pieces, strict=True)]
    order = sorted(range(len(values)), key=counts.__getitem__, reverse=True)
    flat = list(itertools.chain.from_iterable(pieces[i] for i in order))
    lens = np.fromiter(map(len, flat), dtype=np.intp, count=total)
    longest = int(lens.max())
    if longest > MAX_VECTOR_PIECE:
        return [update(v, b"".join(p)) for v, p in zip(values, pieces, strict=True)]
    width = max(8, (longest + 7) & ~7)
    x = _positions(width)
    raw = _raw_crcs(flat, lens, width, x)
    # Registers of the streams in `order`, advanced one piece per round.
    sorted_counts = [counts[i] for i in order]
    starts = np.zeros(len(order), dtype=np.intp)
    np.cumsum(sorted_counts[:-1], out=starts[1:])
    regs = np.array([values[i] for i in order], dtype=np.uint64) ^ np.uint64(_MASK)
    # X rows of a piece's register bytes: (8, 1) when every piece has one length, else
    # (8, pieces), indexed by piece below.
    eight = np.arange(8, dtype=np.intp)[:, None]
    uniform = bool((lens == lens[0]).all())
    shift = eight + (width - int(lens[0])) if uniform else eight + (width - lens)
    active = len(order)
    # Register bytes, least significant first, as (8, streams) rows.
    byte_order = slice(None) if sys.byteorder == "little" else slice(None, None, -1)
    for k in range(sorted_counts[0]):
        while active and sorted_counts[active - 1] <= k:
            active -= 1
        if active < MIN_VECTOR_STREAMS:
            _finish_scalar(regs, raw, lens, starts, sorted_counts, active, k, width, x)
            break
        idx = starts[:active] + k
        regbytes = regs[:active].view(np.uint8).reshape(active, 8)[:, byte_order].T
        rows = shift if uniform else shift[:, idx]
        regs[:active] = np.bitwise_xor.reduce(x[rows, regbytes], axis=0) ^ raw[idx]
    out = list(values)
    for i, reg in zip(order, (regs ^ np.uint64(_MASK)).tolist(), strict=True):
        out[i] = reg
    return out


def _raw_crcs(flat: list[BytesLike], lens: Any, width: int, x: Any) -> Any:
    """B of the module docstring for every piece: uint64 array."""
    total = len(flat)
    raw = np.empty(total, dtype=np.uint64)
    cols = np.arange(width, dtype=np.intp)[:, None]
    for lo in range(0, total, _SLAB):
        hi = min(total, lo + _SLAB)
        data = np.frombuffer(b"".join(flat[lo:hi]), dtype=np.uint8)
        slab_lens = lens[lo:hi]
        if data.size == (hi - lo) * width:  # Every piece is `width` bytes long.
            msgs = data.reshape(hi - lo, width)
        else:  # Left-pad each piece with zeros to `width` bytes.
            msgs = np.zeros((hi - lo, width), dtype=np.uint8)
            ends = np.cumsum(slab_lens)
            within = np.arange(data.size, dtype=np.intp) - np.repeat(ends - slab_lens, slab_lens)
            rows = np.repeat(np.arange(hi - lo, dtype=np.intp), slab_lens)
            msgs[rows, np.repeat(width - slab_lens, slab_lens) + within] = data
        # (width, pieces): the reduction runs over contiguous rows.
        raw[lo:hi] = np.bitwise_xor.reduce(x[cols, msgs.T], axis=0)
    return raw


def _finish_scalar(
    regs: Any,
    raw: Any,
    lens: Any,
    starts: Any,
    counts: list[int],
    active: int,
    k: int,
    width: int,
    x: Any,
) -> None:
    """Advance the first `active` registers through their pieces from round `k` on, one
    piece at a time in Python (the few streams left are not worth numpy's overhead)."""
    if not active:
        return
    rows = {}
    raw_list = raw.tolist()
    shifts = (width - lens).tolist()
    for s in range(active):
        reg = int(regs[s])
        base = int(starts[s])
        for i in range(base + k, base + counts[s]):
            p = shifts[i]
            t = rows.get(p)
            if t is None:
                t = rows[p] = x[p : p + 8].tolist()
            t0, t1, t2, t3, t4, t5, t6, t7 = t
            reg = (
                raw_list[i]
                ^ t0[reg & 0xFF]
                ^ t1[(reg >> 8) & 0xFF]
                ^ t2[(reg >> 16) & 0xFF]
                ^ t3[(reg >> 24) & 0xFF]
                ^ t4[(reg >> 32) & 0xFF]
                ^ t5[(reg >> 40) & 0xFF]
                ^ t6[(reg >> 48) & 0xFF]
                ^ t7[reg >> 56]
            )
        regs[s] = reg
