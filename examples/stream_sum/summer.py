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
in `finalize_txn`. A chunk that doesn't continue its stream (a gap or a repeat in SeqNo)
means the exactly-once guarantee was broken: the shard fails with InvalidChunk (Go's
summer exits with log.Fatal).
"""

from __future__ import annotations

import struct
from typing import Any

from examples.stream_sum.messages import FRAMING, Sum, sums_mapping
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


class _TxnCache:
    """The sums a transaction touched (written to the store in finalize_txn), and which
    of those streams finished in it."""

    __slots__ = ("done", "sums")

    def __init__(self) -> None:
        self.sums: dict[bytes, Sum] = {}
        self.done: set[bytes] = set()

    def clear(self) -> None:
        self.sums.clear()
        self.done.clear()


def _cache(store: Any) -> _TxnCache:
    cache: _TxnCache | None = getattr(store, _CACHE, None)
    if cache is None:
        cache = _TxnCache()
        setattr(store, _CACHE, cache)
    return cache


def _load(store: Any, stream_id: bytes) -> Sum:
    """The stream's partial sum as the store holds it (a new sum if none)."""
    if isinstance(store, SQLiteStore):
        for seq_no, val in store.db.execute(_SELECT_SUM, (stream_id,)):
            return Sum.of_stream(stream_id, seq_no, _U64.unpack(bytes(val))[0])
        return Sum.of_stream(stream_id)
    entry = store.state["sums"].get(stream_id.hex())
    if entry is None:
        return Sum.of_stream(stream_id)
    return Sum.of_stream(stream_id, entry[0], entry[1])


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
        chunk = envelope.message
        cache = _cache(store)
        stream_id = bytes(chunk["ID"])
        sum_ = cache.sums.get(stream_id)
        if sum_ is None:
            sum_ = _load(store, stream_id)
        if sum_.update(chunk):
            publisher.publish_uncommitted(
                sums_mapping, Sum(ID=sum_.ID, SeqNo=sum_.SeqNo, Value=sum_.Value)
            )
            cache.done.add(stream_id)
        cache.sums[stream_id] = sum_

    @staticmethod
    def finalize_txn(shard: Any, store: Any, publisher: Publisher) -> None:
        cache = _cache(store)
        if not cache.sums:
            return
        if isinstance(store, SQLiteStore):
            store.db.executemany(
                _UPSERT_SUM,
                [(sid, s.SeqNo, _U64.pack(s.Value)) for sid, s in cache.sums.items()],
            )
        else:
            sums = store.state["sums"]
            for sid, s in cache.sums.items():
                if sid in cache.done:
                    sums.pop(sid.hex(), None)
                else:
                    sums[sid.hex()] = [s.SeqNo, s.Value]
        cache.clear()


if __name__ == "__main__":
    from pygazette.consumer.runner import run

    run(Summer(), name="stream-sum")
