"""Gazette's fixed framing (`application/x-protobuf-fixed`): each frame is the magic word
66 33 93 36, a 4-byte little-endian payload length, then the payload (a marshaled
protobuf message).

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
FIXED_FRAME_HEADER_LENGTH = 8
# A frame this large is taken as a sign of corruption, not a message.
MAX_FRAME_LENGTH = 1 << 30

_LENGTH = struct.Struct("<I")


def encode_fixed_frame(payload: bytes) -> bytes:
    """A fixed frame holding `payload`."""
    if len(payload) > 0xFFFFFFFF:
        raise MessageDecodeError(f"payload of {len(payload)} bytes is too large for a frame")
    return FIXED_FRAME_WORD + _LENGTH.pack(len(payload)) + bytes(payload)


class FixedFraming(Framing):
    """Fixed-framed payloads: raw bytes, or messages of `message_class` (protobuf)."""

    content_type = CONTENT_TYPE_PROTO_FIXED
    overhead = FIXED_FRAME_HEADER_LENGTH

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

    def split(self, data: bytes) -> tuple[list[bytes], int]:
        frames: list[bytes] = []
        pos = 0
        n = len(data)
        while n - pos >= FIXED_FRAME_HEADER_LENGTH:
            if not data.startswith(FIXED_FRAME_WORD, pos):
                if frames:
                    break  # Return the good frames first.
                nxt = data.find(FIXED_FRAME_WORD, 1)
                skip = nxt if nxt != -1 else n - (len(FIXED_FRAME_WORD) - 1)
                raise FrameDesync(skip)
            (size,) = _LENGTH.unpack_from(data, pos + 4)
            if size > MAX_FRAME_LENGTH:
                if frames:
                    break
                nxt = data.find(FIXED_FRAME_WORD, 1)
                skip = nxt if nxt != -1 else n - (len(FIXED_FRAME_WORD) - 1)
                raise FrameDesync(skip, f"implausible frame length {size}")
            end = pos + FIXED_FRAME_HEADER_LENGTH + size
            if end > n:
                break
            frames.append(data[pos + FIXED_FRAME_HEADER_LENGTH : end])
            pos = end
        return frames, pos

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
