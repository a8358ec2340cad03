"""CRC-64 as Go's `hash/crc64` computes it with `crc64.MakeTable(crc64.ECMA)`.

That is the reflected ECMA-182 polynomial (0xC96C5795D7870F42 in reflected form), with
the register inverted before and after each update (CRC-64/XZ): `update(0, b"123456789")`
is 0x995DC9BBDF1939FA. `update(crc, data)` continues a checksum exactly as Go's
`crc64.Update(crc, table, data)` does, so chunking never changes the final value:
`update(update(0, b"battery"), b" horse") == update(0, b"battery horse")`.

Pure Python, table driven "slice-by-8": each 8 bytes of input cost eight lookups into
eight 256-entry tables and one XOR of a 64-bit word (about 2.5 us per 32-byte chunk, 15
MB/s on large inputs), with a byte-at-a-time loop for the tail.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

BytesLike = bytes | bytearray | memoryview

__all__ = ["ECMA", "checksum", "update"]

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
