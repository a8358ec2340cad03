"""`Summer`: stream-sum's consumer. It folds each stream's chunks into a running CRC-64 and,
on a stream's final (empty) chunk, publishes the stream's `Sum` to
`examples/stream-sum/sums` — uncommitted, so that it becomes readable only when the
transaction that consumed the chunk commits: every final sum is published exactly once,
whatever crashes and hand-offs happen in between.

Run it with

    pygazette consumer serve --app examples.stream_sum.summer:Summer --broker URL ...
    python -m examples.stream_sum.summer --broker URL ...     # the same flags

Each shard reads one chunk partition (`shards.yaml`). Its partial sums live in the store
chosen by the ShardSpec's `store` label, as in Gazette's example:

- `sqlite` (the default when the label is absent): a SQLiteStore recorded to the shard's
  recovery log, with Gazette's table `sums(id BLOB PRIMARY KEY, seq_no INTEGER, val BLOB)`
  (`val`: the uint64 sum, 8 bytes little endian). Rows of finished streams stay, holding
  the final sum, as Go's summer leaves them.
- `json`: a JSONFileStore (also recorded) of `{"sums": {hex id: [seq_no, value]}}`.
- `memory`: a MemoryStore of the same document: not durable (a new primary starts over),
  for tests and trying things out.

The JSON and memory stores copy their whole state at every commit, so they drop a stream's
entry once its sum is published; only open streams are kept.

As Go's summer, it caches the sums a transaction touches and writes them to the store once,
in `finalize_txn`; it also folds the chunks' data into their CRC-64 sums there, for every
stream at once (`crc64.update_many`, vectorized), and publishes the final sums then — but
a final chunk that finds few of its stream's chunks pending in the transaction (as with
live, light input) has its sum folded and published at once, as Go's summer does, so that
its append overlaps the rest of the transaction. A chunk that doesn't continue its stream
(a gap or a repeat in SeqNo) means the exactly-once guarantee was broken: the shard fails
with InvalidChunk (Go's summer exits with log.Fatal).
"""

from __future__ import annotations

import struct
from binascii import a2b_base64
from typing import Any

from examples.stream_sum import crc64
from examples.stream_sum.messages import FRAMING, InvalidChunk, Sum, sums_mapping
from pygazette.consumer.json_file_store import JSONFileStore
from pygazette.consumer.memory_store import MemoryStore
from pygazette.consumer.sqlite_store import SQLiteStore
from pygazette.message.envelope import Envelope
from pygazette.message.framing import Framing
from pygazette.message.publisher import Publisher
from pygazette.protocol.labels import label_value
from pygazette.protocol.pb import protocol_pb2 as pb

__all__ = ["SQLITE_BOOTSTRAP", "STORE_LABEL", "Summer"]

STORE_LABEL = "store"
STORES = ("sqlite", "json", "memory")

# Gazette's store bootstrap for the SQLite store.
SQLITE_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS sums (
    id BLOB PRIMARY KEY NOT NULL,
    seq_no INTEGER,
    val BLOB
);
"""
_SELECT_SUM = "SELECT seq_no, val FROM sums WHERE id = ?"
_UPSERT_SUM = (
    "INSERT INTO sums(id, seq_no, val) VALUES(?, ?, ?) "
    "ON CONFLICT(id) DO UPDATE SET seq_no=excluded.seq_no, val=excluded.val"
)
_U64 = struct.Struct("<Q")

# Attribute of a store holding what the current transaction touched.
_CACHE = "stream_sum_cache"


# A stream's final chunk with at most this many chunks of data pending in the transaction
# has its sum folded and published at once (cheap, and its append then overlaps the rest of
# the transaction, as Go's summer's does); after more, at finalize_txn with every stream.
EARLY_FOLD_CHUNKS = 16


class _Stream:
    """A stream the current transaction touched: its sum as of the transaction's start
    (`value`, CRC-64 through the chunks before `data`), the SeqNo of its last chunk
    consumed, and the (base64) data of the chunks consumed since, folded in at
    finalize_txn for all streams at once."""

    __slots__ = ("data", "end", "final", "id", "seq_no", "value")

    def __init__(self, stream_id: bytes, seq_no: int, value: int) -> None:
        self.id = stream_id
        self.seq_no = seq_no
        self.value = value
        self.data: list[str] = []
        self.final = False  # Its last chunk consumed is its final (empty) one.
        # The final sum to publish at finalize_txn: [stream id, SeqNo, Value or None (the
        # stream's value once its data is folded in)], until another chunk follows.
        self.end: list[Any] | None = None

    def fold(self) -> None:
        """Fold the pending data into `value` now."""
        if self.data:
            self.value = crc64.update(self.value, b"".join(map(a2b_base64, self.data)))
            self.data = []


class _TxnCache:
    """The streams a transaction touched (written to the store in finalize_txn), and the
    final sums to publish, in the order of their final chunks."""

    __slots__ = ("ends", "streams")

    def __init__(self) -> None:
        self.streams: dict[bytes, _Stream] = {}
        self.ends: list[list[Any]] = []

    def clear(self) -> None:
        self.streams.clear()
        self.ends.clear()


def _cache(store: Any) -> _TxnCache:
    cache: _TxnCache | None = getattr(store, _CACHE, None)
    if cache is None:
        cache = _TxnCache()
        setattr(store, _CACHE, cache)
    return cache


def _load(store: Any, stream_id: bytes) -> _Stream:
    """The stream's partial sum as the store holds it (a new sum if none)."""
    if isinstance(store, SQLiteStore):
        for seq_no, val in store.db.execute(_SELECT_SUM, (stream_id,)):
            return _Stream(stream_id, seq_no, _U64.unpack(bytes(val))[0])
        return _Stream(stream_id, 0, 0)
    entry = store.state["sums"].get(stream_id.hex())
    if entry is None:
        return _Stream(stream_id, 0, 0)
    return _Stream(stream_id, entry[0], entry[1])


