"""Go's duration strings ("300ms", "1h30m0s"): parsing and formatting, as Go's time package
writes and reads them (specs in YAML, command-line flags)."""

from __future__ import annotations

import re

from pygazette.protocol.errors import ValidationError

__all__ = ["format_duration", "parse_duration", "parse_seconds"]

_NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|µs|μs|ms|s|m|h)")
_SECOND = 1_000_000_000


def parse_duration(text: str) -> int:
    """Nanoseconds of a Go duration string such as "300ms", "1.5h" or "2h45m"."""
    s = text.strip()
    if not s:
        raise ValidationError(f"invalid duration {text!r}")
    sign = 1
    if s[0] in "+-":
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValidationError(f"invalid duration {text!r}")
    total = 0
    pos = 0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None or not (m.group(1) or m.group(2)):
            raise ValidationError(
                f"invalid duration {text!r} (expected e.g. 30s, 5m, 1h30m, 250ms)"
            )
        whole, frac, unit = m.group(1) or "0", m.group(2) or "", m.group(3)
        scale = _NS_PER_UNIT[unit]
        total += int(whole) * scale
        if frac:
            total += int(frac) * scale // 10 ** len(frac)
        pos = m.end()
    return sign * total


def parse_seconds(text: str) -> float:
    """Seconds of a command-line duration: a Go duration ("20s", "1m30s", "500ms") or a bare
    number of seconds ("2.5")."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    return parse_duration(text) / 1e9


def _fraction(value: int, unit: int) -> str:
    """`value / unit` in decimal, without trailing zeros."""
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{rest:0{digits}d}".rstrip("0")


def format_duration(ns: int) -> str:
    """A Go-style duration string: "0s", "250ms", "1m0s", "1h30m0s", "1.5s"."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{_fraction(u, 1_000)}µs"
    if u < _SECOND:
        return f"{sign}{_fraction(u, 1_000_000)}ms"
    out = _fraction(u % (60 * _SECOND), _SECOND) + "s"
    minutes = u // (60 * _SECOND)
    if minutes:
        out = f"{minutes % 60}m{out}"
        hours = minutes // 60
        if hours:
            out = f"{hours}h{out}"
    return sign + out
