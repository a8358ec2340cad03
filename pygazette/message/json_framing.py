"""JSON lines (`application/x-ndjson`): one JSON document per line, encoded with orjson.

Messages are JSON objects (dicts; dataclasses and other types orjson encodes are written too)
whose UUID is a string field, "uuid" unless configured otherwise. Go messages written by
Gazette typically name the field "UUID", and Go's JSON decoding matches a field's name
regardless of case (the last such key of a document wins): so when a document has no key
spelled exactly as the field, a key equal to it but for case is its UUID when reading.

A line of JSON white space only is blank: it holds no message and readers skip it (as Spark's
JSON reader does). Gazette's Go reader instead fails on it ("unexpected end of JSON input");
skipping loses nothing and keeps one stray blank line from stopping every reader. Any other
line that is not JSON is a `MessageDecodeError`.

Strings holding invalid UTF-8 or a lone UTF-16 surrogate escape ("\\ud83d", as JavaScript
writes a string cut within a surrogate pair) are read as Go's encoding/json reads them: each
bad sequence becomes U+FFFD. orjson refuses such documents, so they are decoded again, more
slowly, with the standard library (`go_loads`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, MutableSequence, Sequence
from typing import Any

import orjson

from pygazette.message.envelope import Envelope
from pygazette.message.framing import (
    CONTENT_TYPE_JSON_LINES,
    LINE_DELIMITER,
    Framing,
    MessageDecodeError,
    register_framing,
)
from pygazette.message.uuid import TICK, UUIDFormatter, parse_uuid_text

_APPEND_NEWLINE = orjson.OPT_APPEND_NEWLINE

# JSON's insignificant white space (RFC 8259).
JSON_WHITESPACE = b" \t\n\r"


_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _replace_surrogates(value: Any) -> Any:
    if type(value) is str:
        return _SURROGATE.sub("\ufffd", value)
    if type(value) is list:
        return [_replace_surrogates(v) for v in value]
    if type(value) is dict:
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in value.items()}
    return value


def go_loads(payload: bytes) -> Any:
    """A JSON document decoded as Go's encoding/json decodes it: in strings, invalid UTF-8
    and lone surrogate escapes become U+FFFD (orjson refuses them). Raises ValueError (a
    json.JSONDecodeError) where Go fails too."""
    text = payload.decode("utf-8", "replace")
    value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    return _replace_surrogates(value)


def _loads(payload: bytes) -> Any:
    """orjson.loads, then `go_loads` for a document orjson refuses; raises the orjson error
    if Go would refuse it too."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        try:
            return go_loads(payload)
        except (ValueError, RecursionError):
            raise exc from None


