"""`Framing`: how messages of a journal are written as bytes and found again, and the
registry of framings by the journal's `content-type` label.

A framing turns one message into one frame (`marshal`), splits a byte stream into frames
(`split`), says which frames are blank (`is_blank`: they hold no message and are skipped),
turns a frame back into a message (`unmarshal`), and reads and stamps the UUID a message
carries. A frame's length is always `len(payload) + overhead`, which is how readers know each
message's exact [begin, end) offsets.

These are the one definition of each framing's record rules in pygazette: the Spark
connector's vectorised scanner (`pygazette.spark.framing`) takes its delimiters, headers and
blank-line rule from here.

Content types, as Gazette registers them:

    application/x-ndjson           JSON lines         (`JSONFraming`)
    text/csv                       CSV, UUID first    (`CSVFraming`)
    application/x-protobuf-fixed   fixed framing      (`FixedFraming`)
"""

from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, MutableSequence, Sequence
from typing import Any, ClassVar

from pygazette.message.envelope import Envelope
from pygazette.message.uuid import TICK, UUIDFormatter, parse_uuid_text

__all__ = [
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_PROTO_FIXED",
    "LINE_DELIMITER",
    "FrameDesync",
    "Framing",
    "FramingError",
    "MessageDecodeError",
    "UnknownContentType",
    "framing_for",
    "register_framing",
]

CONTENT_TYPE_JSON_LINES = "application/x-ndjson"
CONTENT_TYPE_CSV = "text/csv"
CONTENT_TYPE_PROTO_FIXED = "application/x-protobuf-fixed"

# Frames of the line framings (JSON lines, CSV) end with it; it is part of no payload.
LINE_DELIMITER = b"\n"


class FramingError(ValueError):
    """Content that is not a valid frame or message of its framing."""


class MessageDecodeError(FramingError):
    """A complete frame whose payload does not decode as a message (or carries a malformed
    UUID). Readers raise it with the frame's offsets, then continue after the frame."""

    def __init__(self, detail: str, *, journal: str = "", begin: int = -1, end: int = -1) -> None:
        self.detail = detail
        self.journal = journal
        self.begin = begin
        self.end = end
        where = f"{journal}@{begin}-{end}: " if journal else ""
        super().__init__(f"{where}{detail}")


class FrameDesync(FramingError):
    """The stream is not at a frame boundary: `skip` bytes of it are not part of any frame
    (fixed framing finds the next frame by its magic word)."""

    def __init__(self, skip: int, detail: str = "detected de-synchronization") -> None:
        self.skip = skip
        self.detail = detail
        super().__init__(f"{detail} ({skip} bytes skipped)")


class UnknownContentType(FramingError):
    """No framing is registered for a journal's content-type label."""


