"""Applications the consumer process tests run (`--app tests.consumer.apps:Counter`).

`Counter` counts source messages per key in its store and, for each message, publishes
(uncommitted) the key's new count. Committed outputs then show exactly-once processing
directly: for every key they must be 1, 2, …, N with no gap and no repeat — a lost or
duplicated input, or state that went backwards, shows up as a wrong sequence.

Its store is a JSONFileStore, or, for shards whose id ends in `-sqlite`, a SQLiteStore
(table `counts(k, n)`) that compacts its recovery log early (after 32 KiB of history), or,
for shards whose id ends in `-rocksdb`, a RocksDBStore (key -> decimal count).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable
from typing import Any

from pygazette.consumer.json_file_store import JSONFileStore
from pygazette.consumer.memory_store import MemoryStore
from pygazette.consumer.rocksdb_store import RocksDBStore
from pygazette.consumer.sqlite_store import SQLiteStore
from pygazette.consumer.store import Store
from pygazette.message.envelope import Envelope
from pygazette.message.publisher import Publisher

NDJSON = "application/x-ndjson"
COUNTS = "CREATE TABLE IF NOT EXISTS counts (k TEXT PRIMARY KEY, n INTEGER NOT NULL)"


class Counter:
    def __init__(self) -> None:
        self.output = os.environ.get("COUNTER_OUTPUT", "tests/consumer/out")
        self.fail_on = os.environ.get("COUNTER_FAIL_ON", "")
        # Bytes of detail the failure's message carries after its first words.
        self.fail_detail = int(os.environ.get("COUNTER_FAIL_DETAIL_BYTES", "0"))

    def new_store(self, shard: Any, recorder: Any) -> Store | Awaitable[Store]:
        if shard.id in os.environ.get("COUNTER_BROKEN_STORES", "").split(","):
            raise OSError(f"cannot open the store of {shard.id}")
        if recorder is not None and shard.id.endswith("-sqlite"):
            return SQLiteStore(recorder, bootstrap_sql=COUNTS, compact_min_bytes=32 << 10)
        if recorder is not None and shard.id.endswith("-rocksdb"):
            return RocksDBStore.open(recorder)  # An awaitable: opened on a worker thread.
        if recorder is not None:
            return JSONFileStore(recorder, {"counts": {}})
        return MemoryStore({"counts": {}})

    def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Publisher) -> None:
        key = env.message["key"]
        if self.fail_on and key == self.fail_on:
            raise ValueError(
                f"cannot count key {key!r}" + " " * bool(self.fail_detail) + "x" * self.fail_detail
            )
        if isinstance(store, SQLiteStore):
            ((count,),) = store.db.execute(
                "INSERT INTO counts VALUES (?, 1) ON CONFLICT(k) DO UPDATE SET n = n + 1 "
                "RETURNING n",
                (key,),
            ).fetchall()
        elif isinstance(store, RocksDBStore):
            count = int(store.get(key.encode()) or b"0") + 1
            store.put(key.encode(), str(count).encode())
        else:
            counts = store.state["counts"]
            counts[key] = count = counts.get(key, 0) + 1
        pub.publish_uncommitted(
            lambda _m: (self.output, NDJSON), {"key": key, "count": count, "shard": shard.id}
        )

    def finalize_txn(self, shard: Any, store: Any, pub: Publisher) -> None:
        pass
