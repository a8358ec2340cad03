"""CSV (`text/csv`): one RFC 4180 record per message, the message UUID in its first column.

Records are written exactly as Go's encoding/csv writes them (which Gazette uses): fields
are quoted when they contain a comma, a quote, CR or LF, or begin with white space, and
records end with "\\n". A quoted field may span lines, so frames are found by tracking
quotes, not just newlines. Messages are lists of strings.

A record ends at the first newline outside quotes: one after an even number of quote
characters since the record began (in valid CSV a quote opens a field, closes it, or is
doubled inside it). An empty line, or one holding only the CR of a CRLF, is blank: Go's
csv.Reader skips it, and so do readers here.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from typing import Any

from pygazette.message.framing import (
    CONTENT_TYPE_CSV,
    LINE_DELIMITER,
    Framing,
    MessageDecodeError,
    register_framing,
)

QUOTE = b'"'
# The CR of a CRLF line end (part of the payload; unmarshaling drops it).
CARRIAGE_RETURN = b"\r"

# Go's unicode.IsSpace for the first rune of a field (Python's str.isspace also counts the
# information separators U+001C..U+001F, which Go does not).
_GO_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    chr(c) for c in range(0x2000, 0x200B)
)


def _needs_quotes(field: str) -> bool:
    if field == "":
        return False
    if field == "\\.":
        return True
    if "," in field or '"' in field or "\n" in field or "\r" in field:
        return True
    return field[0] in _GO_SPACE


def format_record(fields: Sequence[str]) -> str:
    """One CSV record, newline included, as Go's csv.Writer writes it."""
    out = []
    for field in fields:
        if not isinstance(field, str):
            raise MessageDecodeError(f"CSV fields must be strings, not {type(field).__name__}")
        if _needs_quotes(field):
            out.append('"' + field.replace('"', '""') + '"')
        else:
            out.append(field)
    return ",".join(out) + "\n"


class CSVFraming(Framing):
    """RFC 4180 CSV records, UUID in the first column."""

    content_type = CONTENT_TYPE_CSV
    overhead = len(LINE_DELIMITER)
    blank_lead = CARRIAGE_RETURN

    def marshal(self, msg: Any) -> bytes:
        if isinstance(msg, str) or not isinstance(msg, Sequence):
            raise MessageDecodeError(
                f"a CSV message is a list of strings, not {type(msg).__name__}"
            )
        if not msg:
            raise MessageDecodeError("a CSV message needs at least one field (its UUID)")
        return format_record(msg).encode()

    def set_uuid(self, msg: Any, uuid_text: str) -> None:
        if not isinstance(msg, list) or not msg:
            raise MessageDecodeError("a CSV message is a non-empty list (UUID first)")
        msg[0] = uuid_text

    def new_acknowledgement(self, msg: Any, journal: str) -> Any:
        return [""] * max(1, len(msg))

    # Reading ------------------------------------------------------------------------------

    def split(self, data: bytes) -> tuple[list[bytes], int]:
        lines = data.split(LINE_DELIMITER)
        lines.pop()  # Not terminated (yet).
        if QUOTE not in data:
            return lines, sum(len(x) + 1 for x in lines)
        frames: list[bytes] = []
        consumed = 0
        pending: list[bytes] = []
        in_quotes = False
        for line in lines:
            pending.append(line)
            if line.count(QUOTE) % 2:
                in_quotes = not in_quotes
            if not in_quotes:
                record = LINE_DELIMITER.join(pending)
                frames.append(record)
                consumed += len(record) + 1
                pending = []
        return frames, consumed

    def is_blank(self, payload: bytes) -> bool:
        return not payload or payload == CARRIAGE_RETURN

    def unmarshal(self, payload: bytes) -> Any:
        try:
            text = payload.decode()
        except UnicodeDecodeError as exc:
            raise MessageDecodeError(f"CSV record is not UTF-8: {exc.reason}") from None
        if text.endswith("\r"):
            text = text[:-1]  # A CRLF line end, as Go's reader drops it.
        try:
            rows = list(csv.reader([text], strict=True))
        except csv.Error as exc:
            raise MessageDecodeError(f"invalid CSV record: {exc}") from None
        if len(rows) != 1 or not rows[0]:
            raise MessageDecodeError("empty CSV record")
        if "\r" in text:
            # Go's reader drops a CR before an LF, within quoted fields too.
            return [f.replace("\r\n", "\n") for f in rows[0]]
        return rows[0]

    def get_uuid(self, msg: Any) -> str | None:
        if not msg or not msg[0]:
            return None
        value = msg[0]
        return value if isinstance(value, str) else None


register_framing(CSVFraming())
