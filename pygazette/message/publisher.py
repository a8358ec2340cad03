"""`Publisher`: maps messages to journals, stamps them with UUIDs and queues them on an
AppendService.

- `publish_committed` writes messages that read-committed readers see at once
  (OUTSIDE_TXN). Producers such as API servers use it.
- `publish_uncommitted` writes messages of a transaction (CONTINUE_TXN); readers see them
  only once an acknowledgement with a larger clock follows in the same journal.
  `build_ack_intents` returns those acknowledgements (ACK_TXN), one per journal written
  since the last call. For a transaction to be atomic across journals, store the intents
  durably *before* appending them, and append them again after a crash (appending an
  intent twice is harmless: readers drop the duplicate). A producer that dies before its
  intents are stored leaves its messages unacknowledged, so readers never see them.
  Publish nothing uncommitted between `build_ack_intents` and the intents' appends (from any
  thread): such a message may land in a journal ahead of that journal's acknowledgement
  with a larger clock, and readers then roll it back, as Gazette's do. The consumer
  framework never does (a transaction's intents are built once its messages are queued).

A UUID is taken while holding the target journal's append, so a publisher's messages land
in each journal in clock order even when several threads publish concurrently. The
`*_many` forms publish a batch with a single hold of each journal (much faster).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pygazette.client.append_service import AppendService, AsyncAppend
from pygazette.message.framing import Framing, framing_for
from pygazette.message.mapping import MappingFunc
from pygazette.message.uuid import (
    ACK_TXN,
    CONTINUE_TXN,
    G1582NS100,
    OUTSIDE_TXN,
    TICK,
    Clock,
    UUIDFormatter,
    new_producer_id,
)

__all__ = ["AckIntent", "Publisher"]


@dataclass(frozen=True, slots=True)
class AckIntent:
    """A framed acknowledgement to append to `journal` to commit a transaction there."""

    journal: str
    intent: bytes


@dataclass(slots=True)
class _Intent:
    journal: str
    framing: Framing
    template: Any  # A message of the journal's kind, to make the acknowledgement from.


class Publisher:
    """Publishes messages through an AppendService (see module docstring).

    `clock`: by default the publisher keeps its own clock, updated from wall time on every
    publish; pass a shared Clock (and update it yourself) to do otherwise. `producer`: a new
    random producer ID by default, as Gazette's publishers always take. Give one only to a
    single publisher at a time, never again after a restart: readers keep each producer's
    last acknowledged clock, so a restarted producer's messages whose clocks do not exceed
    it (a wall clock stepped back, or an ACK intent appended again after them) are dropped
    as duplicates or rolled back. `framings`
    overrides the registered framing of a content type (for example a JSONFraming with
    another UUID field, or a FixedFraming of your protobuf message).
    """

    def __init__(
        self,
        service: AppendService,
        *,
        clock: Clock | None = None,
        producer: bytes | None = None,
        framings: Mapping[str, Framing] | None = None,
    ) -> None:
        self.service = service
        self.auto_update = clock is None
        self.clock = clock if clock is not None else Clock()
        self.producer = producer if producer is not None else new_producer_id()
        self._formatter = UUIDFormatter(self.producer)
        self._framings = dict(framings or {})
        self._lock = threading.Lock()
        self._intents: dict[str, _Intent] = {}

    def framing(self, content_type: str) -> Framing:
        framing = self._framings.get(content_type)
        if framing is None:
            framing = framing_for(content_type)
            self._framings[content_type] = framing
        return framing

    # Publishing ---------------------------------------------------------------------------

    def publish_committed(self, mapping: MappingFunc, msg: Any) -> AsyncAppend:
        """Publish a message readers see at once. Returns its AsyncAppend (await it to
        know it committed). Raises, publishing nothing, if the message cannot be mapped
        or encoded, or cannot be queued."""
        journal, content_type = mapping(msg)
        return self._publish(journal, self.framing(content_type), msg, OUTSIDE_TXN)

    def publish_uncommitted(self, mapping: MappingFunc, msg: Any) -> AsyncAppend:
        """Publish a message of the current transaction (see `build_ack_intents`)."""
        journal, content_type = mapping(msg)
        return self._publish(journal, self.framing(content_type), msg, CONTINUE_TXN)

    def publish_committed_many(
        self, mapping: MappingFunc, msgs: Iterable[Any]
    ) -> list[AsyncAppend]:
        """Publish messages readers see at once; each journal's share is queued as one
        write. Returns the AsyncAppends written to. If any message cannot be mapped or
        encoded, nothing is published."""
        return self._publish_many(mapping, msgs, OUTSIDE_TXN)

    def publish_uncommitted_many(
        self, mapping: MappingFunc, msgs: Iterable[Any]
    ) -> list[AsyncAppend]:
        """Publish messages of the current transaction; see `publish_committed_many`."""
        return self._publish_many(mapping, msgs, CONTINUE_TXN)

    def _ticks(self, n: int) -> int:
        """Reserve `n` clock ticks (holding self._lock); returns the first."""
        clock = self.clock
        if not self.auto_update:
            return clock.tick_many(n)
        # The publisher's own clock: only used under self._lock, so no Clock locking.
        now = (time.time_ns() // 100 + G1582NS100) << 4
        value = clock.value
        if now > value:
            value = now
        clock.value = value + n * TICK
        return value + TICK

    def _publish(self, journal: str, framing: Framing, msg: Any, flags: int) -> AsyncAppend:
        with self._lock:
            # Every publish of this producer holds self._lock: each journal receives the
            # producer's messages in clock order.
            framing.set_uuid(msg, self._formatter.format(self._ticks(1), flags))
            aa = self.service.append(journal, framing.marshal(msg))
            if flags == CONTINUE_TXN and journal not in self._intents:
                self._intents[journal] = _Intent(journal, framing, msg)
        return aa

    def _publish_many(
        self, mapping: MappingFunc, msgs: Iterable[Any], flags: int
    ) -> list[AsyncAppend]:
        groups: dict[str, tuple[Framing, list[Any]]] = {}
        # Iterated twice (mapped, then grouped): an iterator is taken into a list first.
        msgs = msgs if isinstance(msgs, Sequence) else list(msgs)
        map_many = getattr(mapping, "map_many", None)
        if map_many is not None:
            targets = map_many(msgs)
        else:
            targets = [mapping(msg) for msg in msgs]
        for msg, (journal, content_type) in zip(msgs, targets, strict=True):
            group = groups.get(journal)
            if group is None:
                group = groups[journal] = (self.framing(content_type), [])
            group[1].append(msg)
        out: list[AsyncAppend] = []
        with self._lock:
            # Clocks are taken and messages encoded before any is queued, so that a failure
            # publishes nothing. Every publish of this producer holds self._lock, so each
            # journal still receives the producer's messages in clock order.
            frames: list[tuple[str, Framing, bytes, Any]] = []
            for journal, (framing, batch) in groups.items():
                first = self._ticks(len(batch))
                data = framing.marshal_sequence(batch, self._formatter, first, flags)
                frames.append((journal, framing, data, batch[0]))
            for journal, framing, data, template in frames:
                out.append(self.service.append(journal, data))
                if flags == CONTINUE_TXN and journal not in self._intents:
                    self._intents[journal] = _Intent(journal, framing, template)
        return out

    # Transactions -------------------------------------------------------------------------

    def build_ack_intents(self) -> list[AckIntent]:
        """Acknowledgements of every message published uncommitted since the last call,
        one per journal. Store them durably, then append them (see `append_ack_intents`);
        publish nothing uncommitted until they are appended (see the module docstring)."""
        with self._lock:
            intents, self._intents = self._intents, {}
            out: list[AckIntent] = []
            for intent in intents.values():
                ack = intent.framing.new_acknowledgement(intent.template, intent.journal)
                intent.framing.set_uuid(ack, self._formatter.format(self._ticks(1), ACK_TXN))
                out.append(AckIntent(intent.journal, intent.framing.marshal(ack)))
            return out

    @property
    def pending_journals(self) -> list[str]:
        """Journals written uncommitted since the last `build_ack_intents`."""
        return list(self._intents)

    def __repr__(self) -> str:
        return f"Publisher(producer={self.producer.hex()})"


def append_ack_intents(service: AppendService, intents: Sequence[AckIntent]) -> list[AsyncAppend]:
    """Queue acknowledgements on their journals; await the results to know they committed."""
    return [service.append(intent.journal, intent.intent) for intent in intents]
