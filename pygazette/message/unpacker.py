"""`Unpacker`: finds the messages in a journal's byte stream, with their exact offsets.

Feed it the journal's content in whatever pieces it is read; it returns each complete
message as an `Envelope` of [begin, end) offsets, with its UUID parsed, and keeps the bytes
of a message split across pieces until the rest arrives. A frame that does not decode, or
bytes that are not a frame, become a `MessageDecodeError` in the output, in order, and
unpacking continues after them; `finish` reports content that ends within a message.
"""

from __future__ import annotations

from collections.abc import Callable, MutableSequence

from pygazette.message.envelope import Envelope
from pygazette.message.framing import FrameDesync, Framing, MessageDecodeError

__all__ = ["PartialMessage", "Unpacker"]


class PartialMessage(MessageDecodeError):
    """The journal's content ended within a message."""


class Unpacker:
    """Unpacks the messages of one journal from consecutive pieces of its content."""

    __slots__ = ("_held", "_held_size", "_need", "_wait", "begin", "framing", "journal")

    def __init__(self, framing: Framing, journal: str, offset: int = 0) -> None:
        self.framing = framing
        self.journal = journal
        self.begin = offset  # Offset of the first byte not yet returned as a message.
        # Bytes from `begin` on, an incomplete message: pieces of content as they were fed
        # (joined only once the message is complete, so a long message is copied once).
        self._held: list[bytes | memoryview] = []
        self._held_size = 0
        # The length of the held message's frame, when its framing tells (`frame_size`):
        # pieces are only held until that much is here.
        self._need = 0
        # Whether a piece leaves the held frame incomplete (`Framing.stays_incomplete`),
        # where the framing tells: such pieces are only held.
        self._wait: Callable[[bytes], bool] | None = None

    @property
    def offset(self) -> int:
        """Offset of the next byte to feed."""
        return self.begin + self._held_size

    @property
    def pending(self) -> int:
        """Bytes held of an incomplete message."""
        return self._held_size

    def restart(self, offset: int) -> int:
        """Continue at `offset` (after a jump); returns how many held bytes were dropped."""
        dropped = self._held_size
        self._held, self._held_size, self._need, self._wait = [], 0, 0, None
        self.begin = offset
        return dropped

    def finish(self) -> PartialMessage | None:
        """The content ends here: an error if it ended within a message (whose bytes are
        then dropped), else None."""
        if not self._held_size:
            return None
        size = self._held_size
        if size == 1 and self.framing.final_newline and bytes(self._held[0]) == b"\n":
            self.restart(self.begin + 1)  # One newline after the last frame: not a message.
            return None
        err = PartialMessage(
            f"content ends within a message ({size} bytes)",
            journal=self.journal,
            begin=self.begin,
            end=self.begin + size,
        )
        self.restart(self.begin + size)
        return err

    def _hold(self, piece: bytes | memoryview) -> None:
        if len(piece):
            self._held.append(piece)
            self._held_size += len(piece)

    def feed(self, chunk: bytes, out: MutableSequence[Envelope | BaseException]) -> None:
        """Append to `out` the messages (and errors) completed by `chunk`, which follows
        the content fed so far."""
        if type(chunk) is not bytes:
            chunk = bytes(chunk)  # Held pieces are views of it: it must not change.
        held = self._held
        delimiter = self.framing.line_delimiter
        if held and delimiter is not None:
            # A message continues from earlier content: its end is the first delimiter of
            # `chunk` (the held bytes have none), so only `chunk` is searched.
            end = chunk.find(delimiter)
            if end < 0:
                self._hold(chunk)
                return
            payload = b"".join([*held, memoryview(chunk)[:end]])
            self._held, self._held_size = [], 0
            self.begin = self.framing.envelopes([payload], self.journal, self.begin, out)
            rest = end + len(delimiter)
            if chunk.find(delimiter, rest) < 0:
                # The rest of `chunk` starts the next message: held without a copy.
                self._hold(memoryview(chunk)[rest:])
                return
            chunk = chunk[rest:]
        elif held:
            if self._held_size + len(chunk) < self._need:
                self._hold(chunk)  # The frame is longer still.
                return
            wait = self._wait
            if wait is not None and wait(chunk):
                self._hold(chunk)  # The frame is still incomplete.
                return
            chunk = b"".join([*held, chunk])
            self._held, self._held_size, self._need, self._wait = [], 0, 0, None
        self._feed(chunk, out)

    def _feed(self, data: bytes, out: MutableSequence[Envelope | BaseException]) -> None:
        """`feed`, with nothing held: `data` starts at `begin`."""
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
        self.begin = pos
        # What is left starts a message: held as a view of `data` rather than a copy.
        rest = memoryview(data)[start:] if start else data
        self._hold(rest)
        self._need = (framing.frame_size(rest) or 0) if len(rest) else 0
        self._wait = framing.stays_incomplete(data, start) if len(rest) else None
