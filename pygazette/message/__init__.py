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