class Framing(ABC):
    """Writes and reads the messages of one content type."""

    content_type: ClassVar[str]
    # Frame bytes beyond the payload that `split` returns (delimiters, headers).
    overhead: ClassVar[int]
    # A blank payload is empty or begins with one of these bytes (so a bulk scanner needs
    # to ask `is_blank` only of those).
    blank_lead: ClassVar[bytes] = b""
    # Set where every frame ends at the first occurrence of this delimiter (and `split`
    # returns payloads without it): an unpacker then finds a long message's end by looking
    # for it in new content only, without joining the held bytes first.
    line_delimiter: ClassVar[bytes | None] = None
    # Set where every frame ends with this delimiter, though it may also occur within one (a
    # quoted CSV field spanning lines): content without it completes no frame.
    frame_terminator: ClassVar[bytes | None] = None
    # Set where content may end with one newline after its last frame, which is then no
    # error (Gazette's fixed framing reads it so).
    final_newline: ClassVar[bool] = False

    # Writing ------------------------------------------------------------------------------

    @abstractmethod
    def marshal(self, msg: Any) -> bytes:
        """One complete frame holding `msg`."""

    @abstractmethod
    def set_uuid(self, msg: Any, uuid_text: str) -> None:
        """Stamp the message with a UUID, in its canonical text form."""

    @abstractmethod
    def new_acknowledgement(self, msg: Any, journal: str) -> Any:
        """A message of the same kind as `msg`, to carry an ACK_TXN UUID to `journal`."""

    def marshal_sequence(
        self, msgs: Sequence[Any], formatter: UUIDFormatter, first_clock: int, flags: int
    ) -> bytes:
        """Stamp `msgs` with UUIDs of consecutive clocks from `first_clock` (one `TICK`
        apart) and `flags`, and return their frames back to back."""
        out = bytearray()
        clock = first_clock
        fmt = formatter.format
        for msg in msgs:
            self.set_uuid(msg, fmt(clock, flags))
            out += self.marshal(msg)
            clock += TICK
        return bytes(out)

    # Reading ------------------------------------------------------------------------------

    def frame_size(self, data: bytes | memoryview) -> int | None:
        """The length of the frame `data` starts with, when its first bytes tell (a fixed
        frame's header); None if they don't (yet). An unpacker then holds the pieces of a
        long frame until all of it is here, rather than joining them at every piece."""
        return None

    def stays_incomplete(self, data: bytes, pos: int) -> Callable[[bytes], bool] | None:
        """For the incomplete frame at `pos` of `data`: a test of content following `data`
        that is True when the frame is still incomplete with it too (by default, content
        without `frame_terminator`), or None if the framing cannot tell. An unpacker then
        holds such pieces as they are, rather than joining and splitting the frame again at
        every piece (CSV: content within a quoted field spanning lines)."""
        terminator = self.frame_terminator
        if terminator is None:
            return None
        return lambda content: content.find(terminator) < 0

    @abstractmethod
    def split(self, data: bytes) -> tuple[list[bytes], int]:
        """The complete frames at the front of `data`: their payloads, and how many bytes
        of `data` they span. Raises `FrameDesync` if `data` does not start with a frame.
        Blank frames are returned too (they take up bytes); readers skip them."""

    def is_blank(self, payload: bytes) -> bool:
        """Whether a frame payload is blank: it holds no message, and readers skip it rather
        than report it. Only an empty payload or one beginning with a `blank_lead` byte can
        be blank."""
        return False

    def envelopes(
        self,
        payloads: list[bytes],
        journal: str,
        pos: int,
        out: MutableSequence[Envelope | BaseException],
    ) -> int:
        """Append an Envelope (or MessageDecodeError) for each frame payload that is not
        blank, the first beginning at offset `pos`; returns the offset after the last."""
        unmarshal = self.unmarshal
        is_blank = self.is_blank
        get_uuid = self.get_uuid
        overhead = self.overhead
        append = out.append
        for payload in payloads:
            end = pos + len(payload) + overhead
            try:
                msg = unmarshal(payload)
                text = get_uuid(msg)
                if text is None:
                    append(Envelope(journal, pos, end, msg))
                else:
                    producer, clock, flags = parse_uuid_text(text)
                    append(Envelope(journal, pos, end, msg, producer, clock, flags))
            except MessageDecodeError as exc:
                if not is_blank(payload):
                    append(MessageDecodeError(exc.detail, journal=journal, begin=pos, end=end))
            except ValueError as exc:  # A malformed UUID.
                append(MessageDecodeError(str(exc), journal=journal, begin=pos, end=end))
            pos = end
        return pos

    @abstractmethod
    def unmarshal(self, payload: bytes) -> Any:
        """The message of a frame payload; raises `MessageDecodeError`."""

    @abstractmethod
    def get_uuid(self, msg: Any) -> str | None:
        """The UUID text a message carries, or None (it then has at-least-once semantics)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


_REGISTRY: dict[str, Framing] = {}

# Gazette's framings register themselves when their modules are imported. `framing_for`
# imports them when it first misses, so that they are found however little of the message
# package was imported (its names load lazily); a framing registered before that for one of
# their content types stays registered.
_BUILTIN_FRAMINGS = (
    "pygazette.message.json_framing",
    "pygazette.message.csv_framing",
    "pygazette.message.fixed_framing",
)
_builtins_imported = False
_builtins_lock = threading.Lock()


def _import_builtin_framings() -> None:
    global _builtins_imported
    if _builtins_imported:
        return
    # Threads missing at once wait for the one importing: none may look up the registry
    # before the framings are in it.
    with _builtins_lock:
        if _builtins_imported:
            return
        registered = dict(_REGISTRY)
        for module in _BUILTIN_FRAMINGS:
            importlib.import_module(module)
        _REGISTRY.update(registered)
        _builtins_imported = True


def register_framing(framing: Framing, content_type: str | None = None) -> None:
    """Use `framing` for journals labeled with its content type (or `content_type`)."""
    _REGISTRY[content_type or framing.content_type] = framing


def framing_for(content_type: str) -> Framing:
    """The framing registered for a content type; raises UnknownContentType."""
    framing = _REGISTRY.get(content_type)
    if framing is None:
        _import_builtin_framings()
        framing = _REGISTRY.get(content_type)
    if framing is None:
        known = ", ".join(sorted(_REGISTRY))
        shown = content_type or "(no content-type label)"
        raise UnknownContentType(f"no message framing for content-type {shown} (known: {known})")
    return framing
