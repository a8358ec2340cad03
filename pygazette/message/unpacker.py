"""`Unpacker`: finds the messages in a journal's byte stream, with their exact offsets.

Feed it the journal's content in whatever pieces it is read; it returns each complete
message as an `Envelope` of [begin, end) offsets, with its UUID parsed, and keeps the bytes
of a message split across pieces until the rest arrives. A frame that does not decode, or
bytes that are not a frame, become a `MessageDecodeError` in the output, in order, and
unpacking continues after them; `finish` reports content that ends within a message.
"""

from __future__ import annotations

from collections.abc import MutableSequence

from pygazette.message.envelope import Envelope
from pygazette.message.framing import FrameDesync, Framing, MessageDecodeError

__all__ = ["PartialMessage", "Unpacker"]


class PartialMessage(MessageDecodeError):
    """The journal's content ended within a message."""


class Unpacker:
    """Unpacks the messages of one journal from consecutive pieces of its content."""

    __slots__ = ("_pending", "begin", "framing", "journal")

    def __init__(self, framing: Framing, journal: str, offset: int = 0) -> None:
        self.framing = framing
        self.journal = journal
        self.begin = offset  # Offset of the first byte not yet returned as a message.
        self._pending = b""  # Bytes from `begin` on: an incomplete message.

    @property
    def offset(self) -> int:
        """Offset of the next byte to feed."""
        return self.begin + len(self._pending)

    @property
    def pending(self) -> int:
        """Bytes held of an incomplete message."""
        return len(self._pending)

    def restart(self, offset: int) -> int:
        """Continue at `offset` (after a jump); returns how many held bytes were dropped."""
        dropped = len(self._pending)
        self._pending = b""
        self.begin = offset
        return dropped

    def finish(self) -> PartialMessage | None:
        """The content ends here: an error if it ended within a message (whose bytes are
        then dropped), else None."""
        if not self._pending:
            return None
        size = len(self._pending)
        err = PartialMessage(
            f"content ends within a message ({size} bytes)",
            journal=self.journal,
            begin=self.begin,
            end=self.begin + size,
        )
        self.restart(self.begin + size)
        return err

    def feed(self, chunk: bytes, out: MutableSequence[Envelope | BaseException]) -> None:
        """Append to `out` the messages (and errors) completed by `chunk`, which follows
        the content fed so far."""
        data = self._pending + chunk if self._pending else chunk
        framing = self.framing
        journal = self.journal
        split = framing.split
        envelopes = framing.envelopes
        pos = self.begin
        start = 0
        while True:
            try:
                frames, consumed = split(data[start:] if start else data)
            except FrameDesync as exc:
                out.append(
                    MessageDecodeError(str(exc), journal=journal, begin=pos, end=pos + exc.skip)
                )
                pos += exc.skip
                start += exc.skip
                continue
            if not frames:
                break
            pos = envelopes(frames, journal, pos, out)
            start += consumed
        self._pending = data[start:]
        self.begin = pos