class Summer:
    """The stream-sum Application (see the module docstring).

    Stateless, as Go's `Summer{}`: every callback is a static method, so the class works
    as the application itself as well as its instances do."""

    @staticmethod
    def new_framing(spec: pb.JournalSpec) -> Framing:
        return FRAMING

    @staticmethod
    def new_store(shard: Any, recorder: Any) -> Any:
        kind = label_value(shard.spec.labels, STORE_LABEL, "sqlite").lower()
        directory = None if recorder is not None else shard.local_dir
        store: Any
        if kind == "sqlite":
            store = SQLiteStore(recorder, directory=directory, bootstrap_sql=SQLITE_BOOTSTRAP)
        elif kind == "json":
            store = JSONFileStore(recorder, {"sums": {}}, directory=directory)
        elif kind == "memory":
            store = MemoryStore({"sums": {}})
        else:
            raise ValueError(
                f"expected ShardSpec label {STORE_LABEL!r} to be one of "
                f"{', '.join(STORES)} (got {kind!r})"
            )
        _cache(store)
        return store

    @staticmethod
    def begin_txn(shard: Any, store: Any) -> None:
        _cache(store).clear()  # Nothing of an abandoned transaction carries over.

    @staticmethod
    def consume_message(shard: Any, store: Any, envelope: Envelope, publisher: Publisher) -> None:
        # Go's Sum.Update, less the CRC: that is folded in at finalize_txn, for every stream
        # at once (crc64.update_many), unless the stream ends with little data pending. The
        # chunk's ID is its stream's (the key it was found by): no check needed.
        chunk = envelope.message
        try:
            cache: _TxnCache = getattr(store, _CACHE)
        except AttributeError:
            cache = _cache(store)
        stream_id = bytes(chunk["ID"])
        stream = cache.streams.get(stream_id)
        if stream is None:
            stream = cache.streams[stream_id] = _load(store, stream_id)
        seq_no = chunk["SeqNo"]
        if seq_no != stream.seq_no + 1:
            raise InvalidChunk(
                f"invalid chunk.SeqNo ({seq_no}; sum.SeqNo {stream.seq_no}; id {stream_id.hex()})"
            )
        end = stream.end
        if end is not None:
            # The stream goes on after a final chunk (Go's summer allows it): that final
            # sum is the value as of then.
            stream.fold()
            end[2] = stream.value
            stream.end = None
        stream.seq_no = seq_no
        data = chunk.get("Data")
        if data:
            stream.data.append(data)
            stream.final = False
            return
        stream.final = True
        if len(stream.data) <= EARLY_FOLD_CHUNKS:
            stream.fold()
            publisher.publish_uncommitted(
                sums_mapping, Sum(ID=list(stream_id), SeqNo=seq_no, Value=stream.value)
            )
        else:
            stream.end = [stream_id, seq_no, None]
            cache.ends.append(stream.end)

    @staticmethod
    def finalize_txn(shard: Any, store: Any, publisher: Publisher) -> None:
        cache = _cache(store)
        if not cache.streams:
            return
        folding = [s for s in cache.streams.values() if s.data]
        if folding:
            values = crc64.update_many(
                [s.value for s in folding], [list(map(a2b_base64, s.data)) for s in folding]
            )
            for s, value in zip(folding, values, strict=True):
                s.value = value
                s.data = []
        for end in cache.ends:
            stream_id, seq_no, value = end
            if value is None:
                value = cache.streams[stream_id].value
            publisher.publish_uncommitted(
                sums_mapping, Sum(ID=list(stream_id), SeqNo=seq_no, Value=value)
            )
        if isinstance(store, SQLiteStore):
            store.db.executemany(
                _UPSERT_SUM,
                [(s.id, s.seq_no, _U64.pack(s.value)) for s in cache.streams.values()],
            )
        else:
            sums = store.state["sums"]
            for s in cache.streams.values():
                if s.final:
                    sums.pop(s.id.hex(), None)
                else:
                    sums[s.id.hex()] = [s.seq_no, s.value]
        cache.clear()


if __name__ == "__main__":
    from pygazette.cli.run_consumer import run

    run(Summer(), name="stream-sum")
