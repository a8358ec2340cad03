"""CSV (`text/csv`): one RFC 4180 record per message, the message UUID in its first column.

Records are written exactly as Go's encoding/csv writes them (which Gazette uses): fields
are quoted when they contain a comma, a quote, CR or LF, or begin with white space, and
records end with "\\n". A quoted field may span lines, so frames are found by tracking
quotes, not just newlines. Messages are lists of strings; bytes of a record that are not
UTF-8 (Go's reader takes any) are read as surrogate escapes, and written back as they were.

Records end where Go's csv.Reader ends them: at the first newline outside a quoted field
(one that begins with a quote). A quote anywhere else (a bare quote), or text after a quoted
field's closing quote, makes that record invalid, and it ends with its line: the records
after it are read on, as Go's reader does (they are not taken into it as if it had opened a
quoted field). An empty line, or one holding only the CR of a CRLF, is blank: Go's
csv.Reader skips it, and so do readers here.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Sequence
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


# A line that is a whole record by Go's rules: quoted fields (quotes within them doubled)
# and unquoted ones (without quotes) between commas, and maybe the CR of a CRLF.
_FIELD = rb'(?:"[^"]*(?:""[^"]*)*"|[^",\n]*)'
_WELL_FORMED_LINE = re.compile(_FIELD + rb"(?:," + _FIELD + rb")*\r?").fullmatch


# The text of a quoted field after its opening quote: up to its closing quote (the first
# quote not doubled), or to the end of the content. Unambiguous, so matched in linear time.
_QUOTED_TEXT = re.compile(rb'[^"]*(?:""[^"]*)*').match


def _quoted_text_end(data: bytes, pos: int) -> int:
    """Where the quoted text from `pos` ends: at its closing quote, or at the content's end."""
    match = _QUOTED_TEXT(data, pos)
    assert match is not None  # It matches empty text too.
    return match.end()


def record_end(data: bytes, pos: int) -> int:
    """Offset of the LF ending the record at `pos`, found as Go's csv.Reader does, or -1
    if `data` ends first. A quoted field is one that begins with a quote; a quote anywhere
    else is a bare quote (an error of that record alone, which ends at its line's end), as
    is text after a quoted field's closing quote."""
    n = len(data)
    while True:  # At the start of a field.
        if data[pos : pos + 1] != QUOTE:
            nl = data.find(LINE_DELIMITER, pos)
            stop = nl if nl >= 0 else n
            comma = data.find(b",", pos, stop)
            if comma < 0 or data.find(QUOTE, pos, comma) >= 0:
                return nl  # The record's last field, or a bare quote (Go's ErrBareQuote).
            pos = comma + 1
            continue
        # Within a quoted field: its closing quote is the first not doubled.
        quote = _quoted_text_end(data, pos + 1)
        if quote + 1 >= n:
            return -1  # Its end (or what follows it) is not here yet.
        after = data[quote + 1 : quote + 2]
        if after == b",":
            pos = quote + 2
        elif after == LINE_DELIMITER:
            return quote + 1
        elif after == CARRIAGE_RETURN and data[quote + 2 : quote + 3] in (LINE_DELIMITER, b""):
            # A CRLF line end (Go's reader reads it as LF), or not known yet.
            return quote + 2 if quote + 2 < n else -1
        else:
            return data.find(LINE_DELIMITER, quote + 1)  # Go's ErrQuote.


def _open_quote(data: bytes, pos: int) -> int:
    """Where the incomplete record at `pos` of `data` ends: within a quoted field, every
    quote so far doubled (0), or after a quote of one that the next byte tells the role of
    (1); -1 elsewhere, or where that is not known."""
    n = len(data)
    while True:  # At the start of a field.
        if data[pos : pos + 1] != QUOTE:
            nl = data.find(LINE_DELIMITER, pos)
            stop = nl if nl >= 0 else n
            comma = data.find(b",", pos, stop)
            if comma < 0 or data.find(QUOTE, pos, comma) >= 0:
                return -1  # The last field, or a bare quote: it ends at a newline.
            pos = comma + 1
            continue
        quote = _quoted_text_end(data, pos + 1)  # As in `record_end`.
        if quote >= n - 1:
            return n - quote
        if data[quote + 1 : quote + 2] != b",":
            return -1  # Its end, or what follows it, is here.
        pos = quote + 2


class _QuotedText:
    """Tells whether pieces of content continue a quoted field's text (every quote within
    them doubled): the record is then still incomplete. `pending`: the content so far ends
    with a quote whose role the next byte tells (a doubled quote's first half, or the
    field's closing quote)."""

    __slots__ = ("pending",)

    def __init__(self, pending: bool) -> None:
        self.pending = pending

    def __call__(self, content: bytes) -> bool:
        pos = 0
        if self.pending:
            if content[:1] != QUOTE:
                return False  # It closed the field.
            pos = 1
        end = _quoted_text_end(content, pos)
        n = len(content)
        if end < n - 1:
            return False  # A closing quote, and what follows it.
        self.pending = end == n - 1
        return True


