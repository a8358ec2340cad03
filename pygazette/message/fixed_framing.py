"""Gazette's fixed framing (`application/x-protobuf-fixed`): each frame is the magic word
66 33 93 36, a 4-byte little-endian payload length, then the payload (a marshaled
protobuf message). The header layout, `encode_fixed_frame` and the walk over frame headers
(`fixed_frame_starts`, `check_fixed_header`) are shared with the Spark connector's scanner.

Without a message class, payloads are raw bytes (what `journals append --framing fixed`
moves). With a protobuf message class, messages are instances of it and their UUID lives in
a field of the message: a string field holds the canonical text, a bytes field the 16 raw
bytes.
"""

from __future__ import annotations

import struct
import uuid as _uuid
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from pygazette.message.framing import (
    CONTENT_TYPE_PROTO_FIXED,
    FrameDesync,
    Framing,
    MessageDecodeError,
    register_framing,
)

FIXED_FRAME_WORD = b"\x66\x33\x93\x36"
# The header: the magic word, then the payload length (little-endian uint32).
FIXED_FRAME_HEADER = struct.Struct("<4sI")
FIXED_FRAME_HEADER_LENGTH = FIXED_FRAME_HEADER.size
# A frame this large is taken as a sign of corruption, not a message.
MAX_FRAME_LENGTH = 1 << 30


def encode_fixed_frame(payload: bytes) -> bytes:
    """A fixed frame holding `payload`."""
    if len(payload) > MAX_FRAME_LENGTH:
        raise MessageDecodeError(
            f"payload of {len(payload)} bytes is larger than a frame may be ({MAX_FRAME_LENGTH})"
        )
    return FIXED_FRAME_HEADER.pack(FIXED_FRAME_WORD, len(payload)) + bytes(payload)


def fixed_frame_starts(data: bytes) -> tuple[list[int], int]:
    """Where the whole frames at the front of `data` begin, and the offset just past the
    last of them: there the content ends, a frame is incomplete, or the bytes are not a
    frame header (`check_fixed_header` tells which)."""
    starts: list[int] = []
    pos = 0
    n = len(data)
    unpack = FIXED_FRAME_HEADER.unpack_from
    while n - pos >= FIXED_FRAME_HEADER_LENGTH:
        word, size = unpack(data, pos)
        if word != FIXED_FRAME_WORD or size > MAX_FRAME_LENGTH:
            break
        end = pos + FIXED_FRAME_HEADER_LENGTH + size
        if end > n:
            break
        starts.append(pos)
        pos = end
    return starts, pos


def check_fixed_header(data: bytes, pos: int) -> None:
    """Raise `FrameDesync` if a whole header at `pos` is not a frame header (a wrong magic
    word, or an implausible length); `skip` then reaches the next magic word after `pos`."""
    if len(data) - pos < FIXED_FRAME_HEADER_LENGTH:
        return
    word, size = FIXED_FRAME_HEADER.unpack_from(data, pos)
    if word == FIXED_FRAME_WORD and size <= MAX_FRAME_LENGTH:
        return
    nxt = data.find(FIXED_FRAME_WORD, pos + 1)
    skip = (nxt if nxt != -1 else len(data) - (len(FIXED_FRAME_WORD) - 1)) - pos
    if word != FIXED_FRAME_WORD:
        raise FrameDesync(
            skip,
            f"detected de-synchronization: expected {FIXED_FRAME_WORD.hex()}, "
            f"found {bytes(word).hex()}",
        )
    raise FrameDesync(skip, f"implausible frame length {size}")


class FixedFraming(Framing):
    """Fixed-framed payloads: raw bytes, or messages of `message_class` (protobuf)."""

    content_type = CONTENT_TYPE_PROTO_FIXED
    overhead = FIXED_FRAME_HEADER_LENGTH
    # As Gazette's UnpackFixedFrame, which takes one trailing newline for the content's end
    # ("helped with Hadoop streaming").
    final_newline = True

    def __init__(
        self, message_class: type[Message] | None = None, uuid_field: str = "uuid"
    ) -> None:
        self.message_class = message_class
        self.uuid_field = uuid_field
        self._uuid_is_bytes = False
        if message_class is not None:
            field = message_class.DESCRIPTOR.fields_by_name.get(uuid_field)
            if field is None:
                raise ValueError(f"{message_class.__name__} has no field {uuid_field!r}")
            if field.type == FieldDescriptor.TYPE_BYTES:
                self._uuid_is_bytes = True
            elif field.type != FieldDescriptor.TYPE_STRING:
                raise ValueError(f"UUID field {uuid_field!r} must be a string or bytes field")

    # Writing ------------------------------------------------------------------------------

    def marshal(self, msg: Any) -> bytes:
        if isinstance(msg, (bytes, bytearray, memoryview)):
            return encode_fixed_frame(bytes(msg))
        if isinstance(msg, Message):
            return encode_fixed_frame(msg.SerializeToString())
        raise MessageDecodeError(
            f"fixed framing writes bytes or protobuf messages, not {type(msg).__name__}"
        )

    def set_uuid(self, msg: Any, uuid_text: str) -> None:
        if not isinstance(msg, Message):
            raise MessageDecodeError(f"a {type(msg).__name__} message cannot carry a UUID")
        value: str | bytes = _uuid.UUID(uuid_text).bytes if self._uuid_is_bytes else uuid_text
        setattr(msg, self.uuid_field, value)

    def new_acknowledgement(self, msg: Any, journal: str) -> Any:
        if not isinstance(msg, Message):
            raise MessageDecodeError(f"a {type(msg).__name__} message cannot be acknowledged")
        return type(msg)()

    # Reading ------------------------------------------------------------------------------

    def frame_size(self, data: bytes | memoryview) -> int | None:
        if len(data) < FIXED_FRAME_HEADER_LENGTH:
            return None
        word, size = FIXED_FRAME_HEADER.unpack_from(data, 0)
        if word != FIXED_FRAME_WORD or size > MAX_FRAME_LENGTH:
            return None  # Not a header: `split` says so.
        return int(FIXED_FRAME_HEADER_LENGTH + size)

    def split(self, data: bytes) -> tuple[list[bytes], int]:
        starts, consumed = fixed_frame_starts(data)
        if not starts:
            check_fixed_header(data, 0)
            return [], 0
        header = FIXED_FRAME_HEADER_LENGTH
        ends = starts[1:]
        ends.append(consumed)
        return [data[s + header : e] for s, e in zip(starts, ends, strict=True)], consumed

    def unmarshal(self, payload: bytes) -> Any:
        if self.message_class is None:
            return payload
        try:
            return self.message_class.FromString(payload)
        except DecodeError as exc:
            raise MessageDecodeError(f"invalid {self.message_class.__name__}: {exc}") from None

    def get_uuid(self, msg: Any) -> str | None:
        if not isinstance(msg, Message):
            return None
        value = getattr(msg, self.uuid_field)
        if not value:
            return None
        if isinstance(value, bytes):
            if len(value) != 16:
                raise MessageDecodeError(f"UUID field holds {len(value)} bytes, not 16")
            return str(_uuid.UUID(bytes=value))
        return str(value)

    def __repr__(self) -> str:
        cls = self.message_class.__name__ if self.message_class else "bytes"
        return f"FixedFraming({cls})"


register_framing(FixedFraming())
