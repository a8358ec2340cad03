"""Message UUIDs, bit-for-bit compatible with Gazette's (RFC 4122, version 1).

A message UUID names its producer and orders the producer's messages:

    bytes 0-3    low 32 bits of the 60-bit timestamp        (big-endian)
    bytes 4-5    middle 16 bits of the timestamp
    bytes 6-7    high 12 bits of the timestamp, version 1 in the top nibble
    bytes 8-9    variant 0b10, a 4-bit sequence counter, then 10 bits of flags
    bytes 10-15  producer ID: 6 random bytes with the multicast bit set

A `Clock` is the 60-bit timestamp (100 ns units since 1582-10-15) shifted left by four, plus
the 4-bit counter in the low bits; a producer's clocks only ever grow, so (producer, clock)
orders and de-duplicates its messages. The flags say how a message takes part in a
transaction: OUTSIDE_TXN (commits on its own), CONTINUE_TXN (commits with a later ACK_TXN
of a larger clock), ACK_TXN (commits every CONTINUE_TXN before it with a smaller clock, and
rolls back those with a larger one).

The hot paths format and parse the canonical text form directly (`UUIDFormatter`,
`parse_uuid_text`), since building `uuid.UUID` objects costs microseconds per message.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid as _uuid
from typing import Final

__all__ = [
    "ACK_TXN",
    "CONTINUE_TXN",
    "G1582NS100",
    "OUTSIDE_TXN",
    "TICK",
    "Clock",
    "UUIDFormatter",
    "build_uuid",
    "clock_from_time_ns",
    "clock_to_time_ns",
    "flags_name",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "new_producer_id",
    "parse_uuid_text",
    "producer_id_hex",
    "uuid_parts",
]

# Message is not part of a transaction and is processed at once.
OUTSIDE_TXN: Final = 0x0
# Message begins or continues a transaction: processed only after an ACK_TXN with a larger clock.
CONTINUE_TXN: Final = 0x1
# Message commits every CONTINUE_TXN before it with a smaller clock (and rolls back larger ones).
ACK_TXN: Final = 0x2

MAX_FLAGS: Final = 0x3FF
# 100 ns intervals between the Gregorian reform (1582-10-15, RFC 4122's epoch) and 1970-01-01.
G1582NS100: Final = 122192928000000000
# One Clock tick: one microsecond (ten 100 ns units) above the 4-bit counter.
TICK: Final = 10 << 4

_MASK64: Final = (1 << 64) - 1

_FLAG_NAMES = {OUTSIDE_TXN: "OUTSIDE_TXN", CONTINUE_TXN: "CONTINUE_TXN", ACK_TXN: "ACK_TXN"}


def flags_name(flags: int) -> str:
    """Gazette's name of a flags value: OUTSIDE_TXN, CONTINUE_TXN, ACK_TXN or Flags(<hex>)."""
    return _FLAG_NAMES.get(flags, f"Flags({flags:x})")


def new_producer_id() -> bytes:
    """Six random bytes with the multicast bit set (so it is never a real MAC address)."""
    raw = bytearray(os.urandom(6))
    raw[0] |= 0x01
    return bytes(raw)


def _check_producer(producer: bytes) -> bytes:
    if len(producer) != 6:
        raise ValueError(f"producer ID must be 6 bytes, not {len(producer)}")
    return bytes(producer)


def producer_id_hex(producer: bytes) -> str:
    return _check_producer(producer).hex()


def clock_from_time_ns(unix_ns: int) -> int:
    """The Clock of a Unix time in nanoseconds (precise to 100 ns; counter zero)."""
    # Go's integer division truncates toward zero; times before 1970 are not expected.
    ticks = int(unix_ns / 100) if unix_ns < 0 else unix_ns // 100
    return ((ticks + G1582NS100) << 4) & _MASK64


def clock_to_time_ns(clock: int) -> int:
    """The Unix time, in nanoseconds, of a Clock (its counter is ignored)."""
    return ((clock >> 4) - G1582NS100) * 100


class Clock:
    """A producer's monotonic clock: `update` it from wall time, `tick` it per message.

    `tick` advances by one microsecond, so a producer may publish a million messages per
    second before its clock runs ahead of wall time. Thread-safe.
    """

    __slots__ = ("_lock", "value")

    def __init__(self, value: int = 0) -> None:
        if not 0 <= value <= _MASK64:
            raise ValueError(f"clock {value} out of range")
        self.value = value
        self._lock = threading.Lock()

    @classmethod
    def from_time_ns(cls, unix_ns: int) -> Clock:
        return cls(clock_from_time_ns(unix_ns))

    def update(self, unix_ns: int | None = None) -> None:
        """Move the clock up to `unix_ns` (default: now). It never moves backwards, and a
        move resets the counter."""
        nxt = clock_from_time_ns(time.time_ns() if unix_ns is None else unix_ns)
        with self._lock:
            if nxt > self.value:
                self.value = nxt

    def tick(self) -> int:
        """Advance by one microsecond and return the new value."""
        with self._lock:
            self.value = (self.value + TICK) & _MASK64
            return self.value

    def tick_many(self, n: int) -> int:
        """Reserve `n` consecutive ticks; returns the first (the others follow by `TICK`)."""
        with self._lock:
            first = (self.value + TICK) & _MASK64
            self.value = (self.value + n * TICK) & _MASK64
            return first

    def as_time_ns(self) -> int:
        return clock_to_time_ns(self.value)

    def __int__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"Clock({self.value})"


def _fields(clock: int, flags: int) -> tuple[int, int, int, int]:
    if not 0 <= flags <= MAX_FLAGS:
        raise ValueError(f"only the 10 low bits may be used for flags (got {flags:#x})")
    return (
        (clock >> 4) & 0xFFFFFFFF,
        (clock >> 36) & 0xFFFF,
        ((clock >> 52) & 0x0FFF) | 0x1000,
        ((clock << 10) & 0x3C00) | flags | 0x8000,
    )


