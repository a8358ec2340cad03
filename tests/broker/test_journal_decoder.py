"""Decoded journal specs (`broker.allocation.JournalDecoder`): shared, and gone with their
key-values."""

from __future__ import annotations

import gc

from pygazette.broker.allocation import JournalDecoder
from pygazette.keyspace.keyspace import KeyValue
from pygazette.keyspace.layout import KeyLayout
from pygazette.protocol.pb import protocol_pb2 as pb

LAYOUT = KeyLayout("/decoder-test")


def _kv(name: str, revision: int, replication: int = 2) -> KeyValue:
    spec = pb.JournalSpec(name=name, replication=replication)
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.refresh_interval.seconds = 300
    return KeyValue(LAYOUT.item_key(name), spec.SerializeToString(), revision, revision)


def test_specs_are_decoded_once_and_go_with_their_key_values() -> None:
    # A broker whose journals come and go (per-run journals, created and deleted) or whose
    # specs change: decoded specs were cached per key and mod revision until 100,000 of
    # them (~1.5 KiB each: ~145 MiB) were held, those of deleted journals and of every
    # earlier revision included. Three rounds of 300 journals deleted and re-created on a
    # three-broker cluster left each broker holding 1,200 specs for 300 journals.
    decoder = JournalDecoder(LAYOUT)
    live = [_kv(f"churn/j-{i}", 10 + i) for i in range(100)]
    specs = [decoder.journal_spec(kv) for kv in live]
    again = [decoder.journal_spec(kv) for kv in live]
    assert all(a is b for a, b in zip(again, specs, strict=True))  # Decoded once, shared.
    assert decoder.cached_specs == 100

    for round_ in range(3):  # Deleted and re-created: new key-values of the same keys.
        live = [_kv(f"churn/j-{i}", 1000 * (round_ + 1) + i) for i in range(100)]
        names = [decoder.journal_spec(kv).name for kv in live]
        assert names == [f"churn/j-{i}" for i in range(100)]
        gc.collect()
        assert decoder.cached_specs == 100

    changed = _kv("churn/j-0", 5000, replication=3)  # A spec update replaces its key-value.
    live[0] = changed
    assert decoder.journal_spec(changed).replication == 3
    gc.collect()
    assert decoder.cached_specs == 100
    del live, changed
    gc.collect()
    assert decoder.cached_specs == 0