def _go_fields(text: str) -> list[str]:
    """The fields of one record (its LFs all within quoted fields), as Go's csv.Reader reads
    them."""
    fields: list[str] = []
    pos, n = 0, len(text)
    while True:
        if text.startswith('"', pos):
            parts: list[str] = []
            pos += 1
            while True:
                quote = text.find('"', pos)
                if quote < 0:
                    raise MessageDecodeError(
                        'invalid CSV record: extraneous or missing " in quoted-field'
                    )
                parts.append(text[pos:quote])
                pos = quote + 1
                if text.startswith('"', pos):
                    parts.append('"')
                    pos += 1
                elif pos == n or text[pos] == ",":
                    break
                else:
                    raise MessageDecodeError(
                        'invalid CSV record: extraneous or missing " in quoted-field'
                    )
            fields.append("".join(parts))
        else:
            comma = text.find(",", pos)
            field = text[pos:] if comma < 0 else text[pos:comma]
            if '"' in field:
                raise MessageDecodeError('invalid CSV record: bare " in non-quoted-field')
            fields.append(field)
            pos = n if comma < 0 else comma
        if pos == n:
            return fields
        pos += 1  # Past the comma.


def _no_newline(content: bytes) -> bool:
    return content.find(LINE_DELIMITER) < 0


class CSVFraming(Framing):
    """RFC 4180 CSV records, UUID in the first column."""

    content_type = CONTENT_TYPE_CSV
    overhead = len(LINE_DELIMITER)
    frame_terminator = LINE_DELIMITER
    blank_lead = CARRIAGE_RETURN

    def marshal(self, msg: Any) -> bytes:
        if isinstance(msg, str) or not isinstance(msg, Sequence):
            raise MessageDecodeError(
                f"a CSV message is a list of strings, not {type(msg).__name__}"
            )
        if not msg:
            raise MessageDecodeError("a CSV message needs at least one field (its UUID)")
        try:
            # Bytes read as surrogate escapes (see `unmarshal`) are written back as they were.
            return format_record(msg).encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as exc:
            raise MessageDecodeError(f"CSV field is not valid Unicode: {exc.reason}") from None

    def set_uuid(self, msg: Any, uuid_text: str) -> None:
        if not isinstance(msg, list) or not msg:
            raise MessageDecodeError("a CSV message is a non-empty list (UUID first)")
        msg[0] = uuid_text

    def new_acknowledgement(self, msg: Any, journal: str) -> Any:
        return [""] * max(1, len(msg))

    # Reading ------------------------------------------------------------------------------

    def split(self, data: bytes) -> tuple[list[bytes], int]:
        quoted = QUOTE in data
        if quoted and record_end(data, 0) < 0:
            # The first record is not complete (a long one, read in pieces): nothing is, and
            # its lines are not split again.
            return [], 0
        lines = data.split(LINE_DELIMITER)
        lines.pop()  # Not terminated (yet).
        if not quoted:
            return lines, sum(len(x) + 1 for x in lines)
        frames: list[bytes] = []
        pos = 0  # Where the next record begins.
        start = 0  # Where the line begins.
        for line in lines:
            begin, start = start, start + len(line) + 1
            if begin < pos:
                continue  # A line of the last record (a quoted field spans lines).
            if QUOTE not in line or _WELL_FORMED_LINE(line) is not None:
                frames.append(line)  # The whole record, in one line.
                pos = start
                continue
            # A quoted field spanning lines, or a stray quote: Go's rules, field by field.
            end = record_end(data, begin)
            if end < 0:
                break  # Within a quoted field: the record is incomplete.
            frames.append(data[begin:end])
            pos = end + 1
        return frames, pos

    def stays_incomplete(self, data: bytes, pos: int) -> Callable[[bytes], bool] | None:
        state = _open_quote(data, pos)
        if state >= 0:  # Within a quoted field: so long as quoted text follows.
            return _QuotedText(pending=state == 1)
        return _no_newline

    def is_blank(self, payload: bytes) -> bool:
        return not payload or payload == CARRIAGE_RETURN

    def unmarshal(self, payload: bytes) -> Any:
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            # Go's csv.Reader takes fields of any bytes (a file in Latin-1 or cp1252, say):
            # those that are not UTF-8 are read as surrogate escapes (U+DC80-U+DCFF), as
            # os.fsdecode reads file names, and `marshal` writes them back as they were.
            text = payload.decode("utf-8", "surrogateescape")
        if text.endswith("\r"):
            text = text[:-1]  # A CRLF line end, as Go's reader drops it.
        if "\r" in text:
            # Python's csv module takes any CR for a line end; Go's reader only one before
            # an LF (which it drops, within quoted fields too).
            return _go_fields(text.replace("\r\n", "\n"))
        if len(text) > csv.field_size_limit():
            # Go's reader has no limit on a field's size; Python's csv module refuses one
            # larger than csv.field_size_limit() (128 KiB unless raised).
            return _go_fields(text)
        try:
            rows = list(csv.reader([text], strict=True))
        except csv.Error as exc:
            raise MessageDecodeError(f"invalid CSV record: {exc}") from None
        if len(rows) != 1 or not rows[0]:
            raise MessageDecodeError("empty CSV record")
        fields = rows[0]
        if '"' in text and any('"' in field for field in fields):
            # Python's csv module reads a quote within an unquoted field as text (even
            # strict), where Go's reader refuses the record (ErrBareQuote): a field holds
            # a quote, so the record is read by Go's rules unless it is well-formed (the
            # quote was a doubled one within a quoted field).
            if _WELL_FORMED_LINE(payload) is None:
                return _go_fields(text)
        return fields

    def get_uuid(self, msg: Any) -> str | None:
        if not msg or not msg[0]:
            return None
        value = msg[0]
        return value if isinstance(value, str) else None


register_framing(CSVFraming())
