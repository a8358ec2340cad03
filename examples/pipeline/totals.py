"""`UserTotals`: the pipeline's consumer. It reads the streaming job's running
(user, page) totals from examples/pipeline/page-counts and keeps each key's latest in a
SQLite store recorded to the shard's recovery log:

    CREATE TABLE pages (user TEXT, page TEXT, views INTEGER, ms INTEGER,
                        PRIMARY KEY (user, page))

A (user, page) total only grows, so an update keeps the larger one: a record read again
changes nothing. When a transaction ends, it publishes, for every user it touched, the
user's totals over all pages to examples/pipeline/user-totals (uncommitted: readers see
them once the transaction commits and its ACK is written).

    pygazette consumer serve --app examples.pipeline.totals:UserTotals --broker URL ...
"""

from __future__ import annotations

from typing import Any

from pygazette.consumer.sqlite_store import SQLiteStore
from pygazette.message.envelope import Envelope
from pygazette.message.framing import Framing
from pygazette.message.json_framing import JSONFraming
from pygazette.message.publisher import Publisher
from pygazette.protocol.pb import protocol_pb2 as pb

USER_TOTALS = "examples/pipeline/user-totals/part-000"
CONTENT_TYPE = "application/x-ndjson"
FRAMING = JSONFraming()

BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS pages (
    user TEXT NOT NULL,
    page TEXT NOT NULL,
    views INTEGER NOT NULL,
    ms INTEGER NOT NULL,
    PRIMARY KEY (user, page)
);
"""
_UPSERT = (
    "INSERT INTO pages(user, page, views, ms) VALUES(?, ?, ?, ?) "
    "ON CONFLICT(user, page) DO UPDATE SET views = excluded.views, ms = excluded.ms "
    "WHERE excluded.views > pages.views"
)
_USER = "SELECT COUNT(*), SUM(views), SUM(ms) FROM pages WHERE user = ?"
_TOUCHED = "pipeline_touched"  # Attribute of the store: the transaction's users.


def totals_mapping(msg: Any) -> tuple[str, str]:
    return USER_TOTALS, CONTENT_TYPE


def _touched(store: Any) -> dict[tuple[str, str], tuple[int, int]]:
    touched: dict[tuple[str, str], tuple[int, int]] | None = getattr(store, _TOUCHED, None)
    if touched is None:
        touched = {}
        setattr(store, _TOUCHED, touched)
    return touched


class UserTotals:
    """The pipeline's consumer Application. Stateless: every callback is a static method."""

    @staticmethod
    def new_framing(spec: pb.JournalSpec) -> Framing:
        return FRAMING

    @staticmethod
    def new_store(shard: Any, recorder: Any) -> SQLiteStore:
        directory = None if recorder is not None else shard.local_dir
        store = SQLiteStore(recorder, directory=directory, bootstrap_sql=BOOTSTRAP)
        _touched(store)
        return store

    @staticmethod
    def begin_txn(shard: Any, store: Any) -> None:
        _touched(store).clear()

    @staticmethod
    def consume_message(shard: Any, store: Any, envelope: Envelope, publisher: Publisher) -> None:
        msg = envelope.message
        key = (str(msg["user"]), str(msg["page"]))
        views, ms = int(msg["views"]), int(msg["ms"])
        touched = _touched(store)
        if views > touched.get(key, (0, 0))[0]:
            touched[key] = (views, ms)

    @staticmethod
    def finalize_txn(shard: Any, store: Any, publisher: Publisher) -> None:
        touched = _touched(store)
        if not touched:
            return
        store.db.executemany(_UPSERT, [(u, p, v, m) for (u, p), (v, m) in touched.items()])
        for user in sorted({u for u, _ in touched}):
            pages, views, ms = store.db.execute(_USER, (user,)).fetchone()
            publisher.publish_uncommitted(
                totals_mapping,
                {"uuid": "", "user": user, "pages": pages, "views": views, "ms": ms},
            )
        touched.clear()


if __name__ == "__main__":
    from pygazette.cli.run_consumer import run

    run(UserTotals(), name="pipeline-totals")
