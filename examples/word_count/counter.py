"""`Counter`: word-count's consumer. It sums NGramCount deltas into a SQLite store,

    CREATE TABLE counts (ngram TEXT PRIMARY KEY NOT NULL, count INTEGER NOT NULL)

recorded to the shard's recovery log (so a standby, a new primary, or `query.py` can
rebuild it from the log). As Gazette's Counter, it adds up a transaction's deltas in memory
and writes each touched N-gram once, in `finalize_txn` — here as an upsert that adds the
delta (`count = count + excluded.count`), so nothing needs to be read first.

    pygazette consumer serve --app examples.word_count.counter:Counter --broker URL ...
    python -m examples.word_count.counter --broker URL ...
"""

from __future__ import annotations

from typing import Any

from examples.word_count.wordcount import FRAMING
from pygazette.consumer.sqlite_store import SQLiteStore
from pygazette.message.envelope import Envelope
from pygazette.message.framing import Framing
from pygazette.message.publisher import Publisher
from pygazette.protocol.pb import protocol_pb2 as pb

__all__ = ["BOOTSTRAP", "Counter", "read_count"]

BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS counts (
    ngram TEXT PRIMARY KEY NOT NULL,
    count INTEGER NOT NULL
);
"""
_ADD = (
    "INSERT INTO counts(ngram, count) VALUES(?, ?) "
    "ON CONFLICT(ngram) DO UPDATE SET count = count + excluded.count"
)
_DELTAS = "word_count_deltas"  # Attribute of the store: the transaction's deltas.


def _deltas(store: Any) -> dict[str, int]:
    deltas: dict[str, int] | None = getattr(store, _DELTAS, None)
    if deltas is None:
        deltas = {}
        setattr(store, _DELTAS, deltas)
    return deltas


class Counter:
    """The word-count Application. Stateless: every callback is a static method."""

    @staticmethod
    def new_framing(spec: pb.JournalSpec) -> Framing:
        return FRAMING

    @staticmethod
    def new_store(shard: Any, recorder: Any) -> SQLiteStore:
        directory = None if recorder is not None else shard.local_dir
        store = SQLiteStore(recorder, directory=directory, bootstrap_sql=BOOTSTRAP)
        _deltas(store)
        return store

    @staticmethod
    def begin_txn(shard: Any, store: Any) -> None:
        _deltas(store).clear()

    @staticmethod
    def consume_message(shard: Any, store: Any, envelope: Envelope, publisher: Publisher) -> None:
        msg = envelope.message
        deltas = _deltas(store)
        gram = msg["NGram"]
        deltas[gram] = deltas.get(gram, 0) + int(msg["Count"])

    @staticmethod
    def finalize_txn(shard: Any, store: Any, publisher: Publisher) -> None:
        deltas = _deltas(store)
        if deltas:
            store.db.executemany(_ADD, list(deltas.items()))
            deltas.clear()


def read_count(conn: Any, ngram: str, *, prefix: bool = False) -> list[tuple[str, int]]:
    """(N-gram, count) rows of a counter store's connection: `ngram` itself, or every
    N-gram starting with it."""
    if not prefix:
        return [
            (str(g), int(c))
            for g, c in conn.execute("SELECT ngram, count FROM counts WHERE ngram = ?", (ngram,))
        ]
    upper = ngram + "\U0010ffff"
    return [
        (str(g), int(c))
        for g, c in conn.execute(
            "SELECT ngram, count FROM counts WHERE ngram >= ? AND ngram < ? ORDER BY ngram",
            (ngram, upper),
        )
    ]


if __name__ == "__main__":
    from pygazette.cli.run_consumer import run

    run(Counter(), name="word-count")
