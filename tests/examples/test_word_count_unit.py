"""word-count without servers: Gazette's tokenizer and N-grams, the deltas' mapping, and the
Counter folding deltas into its SQLite store."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson

from examples.word_count.counter import Counter, read_count
from examples.word_count.publish import merge_offsets
from examples.word_count.wordcount import FRAMING, deltas_mapping, ngram_counts, ngrams, tokenize
from pygazette.message.envelope import Envelope
from pygazette.message.mapping import fnv1a32
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb


def test_tokens_and_ngrams_as_gazettes_publish() -> None:
    assert tokenize("It was the best—of times, it WAS 1859!") == [
        "it", "was", "the", "best", "of", "times", "it", "was",
    ]  # fmt: skip
    assert tokenize("Crusoe\u2019s \u00c9clair") == ["crusoe", "s", "éclair"]
    assert ngrams("a b c") == ["a", "b", "c", "END"]
    assert ngrams("a b c", 2) == ["START a", "a b", "b c", "c END", "END END"]
    assert ngrams("", 2) == ["START END", "END END"]


def test_deltas_carry_counts_and_map_by_ngram() -> None:
    deltas = {d["NGram"]: d["Count"] for d in ngram_counts("it was it")}
    assert deltas == {"it": 2, "was": 1, "END": 1}
    msg = ngram_counts("x")[0]
    FRAMING.set_uuid(msg, "9f2952f3-c6a3-11ea-8802-080607050309")
    assert FRAMING.marshal(msg) == (
        b'{"UUID":"9f2952f3-c6a3-11ea-8802-080607050309","NGram":"x","Count":1}\n'
    )
    listing = pb.ListResponse()
    for i in range(4):
        j = listing.journals.add()
        j.spec.name = f"examples/word-count/deltas/part-{i:03d}"
        j.spec.labels.CopyFrom(label_set({"content-type": "application/x-ndjson"}))
    mapping = deltas_mapping(listing)
    for gram in ("it", "was", "it was"):
        want = f"examples/word-count/deltas/part-{fnv1a32(gram) % 4:03d}"
        assert mapping(gram)[0] == want
        assert mapping({"NGram": gram, "Count": 1})[0] == want


async def test_counter_adds_deltas_in_its_sqlite_store(tmp_path: Path) -> None:
    spec = cpb.ShardSpec(id="shard-000")
    shard: Any = SimpleNamespace(id=spec.id, spec=spec, local_dir=str(tmp_path))
    store = Counter.new_store(shard, None)
    try:
        for text in ("it was the best", "it was the worst", "it is"):
            Counter.begin_txn(shard, store)
            for delta in ngram_counts(text):
                doc = orjson.loads(FRAMING.marshal(dict(delta, UUID="")))
                Counter.consume_message(shard, store, Envelope("j", 0, 1, doc), None)  # type: ignore[arg-type]
            Counter.finalize_txn(shard, store, None)  # type: ignore[arg-type]
            await store.start_commit(shard, cpb.Checkpoint(), [])
        store.destroy()
        store = Counter.new_store(shard, None)  # Reopened: the counts are durable.
        await store.restore_checkpoint(shard)
        assert read_count(store.db, "it") == [("it", 3)]
        assert read_count(store.db, "worst") == [("worst", 1)]
        assert read_count(store.db, "nope") == []
        assert read_count(store.db, "w", prefix=True) == [("was", 2), ("worst", 1)]
    finally:
        store.destroy()


def test_offsets_file_keeps_the_largest_offset(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    merge_offsets(path, {"a": 10, "b": 5})
    assert merge_offsets(path, {"a": 7, "c": 1}) == {"a": 10, "b": 5, "c": 1}
