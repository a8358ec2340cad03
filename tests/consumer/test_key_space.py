"""The consumer keyspace: Gazette's key layout under an application root, strict decoding of
ShardSpecs, ConsumerSpecs and ReplicaStatuses, and Gazette's shard consistency rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from pygazette.allocator.state import AllocatorState, Assignment, Item
from pygazette.consumer.key_space import (
    ShardDecoder,
    canonical_shard_spec,
    decode_consumer_spec,
    decode_replica_status,
    decode_shard_spec,
    shard_is_consistent,
)
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import KeyValue, Put
from pygazette.keyspace.layout import AssignmentKey, KeyDecodeError, KeyLayout
from pygazette.protocol.pb import consumer_pb2 as cpb

ROOT = "/gazette/consumers/app"
LAYOUT = KeyLayout(ROOT)
RS = cpb.ReplicaStatus


def shard(shard_id: str, **kwargs: object) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(id=shard_id, **kwargs)  # type: ignore[arg-type]
    spec.max_txn_duration.seconds = 1
    return spec


def consumer(zone: str, suffix: str, limit: int = 10, exiting: bool = False) -> cpb.ConsumerSpec:
    spec = cpb.ConsumerSpec(shard_limit=limit, exiting=exiting)
    spec.process_spec.id.zone = zone
    spec.process_spec.id.suffix = suffix
    spec.process_spec.endpoint = f"http://{suffix}:8080"
    return spec


def kv(key: str, value: bytes, rev: int = 1) -> KeyValue:
    return KeyValue(key, value, rev, rev)


def status(code: int, *errors: str) -> bytes:
    return RS(code=code, errors=list(errors)).SerializeToString()  # type: ignore[arg-type]


def test_layout_is_gazettes_under_the_application_root() -> None:
    # Gazette's consumer.NewKeySpace(prefix) = allocator.NewAllocatorKeySpace(prefix, ...):
    # items, members and assignments under /items/, /members/ and /assign/ of the prefix.
    assert LAYOUT.item_key("shard-000") == "/gazette/consumers/app/items/shard-000"
    assert LAYOUT.member_key("zone-a", "consumer-1") == (
        "/gazette/consumers/app/members/zone-a#consumer-1"
    )
    key = LAYOUT.assignment_key(AssignmentKey("shard-000", "zone-a", "consumer-1", 1))
    assert key == "/gazette/consumers/app/assign/shard-000#zone-a#consumer-1#1"


def test_decode_shard_spec() -> None:
    spec = shard("shard-000", hot_standbys=2)
    got = decode_shard_spec(LAYOUT, kv(LAYOUT.item_key("shard-000"), spec.SerializeToString()))
    assert got == spec

    with pytest.raises(KeyDecodeError, match="ShardSpec ID doesn't match Item ID"):
        decode_shard_spec(LAYOUT, kv(LAYOUT.item_key("shard-001"), spec.SerializeToString()))
    bad = cpb.ShardSpec(id="shard-000")  # No max_txn_duration.
    with pytest.raises(KeyDecodeError, match="MaxTxnDuration"):
        decode_shard_spec(LAYOUT, kv(LAYOUT.item_key("shard-000"), bad.SerializeToString()))
    with pytest.raises(KeyDecodeError):
        decode_shard_spec(LAYOUT, kv(LAYOUT.item_key("shard-000"), b"\xff\xff\xff"))


def test_decode_consumer_spec() -> None:
    spec = consumer("zone-a", "consumer-1")
    key = LAYOUT.member_key("zone-a", "consumer-1")
    assert decode_consumer_spec(LAYOUT, kv(key, spec.SerializeToString())) == spec

    other = LAYOUT.member_key("zone-b", "consumer-1")
    with pytest.raises(KeyDecodeError, match="Zone doesn't match"):
        decode_consumer_spec(LAYOUT, kv(other, spec.SerializeToString()))
    other = LAYOUT.member_key("zone-a", "consumer-2")
    with pytest.raises(KeyDecodeError, match="Suffix doesn't match"):
        decode_consumer_spec(LAYOUT, kv(other, spec.SerializeToString()))
    spec.process_spec.endpoint = "not a URL"
    with pytest.raises(KeyDecodeError, match="Endpoint"):
        decode_consumer_spec(LAYOUT, kv(key, spec.SerializeToString()))


def test_decode_replica_status() -> None:
    key = LAYOUT.assignment_key(AssignmentKey("shard-000", "zone-a", "consumer-1", 0))
    # A new assignment's empty value is IDLE.
    assert decode_replica_status(kv(key, b"")) == RS(code=RS.IDLE)
    assert decode_replica_status(kv(key, status(RS.PRIMARY))).code == RS.PRIMARY
    assert decode_replica_status(kv(key, status(RS.FAILED, "boom"))).errors == ["boom"]
    with pytest.raises(KeyDecodeError, match="non-empty Errors with Code FAILED"):
        decode_replica_status(kv(key, status(RS.FAILED)))
    with pytest.raises(KeyDecodeError, match="Code FAILED with non-empty Errors"):
        decode_replica_status(kv(key, status(RS.STANDBY, "boom")))


def test_canonical_spec_carries_gazettes_non_nullable_fields() -> None:
    spec = shard("shard-000")
    out = canonical_shard_spec(spec)
    assert out.HasField("labels") and out.HasField("min_txn_duration")
    # Field 10 (labels, empty) and field 7 (min_txn_duration, empty) are on the wire.
    wire = out.SerializeToString(deterministic=True)
    assert b"\x52\x00" in wire and b"\x3a\x00" in wire
    assert cpb.ShardSpec.FromString(wire) == out
    assert not spec.HasField("labels")  # The input is untouched.


def test_decoder_replication_and_limits() -> None:
    dec = ShardDecoder(LAYOUT)
    key = LAYOUT.item_key("shard-000")
    assert dec.item_replication("shard-000", kv(key, shard("shard-000").SerializeToString())) == 1
    spec = shard("shard-000", hot_standbys=2)
    assert dec.item_replication("shard-000", kv(key, spec.SerializeToString(), 2)) == 3
    spec.disable = True
    assert dec.item_replication("shard-000", kv(key, spec.SerializeToString(), 3)) == 0

    member = LAYOUT.member_key("zone-a", "consumer-1")
    value = consumer("zone-a", "consumer-1", 7).SerializeToString()
    assert dec.member_limit("zone-a", "consumer-1", kv(member, value)) == (7, False)
    value = consumer("zone-a", "consumer-1", 7, exiting=True).SerializeToString()
    assert dec.member_limit("zone-a", "consumer-1", kv(member, value, 2)) == (7, True)


def _assignments(*statuses: tuple[int, bytes]) -> list[Assignment]:
    out = []
    for i, (slot, value) in enumerate(statuses):
        key = LAYOUT.assignment_key(AssignmentKey("shard-000", "zone", f"consumer-{i}", slot))
        out.append(Assignment("shard-000", "zone", f"consumer-{i}", slot, kv(key, value, i + 1)))
    return out


@pytest.mark.parametrize(
    ("statuses", "index", "expected"),
    [
        # STANDBY and PRIMARY replicas are ready to take over.
        ([(0, status(RS.PRIMARY)), (1, status(RS.STANDBY))], 1, True),
        ([(0, status(RS.PRIMARY)), (1, status(RS.STANDBY))], 0, True),
        # IDLE (starting; an empty value too) and BACKFILL (reading the log) are not.
        ([(0, status(RS.PRIMARY)), (1, b"")], 1, False),
        ([(0, status(RS.PRIMARY)), (1, status(RS.IDLE))], 1, False),
        ([(0, status(RS.PRIMARY)), (1, status(RS.BACKFILL))], 1, False),
        # FAILED is consistent iff the primary failed too.
        ([(0, status(RS.PRIMARY)), (1, status(RS.FAILED, "x"))], 1, False),
        ([(0, status(RS.FAILED, "x")), (1, status(RS.FAILED, "y"))], 1, True),
        ([(0, status(RS.FAILED, "x")), (1, status(RS.STANDBY))], 0, True),
        ([(1, status(RS.FAILED, "x")), (2, status(RS.FAILED, "y"))], 1, False),
        # An undecodable status is not consistent, nor is it a failed primary.
        ([(0, status(RS.PRIMARY)), (1, b"\xff")], 1, False),
        ([(0, status(RS.FAILED))], 0, False),
        ([(0, b"\xff"), (1, status(RS.FAILED, "x"))], 1, False),
    ],
)
def test_is_consistent(statuses: list[tuple[int, bytes]], index: int, expected: bool) -> None:
    dec = ShardDecoder(LAYOUT)
    all_ = _assignments(*statuses)
    item = Item("shard-000", kv(LAYOUT.item_key("shard-000"), b""), 2)
    assert dec.is_consistent(item, all_[index], all_) is expected


def test_shard_is_consistent_over_statuses() -> None:
    failed = RS(code=RS.FAILED, errors=["x"])
    assert shard_is_consistent(failed, [(0, failed), (1, failed)])
    assert not shard_is_consistent(failed, [(0, RS(code=RS.PRIMARY)), (1, failed)])
    assert not shard_is_consistent(None, [])


async def test_allocator_state_of_a_consumer_keyspace(tmp_path: Path) -> None:
    ks = EmbeddedKeyspace(tmp_path / "ks.json")
    m1 = LAYOUT.member_key("zone-a", "consumer-1")
    m2 = LAYOUT.member_key("zone-b", "consumer-2")
    await ks.txn([], [Put(m1, consumer("zone-a", "consumer-1", 3).SerializeToString())])
    await ks.txn([], [Put(m2, consumer("zone-b", "consumer-2", 5, True).SerializeToString())])
    ops = [
        Put(LAYOUT.item_key("shard-000"), shard("shard-000", hot_standbys=1).SerializeToString()),
        Put(LAYOUT.item_key("shard-001"), shard("shard-001", disable=True).SerializeToString()),
        # A spec filed under the wrong ID is not an item.
        Put(LAYOUT.item_key("shard-002"), shard("shard-xyz").SerializeToString()),
        Put(LAYOUT.member_key("zone-c", "consumer-3"), b"\xff"),
        Put(LAYOUT.assignment_key(AssignmentKey("shard-000", "zone-a", "consumer-1", 0)), b""),
    ]
    await ks.txn([], ops)
    state = AllocatorState.extract(ks, LAYOUT, ShardDecoder(LAYOUT), m1)
    assert [(i.id, i.replication) for i in state.items] == [("shard-000", 2), ("shard-001", 0)]
    assert [(m.suffix, m.item_limit, m.exiting) for m in state.members] == [
        ("consumer-1", 3, False),
        ("consumer-2", 5, True),
    ]
    assert [li.item.id for li in state.local_items] == ["shard-000"]
    assert state.is_leader()
