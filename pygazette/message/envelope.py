"""`Envelope`: a message read from a journal, with its exact offsets and UUID parts; and
`ProducerState`, a producer's sequencing state as consumers checkpoint it.
"""

from __future__ import annotations

import uuid as _uuid
from dataclasses import dataclass
from typing import Any

from pygazette.message.uuid import build_uuid, flags_name

ZERO_PRODUCER = bytes(6)


@dataclass(slots=True)
class Envelope:
    """A message and where it was read: bytes [begin, end) of `journal`.

    `producer`, `clock` and `flags` are the parts of the message's UUID (all zero for a
    message without one: such messages are delivered as they are read, never de-duplicated).
    """

    journal: str
    begin: int
    end: int
    message: Any
    producer: bytes = ZERO_PRODUCER
    clock: int = 0
    flags: int = 0

    @property
    def uuid(self) -> _uuid.UUID:
        if not self.clock and self.producer == ZERO_PRODUCER and not self.flags:
            return _uuid.UUID(int=0)
        return build_uuid(self.producer, self.clock, self.flags)

    @property
    def flags_name(self) -> str:
        return flags_name(self.flags)


@dataclass(slots=True)
class ProducerState:
    """A producer's state within a journal, as of the sequencer's read-through offset.

    `last_ack` is the clock of its last ACK_TXN (or OUTSIDE_TXN); `begin` is the offset of
    the first CONTINUE_TXN message after it, which opens the producer's next transaction
    (-1 if there is none).
    """

    journal: str
    producer: bytes
    last_ack: int
    begin: int = -1
