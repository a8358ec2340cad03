# examples/counter/counter.py: counts words; publishes each word's new count, exactly once.
from pygazette.consumer.sqlite_store import SQLiteStore


def to_counts(msg):  # the journal (and framing) of an output
    return "examples/counts", "application/x-ndjson"


class Counter:
    def new_store(self, shard, recorder):  # recorder: the shard's recovery log
        return SQLiteStore(
            recorder,
            directory=shard.local_dir,
            bootstrap_sql="CREATE TABLE IF NOT EXISTS counts (word TEXT PRIMARY KEY, n INTEGER)",
        )

    def consume_message(self, shard, store, envelope, publisher):
        word = envelope.message["word"]
        store.db.execute(
            "INSERT INTO counts VALUES (?, 1) ON CONFLICT(word) DO UPDATE SET n = n + 1", (word,)
        )
        (n,) = store.db.execute("SELECT n FROM counts WHERE word = ?", (word,)).fetchone()
        publisher.publish_uncommitted(to_counts, {"word": word, "n": n})

    def finalize_txn(self, shard, store, publisher):
        pass


if __name__ == "__main__":
    from pygazette.cli.run_consumer import run

    run(Counter())  # the same flags as `pygazette consumer serve`
