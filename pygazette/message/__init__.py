"""The message layer: exactly-once message semantics on top of at-least-once journals.

- `uuid`: Gazette-compatible message UUIDs (producer, clock, transaction flags).
- framings: JSON lines (`JSONFraming`), CSV (`CSVFraming`), Gazette's fixed framing
  (`FixedFraming`), found by a journal's content-type label (`framing_for`).
- `Publisher`: maps messages to journals (`random_mapping`, `modulo_mapping`,
  `rendezvous_mapping`), stamps UUIDs and queues them on an `AppendService`; publishes
  committed messages, or transactions acknowledged through `build_ack_intents`.
- `Sequencer`, `ReadUncommitted`, `ReadCommitted`: read messages back, removing duplicates
  and holding transactions until they are acknowledged.

It depends only on the client package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pygazette.message.csv_framing import CSVFraming
    from pygazette.message.envelope import Envelope, ProducerState
    from pygazette.message.fixed_framing import (
        FIXED_FRAME_HEADER_LENGTH,
        FIXED_FRAME_WORD,
        FixedFraming,
        encode_fixed_frame,
    )
    from pygazette.message.framing import (
        CONTENT_TYPE_CSV,
        CONTENT_TYPE_JSON_LINES,
        CONTENT_TYPE_PROTO_FIXED,
        FrameDesync,
        Framing,
        FramingError,
        MessageDecodeError,
        UnknownContentType,
        framing_for,
        register_framing,
    )
    from pygazette.message.json_framing import JSONFraming
    from pygazette.message.mapping import (
        EmptyPartitions,
        MappingFunc,
        fnv1a32,
        modulo_mapping,
        random_mapping,
        rendezvous_mapping,
    )
    from pygazette.message.publisher import AckIntent, Publisher, append_ack_intents
    from pygazette.message.reader import (
        ReadCommitted,
        ReadUncommitted,
        framing_of_journal,
        read_committed,
        read_uncommitted,
    )
    from pygazette.message.sequencer import QueueOutcome, ReplayError, Sequencer
    from pygazette.message.unpacker import PartialMessage, Unpacker
    from pygazette.message.uuid import (
        ACK_TXN,
        CONTINUE_TXN,
        OUTSIDE_TXN,
        Clock,
        UUIDFormatter,
        build_uuid,
        get_clock,
        get_flags,
        get_producer_id,
        new_producer_id,
        parse_uuid_text,
    )

__all__ = [
    "ACK_TXN",
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_PROTO_FIXED",
    "CONTINUE_TXN",
    "FIXED_FRAME_HEADER_LENGTH",
    "FIXED_FRAME_WORD",
    "OUTSIDE_TXN",
    "AckIntent",
    "CSVFraming",
    "Clock",
    "EmptyPartitions",
    "Envelope",
    "FixedFraming",
    "FrameDesync",
    "Framing",
    "FramingError",
    "JSONFraming",
    "MappingFunc",
    "MessageDecodeError",
    "PartialMessage",
    "ProducerState",
    "Publisher",
    "QueueOutcome",
    "ReadCommitted",
    "ReadUncommitted",
    "ReplayError",
    "Sequencer",
    "UUIDFormatter",
    "UnknownContentType",
    "Unpacker",
    "append_ack_intents",
    "build_uuid",
    "encode_fixed_frame",
    "fnv1a32",
    "framing_for",
    "framing_of_journal",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "modulo_mapping",
    "new_producer_id",
    "parse_uuid_text",
    "random_mapping",
    "read_committed",
    "read_uncommitted",
    "register_framing",
    "rendezvous_mapping",
]

# Where each exported name is defined. A name's module is imported when the name is first
# used (PEP 562), so importing one module of the package imports no other.
_EXPORTS: dict[str, str] = {
    "CSVFraming": "pygazette.message.csv_framing",
    "Envelope": "pygazette.message.envelope",
    "ProducerState": "pygazette.message.envelope",
    "FIXED_FRAME_HEADER_LENGTH": "pygazette.message.fixed_framing",
    "FIXED_FRAME_WORD": "pygazette.message.fixed_framing",
    "FixedFraming": "pygazette.message.fixed_framing",
    "encode_fixed_frame": "pygazette.message.fixed_framing",
    "CONTENT_TYPE_CSV": "pygazette.message.framing",
    "CONTENT_TYPE_JSON_LINES": "pygazette.message.framing",
    "CONTENT_TYPE_PROTO_FIXED": "pygazette.message.framing",
    "FrameDesync": "pygazette.message.framing",
    "Framing": "pygazette.message.framing",
    "FramingError": "pygazette.message.framing",
    "MessageDecodeError": "pygazette.message.framing",
    "UnknownContentType": "pygazette.message.framing",
    "framing_for": "pygazette.message.framing",
    "register_framing": "pygazette.message.framing",
    "JSONFraming": "pygazette.message.json_framing",
    "EmptyPartitions": "pygazette.message.mapping",
    "MappingFunc": "pygazette.message.mapping",
    "fnv1a32": "pygazette.message.mapping",
    "modulo_mapping": "pygazette.message.mapping",
    "random_mapping": "pygazette.message.mapping",
    "rendezvous_mapping": "pygazette.message.mapping",
    "AckIntent": "pygazette.message.publisher",
    "Publisher": "pygazette.message.publisher",
    "append_ack_intents": "pygazette.message.publisher",
    "ReadCommitted": "pygazette.message.reader",
    "ReadUncommitted": "pygazette.message.reader",
    "framing_of_journal": "pygazette.message.reader",
    "read_committed": "pygazette.message.reader",
    "read_uncommitted": "pygazette.message.reader",
    "QueueOutcome": "pygazette.message.sequencer",
    "ReplayError": "pygazette.message.sequencer",
    "Sequencer": "pygazette.message.sequencer",
    "PartialMessage": "pygazette.message.unpacker",
    "Unpacker": "pygazette.message.unpacker",
    "ACK_TXN": "pygazette.message.uuid",
    "CONTINUE_TXN": "pygazette.message.uuid",
    "Clock": "pygazette.message.uuid",
    "OUTSIDE_TXN": "pygazette.message.uuid",
    "UUIDFormatter": "pygazette.message.uuid",
    "build_uuid": "pygazette.message.uuid",
    "get_clock": "pygazette.message.uuid",
    "get_flags": "pygazette.message.uuid",
    "get_producer_id": "pygazette.message.uuid",
    "new_producer_id": "pygazette.message.uuid",
    "parse_uuid_text": "pygazette.message.uuid",
}

if not TYPE_CHECKING:  # Type checkers see the imports above instead.

    def __getattr__(name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