def build_uuid(producer: bytes, clock: int, flags: int) -> _uuid.UUID:
    """The version-1 UUID of a producer, clock and flags, exactly as Gazette builds it."""
    low, mid, high, seq = _fields(clock, flags)
    raw = (
        low.to_bytes(4, "big")
        + mid.to_bytes(2, "big")
        + high.to_bytes(2, "big")
        + seq.to_bytes(2, "big")
        + _check_producer(producer)
    )
    return _uuid.UUID(bytes=raw)


def _raw(u: _uuid.UUID | bytes) -> bytes:
    raw = u.bytes if isinstance(u, _uuid.UUID) else bytes(u)
    if len(raw) != 16:
        raise ValueError(f"a UUID is 16 bytes, not {len(raw)}")
    return raw


def get_producer_id(u: _uuid.UUID | bytes) -> bytes:
    return _raw(u)[10:]


def get_clock(u: _uuid.UUID | bytes) -> int:
    raw = _raw(u)
    return (
        (int.from_bytes(raw[0:4], "big") << 4)
        | (int.from_bytes(raw[4:6], "big") << 36)
        | (int.from_bytes(raw[6:8], "big") << 52)
        | ((raw[8] >> 2) & 0xF)
    ) & _MASK64


def get_flags(u: _uuid.UUID | bytes) -> int:
    raw = _raw(u)
    return int.from_bytes(raw[8:10], "big") & MAX_FLAGS


def uuid_parts(u: _uuid.UUID | bytes) -> tuple[bytes, int, int]:
    """(producer, clock, flags) of a UUID."""
    return get_producer_id(u), get_clock(u), get_flags(u)


class UUIDFormatter:
    """Formats the canonical text of one producer's UUIDs, fast.

    Only the low 32 clock bits change from one tick to the next, so the rest of the text is
    cached. Not thread-safe on its own; callers serialize their ticks anyway.
    """

    __slots__ = ("_high", "_high_text", "_node", "_tails", "producer")

    def __init__(self, producer: bytes) -> None:
        self.producer = _check_producer(producer)
        self._node = self.producer.hex()
        self._high = -1
        self._high_text = ""
        # (counter, flags) -> "-<seq+flags>-<node>"
        self._tails: dict[int, str] = {}

    def format(self, clock: int, flags: int) -> str:
        high = clock >> 36
        if high != self._high:
            self._high_text = f"-{high & 0xFFFF:04x}-{((high >> 16) & 0x0FFF) | 0x1000:04x}"
            self._high = high
        key = ((clock & 0xF) << 10) | flags
        tail = self._tails.get(key)
        if tail is None:
            _fields(clock, flags)  # Validates the flags.
            tail = f"-{key | 0x8000:04x}-{self._node}"
            self._tails[key] = tail
        return f"{(clock >> 4) & 0xFFFFFFFF:08x}{self._high_text}{tail}"

    def uuid(self, clock: int, flags: int) -> _uuid.UUID:
        return build_uuid(self.producer, clock, flags)


_HEX = frozenset("0123456789abcdefABCDEF")
_CANONICAL = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
).fullmatch


# Canonical UUID texts by all but their first 8 characters (the low 32 bits of the
# timestamp): (producer, the timestamp's high 28 bits shifted into place, the clock's
# 4-bit counter, flags). A producer's UUIDs differ only in those 8 characters for minutes
# at a time, so most texts parse with one lookup and one int() of 8 hex digits.
_SUFFIXES: dict[str, tuple[bytes, int, int, int]] = {}
_MAX_SUFFIXES = 4096


def parse_uuid_text(text: str) -> tuple[bytes, int, int]:
    """(producer, clock, flags) of a UUID's text form.

    Accepts the canonical 36-character form (any case), and the other forms Go's uuid.Parse
    accepts: 32 hex digits, "{...}" and "urn:uuid:...". Raises ValueError otherwise.
    """
    if len(text) == 36:
        parts = _SUFFIXES.get(text[8:])
        if parts is not None:
            low = text[:8]
            # int() would also take signs, white space, underscores, non-ASCII digits and a
            # "0x" prefix.
            if low.isascii() and low.isalnum() and low[1] not in "xX":
                try:
                    ts_low = int(low, 16)
                except ValueError:
                    pass  # Not hex: the full parse below raises.
                else:
                    producer, ts_high, counter, flags = parts
                    return producer, ((ts_high | ts_low) << 4) | counter, flags
    else:
        text = _canonical(text)
    if _CANONICAL(text) is None:
        raise ValueError(f"invalid UUID {text!r}")
    # The 60-bit timestamp: high 12 bits (without the version nibble), middle, low.
    ts_high = int(text[15:18] + text[9:13], 16) << 32
    seq = int(text[19:23], 16)
    producer = bytes.fromhex(text[24:36])
    counter, flags = (seq >> 10) & 0xF, seq & MAX_FLAGS
    if len(_SUFFIXES) >= _MAX_SUFFIXES:
        _SUFFIXES.clear()
    _SUFFIXES[text[8:]] = (producer, ts_high, counter, flags)
    return producer, ((ts_high | int(text[0:8], 16)) << 4) | counter, flags


def _canonical(text: str) -> str:
    if len(text) == 45 and text[:9].lower() == "urn:uuid:":
        return text[9:]
    if len(text) == 38 and text[0] == "{" and text[-1] == "}":
        return text[1:-1]
    if len(text) == 32 and _HEX.issuperset(text):
        return f"{text[0:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"
    raise ValueError(f"invalid UUID {text!r}")