class JSONFraming(Framing):
    """Newline-delimited JSON, with the message UUID in field `uuid_field`."""

    content_type = CONTENT_TYPE_JSON_LINES
    overhead = len(LINE_DELIMITER)
    blank_lead = JSON_WHITESPACE
    line_delimiter = LINE_DELIMITER
    frame_terminator = LINE_DELIMITER

    def __init__(
        self,
        uuid_field: str = "uuid",
        *,
        decode: Callable[[Any], Any] | None = None,
        default: Callable[[Any], Any] | None = None,
    ) -> None:
        """`decode` maps each decoded JSON value to a message (an exception it raises is a
        MessageDecodeError of that frame; note that it also sees ACK_TXN messages, objects
        holding only the UUID field); `default` encodes values orjson does not know (as
        orjson's `default`)."""
        if not uuid_field:
            raise ValueError("empty UUID field name")
        self.uuid_field = uuid_field
        self._folded_field = uuid_field.casefold()
        self.decode = decode
        self.default = default

    # Writing ------------------------------------------------------------------------------

    def marshal(self, msg: Any) -> bytes:
        try:
            return orjson.dumps(msg, default=self.default, option=_APPEND_NEWLINE)
        except orjson.JSONEncodeError as exc:
            raise MessageDecodeError(f"cannot encode message as JSON: {exc}") from None

    def set_uuid(self, msg: Any, uuid_text: str) -> None:
        if isinstance(msg, dict):
            msg[self.uuid_field] = uuid_text
        else:
            setter = getattr(msg, "set_uuid", None)
            if setter is not None:
                setter(uuid_text)
            else:
                setattr(msg, self.uuid_field, uuid_text)

    def new_acknowledgement(self, msg: Any, journal: str) -> Any:
        make = getattr(msg, "new_acknowledgement", None)
        if make is not None and not isinstance(msg, dict):
            return make(journal)
        return {self.uuid_field: ""}

    def marshal_sequence(
        self, msgs: Sequence[Any], formatter: UUIDFormatter, first_clock: int, flags: int
    ) -> bytes:
        field = self.uuid_field
        dumps = orjson.dumps
        default = self.default
        fmt = formatter.format
        if len(msgs) == 1:  # One message (a large one, often): its frame, not a copy of it.
            msg = msgs[0]
            if type(msg) is dict:
                msg[field] = fmt(first_clock, flags)
            else:
                self.set_uuid(msg, fmt(first_clock, flags))
            try:
                return dumps(msg, default=default, option=_APPEND_NEWLINE)
            except orjson.JSONEncodeError as exc:
                raise MessageDecodeError(f"cannot encode message as JSON: {exc}") from None
        out = bytearray()
        clock = first_clock
        i, n = 0, len(msgs)
        while i < n:
            # Within a segment only the low 32 bits of the clock's timestamp change, so
            # the rest of the UUID text is formatted once.
            head = fmt(clock, flags)
            rest = head[8:]
            room = ((1 << 36) - (clock & ((1 << 36) - 1)) + TICK - 1) // TICK
            stop = min(n, i + room)
            low = (clock >> 4) & 0xFFFFFFFF
            step = TICK >> 4
            try:
                for msg in msgs[i:stop]:
                    if type(msg) is dict:
                        msg[field] = f"{low:08x}{rest}"
                    else:
                        self.set_uuid(msg, f"{low:08x}{rest}")
                    out += dumps(msg, default=default, option=_APPEND_NEWLINE)
                    low += step
            except orjson.JSONEncodeError as exc:
                raise MessageDecodeError(f"cannot encode message as JSON: {exc}") from None
            clock += (stop - i) * TICK
            i = stop
        return bytes(out)

    # Reading ------------------------------------------------------------------------------

    def split(self, data: bytes) -> tuple[list[bytes], int]:
        parts = data.split(LINE_DELIMITER)
        rest = parts.pop()
        return parts, len(data) - len(rest)

    def is_blank(self, payload: bytes) -> bool:
        return not payload.strip(JSON_WHITESPACE)

    def unmarshal(self, payload: bytes) -> Any:
        try:
            value = _loads(payload)
        except orjson.JSONDecodeError as exc:
            raise MessageDecodeError(f"invalid JSON: {exc}") from None
        if self.decode is None:
            return value
        try:
            return self.decode(value)
        except MessageDecodeError:
            raise
        except Exception as exc:
            # An error of this frame alone (readers report it and read on), not of the read.
            raise MessageDecodeError(f"decode failed: {exc!r}") from exc

    def envelopes(
        self,
        payloads: list[bytes],
        journal: str,
        pos: int,
        out: MutableSequence[Envelope | BaseException],
    ) -> int:
        if self.decode is not None:
            return super().envelopes(payloads, journal, pos, out)
        # The generic loop, specialized for JSON objects (the hot path of readers).
        loads = orjson.loads
        field = self.uuid_field
        get_uuid = self.get_uuid
        is_blank = self.is_blank
        append = out.append
        for payload in payloads:
            end = pos + len(payload) + 1
            try:
                msg = loads(payload)
                text = msg.get(field) if type(msg) is dict else None
                if not text:
                    text = get_uuid(msg)
                if text is None:
                    append(Envelope(journal, pos, end, msg))
                else:
                    if type(text) is not str:
                        raise MessageDecodeError(f"UUID field is not a string: {text!r}")
                    producer, clock, flags = parse_uuid_text(text)
                    append(Envelope(journal, pos, end, msg, producer, clock, flags))
            except orjson.JSONDecodeError:
                if not is_blank(payload):
                    # Maybe a document Go reads and orjson refuses (see `go_loads`): the
                    # generic loop decodes it through `unmarshal`, or reports its error.
                    Framing.envelopes(self, [payload], journal, pos, out)
            except MessageDecodeError as exc:
                append(MessageDecodeError(exc.detail, journal=journal, begin=pos, end=end))
            except ValueError as exc:  # A malformed UUID.
                append(MessageDecodeError(str(exc), journal=journal, begin=pos, end=end))
            pos = end
        return pos

    def get_uuid(self, msg: Any) -> str | None:
        if isinstance(msg, dict):
            value = msg.get(self.uuid_field)
            if value is None:
                # As Go's encoding/json: a key equal to the field's name but for case (the
                # document's last one).
                folded = self._folded_field
                for key in reversed(msg):
                    if type(key) is str and key.casefold() == folded:
                        value = msg[key]
                        break
        else:
            getter = getattr(msg, "get_uuid", None)
            value = getter() if getter is not None else getattr(msg, self.uuid_field, None)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise MessageDecodeError(f"UUID field is not a string: {value!r}")
        return value

    def __repr__(self) -> str:
        return f"JSONFraming(uuid_field={self.uuid_field!r})"


register_framing(JSONFraming())
