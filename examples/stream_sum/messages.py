"""stream-sum's messages, journals and mappings: Gazette's `stream_sum.Chunk` and
`stream_sum.Sum`, byte for byte as Go's encoding/json writes them.

    type Chunk struct {                    type Sum struct {
        UUID  message.UUID                     UUID  message.UUID
        ID    StreamID  // [16]byte            ID    StreamID
        SeqNo int                              SeqNo int
        Data  []byte                           Value uint64  // CRC-64 (ECMA) of all data
    }                                      }

Go writes a `[16]byte` as a JSON array of 16 numbers, a `[]byte` as a base64 string (null
when nil: the final, empty chunk of a stream), a UUID as its canonical text, and the
fields in declaration order:

    {"UUID":"9f2952f3-c6a3-11ea-8802-080607050309","ID":[3,20,...,2],"SeqNo":7,"Data":"YmF0dGVyeQ=="}
    {"UUID":"9f2952f3-c6a3-11ea-8802-080607050309","ID":[3,20,...,2],"SeqNo":8,"Value":12571289327815438038}

Chunks are plain dicts in that field order (`new_chunk`): the chunker publishes them in
batches through `FRAMING` (JSON lines with the UUID in field "UUID"), which keeps the key
order, and consumers decode them back into dicts on orjson's fast path. A `Sum` is a
dataclass with `set_uuid` / `new_acknowledgement`, so any JSON framing writes it — the
consumer runtime's own Publisher included — exactly as Go does, acknowledgements too
(a zero Sum carrying only the ACK's UUID, as Go's `Sum.NewAcknowledgement`).
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass, field
from typing import Any

from examples.stream_sum import crc64
from pygazette.message.framing import CONTENT_TYPE_JSON_LINES
from pygazette.message.json_framing import JSONFraming
from pygazette.message.mapping import MappingFunc, modulo_mapping

__all__ = [
    "CHUNKS_SELECTOR",
    "CHUNK_MESSAGE_TYPE",
    "FINAL_SUMS_JOURNAL",
    "FRAMING",
    "MESSAGE_TYPE_LABEL",
    "SUM_MESSAGE_TYPE",
    "InvalidChunk",
    "Sum",
    "chunk_data",
    "chunk_id",
    "chunks_mapping",
    "new_chunk",
    "sums_mapping",
]

MESSAGE_TYPE_LABEL = "app.gazette.dev/message-type"
CHUNK_MESSAGE_TYPE = "stream_sum.Chunk"
SUM_MESSAGE_TYPE = "stream_sum.Sum"
# Journal to which final stream sums are written.
FINAL_SUMS_JOURNAL = "examples/stream-sum/sums"
# The chunk partitions: every journal labeled with the Chunk message type.
CHUNKS_SELECTOR = f"{MESSAGE_TYPE_LABEL}={CHUNK_MESSAGE_TYPE}"

# JSON lines with Go's field name for the UUID. Decodes to dicts (orjson's fast path).
FRAMING = JSONFraming(uuid_field="UUID")

_ZERO_ID: tuple[int, ...] = (0,) * 16


class InvalidChunk(ValueError):
    """A chunk that does not continue its stream's sum (wrong stream, or out of sequence)."""


def new_chunk(stream_id: bytes, seq_no: int, data: bytes | None) -> dict[str, Any]:
    """A Chunk message: `data` empty or None marks the stream's end (Go writes null)."""
    return {
        "UUID": "",
        "ID": list(stream_id),
        "SeqNo": seq_no,
        "Data": binascii.b2a_base64(data, newline=False).decode() if data else None,
    }


def chunk_id(chunk: dict[str, Any]) -> bytes:
    """The stream ID of a decoded Chunk, as 16 bytes."""
    return bytes(chunk["ID"])


def chunk_data(chunk: dict[str, Any]) -> bytes:
    """The content of a decoded Chunk (empty for a stream's final chunk)."""
    data = chunk.get("Data")
    return binascii.a2b_base64(data) if data else b""


@dataclass(slots=True)
class Sum:
    """A partial or final CRC-64 sum of a stream (Go's `stream_sum.Sum`).

    `ID` is kept as the list of 16 byte values Go's JSON carries; `stream_id` is its bytes.
    """

    UUID: str = ""
    ID: list[int] = field(default_factory=lambda: list(_ZERO_ID))
    SeqNo: int = 0  # SeqNo of the last Chunk summed over.
    Value: int = 0  # CRC-64 (ECMA) of the stream's data through SeqNo.

    @classmethod
    def of_stream(cls, stream_id: bytes, seq_no: int = 0, value: int = 0) -> Sum:
        return cls(ID=list(stream_id), SeqNo=seq_no, Value=value)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Sum:
        return cls(
            UUID=doc.get("UUID") or "",
            ID=list(doc["ID"]),
            SeqNo=int(doc["SeqNo"]),
            Value=int(doc["Value"]),
        )

    @property
    def stream_id(self) -> bytes:
        return bytes(self.ID)

    def update(self, chunk: dict[str, Any]) -> bool:
        """Fold a decoded Chunk into this sum (Go's `Sum.Update`); True if it was the
        stream's last chunk. Raises InvalidChunk, changing nothing, if the chunk is of
        another stream or is not the next in sequence."""
        if chunk["ID"] != self.ID:
            raise InvalidChunk(
                f"invalid chunk.ID ({bytes(chunk['ID']).hex()}; sum.ID {self.stream_id.hex()})"
            )
        seq_no = chunk["SeqNo"]
        if seq_no != self.SeqNo + 1:
            raise InvalidChunk(
                f"invalid chunk.SeqNo ({seq_no}; sum.SeqNo {self.SeqNo}; id {self.stream_id.hex()})"
            )
        self.SeqNo = seq_no
        data = chunk.get("Data")
        if not data:
            return True
        self.Value = crc64.update(self.Value, binascii.a2b_base64(data))
        return False

    # The message layer's hooks (JSON framings call them on non-dict messages).

    def set_uuid(self, uuid_text: str) -> None:
        self.UUID = uuid_text

    def get_uuid(self) -> str | None:
        return self.UUID or None

    def new_acknowledgement(self, journal: str) -> Sum:
        return Sum()


def chunks_mapping(partitions: Any) -> MappingFunc:
    """Chunks to their partition, by 32-bit FNV-1a of the stream ID modulo the number of
    partitions (Go's `message.ModuloMapping` writing `Chunk.ID[:]`): Go and Python
    chunkers send a stream to the same journal. `partitions`: a WatchedList of
    `CHUNKS_SELECTOR` (or a ListResponse / function returning one)."""
    return modulo_mapping(chunk_id, partitions)


def sums_mapping(msg: Any) -> tuple[str, str]:
    """Every Sum goes to FINAL_SUMS_JOURNAL (Go's `finalSumsMapping`)."""
    return FINAL_SUMS_JOURNAL, CONTENT_TYPE_JSON_LINES
