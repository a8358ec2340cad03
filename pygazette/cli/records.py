"""Records on the command line: cutting CLI input into records (and the partition keys that
precede them) for `journals append`, and cutting journal content at message boundaries for
`journals read`, so that the output of several journals read at once never interleaves
within a message.

Framings are Gazette's: "lines" (newline-delimited; CSV records may span lines inside
quotes) and "fixed" (magic word + little-endian length + payload). Records keep their
delimiters and headers.
"""

from __future__ import annotations

import base64
import binascii

from pygazette.message.csv_framing import CSVFraming
from pygazette.message.fixed_framing import FIXED_FRAME_HEADER_LENGTH, FixedFraming
from pygazette.message.framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    FrameDesync,
)


class RecordError(ValueError):
    """Input that cannot be cut into records of its framing."""


class RecordSplitter:
    """Cuts a stream fed in arbitrary pieces into whole records of a framing."""

    def __init__(self, framing: str) -> None:
        if framing not in ("lines", "fixed"):
            raise ValueError(f"unknown record framing {framing!r}")
        self.framing = framing
        self._fixed = FixedFraming()
        self._pending = b""
        self.offset = 0  # Input offset of the pending bytes.

    def feed(self, chunk: bytes) -> list[bytes]:
        """The records completed by `chunk` (each with its delimiter or header)."""
        data = self._pending + chunk if self._pending else chunk
        if self.framing == "lines":
            parts = data.split(b"\n")
            rest = parts.pop()
            records = [p + b"\n" for p in parts]
        else:
            try:
                payloads, consumed = self._fixed.split(data)
            except FrameDesync as exc:
                raise RecordError(
                    f"input is not fixed-framed at byte {self.offset} ({exc})"
                ) from None
            header = FIXED_FRAME_HEADER_LENGTH
            records = []
            pos = 0
            for payload in payloads:
                end = pos + header + len(payload)
                records.append(data[pos:end])
                pos = end
            rest = data[consumed:]
        self.offset += len(data) - len(rest)
        self._pending = rest
        return records

    def whole(self, chunk: bytes) -> bytes:
        """Like `feed`, but the completed records joined as they were in the input."""
        data = self._pending + chunk if self._pending else chunk
        if self.framing == "lines":
            cut = data.rfind(b"\n") + 1
        else:
            self._pending = b""
            records = self.feed(data)
            return b"".join(records)
        self._pending = data[cut:]
        self.offset += cut
        return data[:cut]

    def finish(self) -> bytes:
        """The input ended: its unterminated last line (lines framing, may be b""). Raises
        RecordError for an incomplete fixed frame."""
        rest, self._pending = self._pending, b""
        if rest and self.framing == "fixed":
            raise RecordError(f"input ends within a fixed frame at byte {self.offset}")
        self.offset += len(rest)
        return rest

    def key(self, record: bytes, base64_keys: bool) -> bytes:
        """The partition key a key record holds."""
        if self.framing == "fixed":
            return record[FIXED_FRAME_HEADER_LENGTH:]
        key = record.rstrip(b"\r\n")
        if base64_keys:
            try:
                return base64.b64decode(key, validate=True)
            except (binascii.Error, ValueError):
                raise RecordError(f"partition key {key[:40]!r} is not base64") from None
        return key


class MessageAligner:
    """Holds back the incomplete tail of a journal's content, so that only whole messages
    are written out; content of an unknown framing passes through as is."""

    def __init__(self, content_type: str) -> None:
        self.content_type = content_type
        self._pending = b""
        self._csv = CSVFraming()
        self._fixed = FixedFraming()

    @property
    def aligned(self) -> bool:
        return self.content_type in (
            CONTENT_TYPE_JSON_LINES,
            CONTENT_TYPE_CSV,
            CONTENT_TYPE_PROTO_FIXED,
        )

    def feed(self, chunk: bytes) -> bytes:
        """The whole messages completed by `chunk`, as bytes to write."""
        ct = self.content_type
        if not self.aligned:
            return chunk
        data = self._pending + chunk if self._pending else chunk
        if ct == CONTENT_TYPE_JSON_LINES:
            cut = data.rfind(b"\n") + 1
        elif ct == CONTENT_TYPE_CSV:
            cut = self._csv.split(data)[1]
        else:
            cut = 0
            while True:
                try:
                    consumed = self._fixed.split(data[cut:])[1]
                except FrameDesync as exc:
                    cut += exc.skip  # Not frames: pass the bytes through.
                    continue
                cut += consumed
                break
        self._pending = data[cut:]
        return data[:cut]

    @property
    def held(self) -> int:
        """Bytes read but held back (not yet returned by `feed`)."""
        return len(self._pending)

    def finish(self) -> bytes:
        """The content ended: whatever is held back, as is."""
        rest, self._pending = self._pending, b""
        return rest
