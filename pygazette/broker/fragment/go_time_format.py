"""Go's time layouts (`time.Time.Format`), for path postfix templates.

A layout is text in which Go's reference time, Mon Jan 2 15:04:05 MST 2006, spelled in any of
its recognised forms, stands for the corresponding part of the time being formatted; every
other character is literal. Tokens are recognised left to right exactly where Go's layout
scanner recognises them (e.g. "_2006" is a literal underscore and the year; ".000" is
milliseconds only when no digit follows). Times here are UTC, as Gazette's spool
FirstAppendTime is.
"""

from __future__ import annotations

from datetime import UTC, datetime

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

# Zone tokens, longest first within each family, and their rendering for UTC.
_ZONES = (
    ("-070000", "+000000"),
    ("-07:00:00", "+00:00:00"),
    ("-0700", "+0000"),
    ("-07:00", "+00:00"),
    ("-07", "+00"),
    ("Z070000", "Z"),
    ("Z07:00:00", "Z"),
    ("Z0700", "Z"),
    ("Z07:00", "Z"),
    ("Z07", "Z"),
)


def go_time_format(t: datetime, layout: str) -> str:
    """`t` (converted to UTC) formatted with the Go layout `layout`."""
    t = t.astimezone(UTC)
    out: list[str] = []
    i, n = 0, len(layout)
    while i < n:
        token, width = _token_at(layout, i)
        if token is None:
            out.append(layout[i])
            i += 1
            continue
        out.append(_render(t, token, layout[i : i + width]))
        i += width
    return "".join(out)


def _token_at(layout: str, i: int) -> tuple[str | None, int]:
    """The layout token starting at `i` and its length, or (None, 1) for a literal."""
    rest = layout[i:]
    c = rest[0]
    # "Jan" and "Mon" followed by a lowercase letter are text ("Janitor", "Monthly"), as
    # Go's nextStdChunk reads them (startsWithLowerCase); "January" and "Monday" are not.
    if c == "J" and rest.startswith("Jan"):
        if rest.startswith("January"):
            return "January", 7
        if not _lower_at(rest, 3):
            return "Jan", 3
    if c == "M":
        if rest.startswith("Monday"):
            return "Monday", 6
        if rest.startswith("Mon") and not _lower_at(rest, 3):
            return "Mon", 3
        if rest.startswith("MST"):
            return "MST", 3
    if c == "0":
        if len(rest) >= 2 and rest[1] in "123456":
            return rest[:2], 2
        if rest.startswith("002"):
            return "002", 3
    if c == "1":
        return ("15", 2) if rest.startswith("15") else ("1", 1)
    if c == "2":
        return ("2006", 4) if rest.startswith("2006") else ("2", 1)
    if c == "_":
        if rest.startswith("_2006"):
            return None, 1  # A literal underscore; the year follows.
        if rest.startswith("__2"):
            return "__2", 3
        if rest.startswith("_2"):
            return "_2", 2
    if c in "345":
        return c, 1
    if rest.startswith("PM"):
        return "PM", 2
    if rest.startswith("pm"):
        return "pm", 2
    if c in "-Z":
        for token, _ in _ZONES:
            if rest.startswith(token):
                return token, len(token)
    if c in ".," and len(rest) >= 2 and rest[1] in "09":
        j = 1
        while j < len(rest) and rest[j] == rest[1]:
            j += 1
        if not (j < len(rest) and rest[j].isdigit()):
            return "frac", j
    return None, 1


def _lower_at(text: str, i: int) -> bool:
    """Whether `text[i]` is an ASCII lowercase letter (Go's startsWithLowerCase)."""
    return i < len(text) and "a" <= text[i] <= "z"


def _render(t: datetime, token: str, text: str) -> str:
    hour12 = t.hour % 12 or 12
    yday = t.timetuple().tm_yday
    simple = {
        "January": MONTHS[t.month - 1],
        "Jan": MONTHS[t.month - 1][:3],
        "Monday": DAYS[t.weekday()],
        "Mon": DAYS[t.weekday()][:3],
        "MST": "UTC",
        "01": f"{t.month:02d}",
        "02": f"{t.day:02d}",
        "03": f"{hour12:02d}",
        "04": f"{t.minute:02d}",
        "05": f"{t.second:02d}",
        "06": f"{t.year % 100:02d}",
        "002": f"{yday:03d}",
        "15": f"{t.hour:02d}",
        "1": str(t.month),
        "2006": f"{t.year:04d}",
        "2": str(t.day),
        "__2": f"{yday:3d}",
        "_2": f"{t.day:2d}",
        "3": str(hour12),
        "4": str(t.minute),
        "5": str(t.second),
        "PM": "PM" if t.hour >= 12 else "AM",
        "pm": "pm" if t.hour >= 12 else "am",
    }
    if token in simple:
        return simple[token]
    for zone, utc in _ZONES:
        if token == zone:
            return utc
    # Fractional seconds: ".000" fixed digits, ".999" with trailing zeros (and the
    # separator, when nothing is left) dropped.
    digits = len(text) - 1
    frac = f"{t.microsecond * 1000:09d}"[:digits]
    if text[1] == "9":
        frac = frac.rstrip("0")
        return text[0] + frac if frac else ""
    return text[0] + frac
