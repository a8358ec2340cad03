"""The only consumer on an embedded keyspace: its FAILED shards start afresh on a restart."""

from __future__ import annotations

from pygazette.consumer.key_space import ShardDecoder
from pygazette.consumer.local_session import clear_failed_assignments
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Put
from pygazette.keyspace.layout import AssignmentKey, KeyLayout
from pygazette.protocol.pb import consumer_pb2 as cpb

RS = cpb.ReplicaStatus
LAYOUT = KeyLayout("/gazette/consumers/app")


def _status(code: int, *errors: str) -> bytes:
    return RS(code=code, errors=list(errors)).SerializeToString()  # type: ignore[arg-type]


async def test_a_restart_clears_only_its_own_failed_assignments() -> None:
    # On etcd, a restarted consumer's old lease and its assignments (FAILED ones too) are
    # gone. Here they outlived the process: a failed shard stayed FAILED across restarts.
    ks = EmbeddedKeyspace(None)
    key = LAYOUT.assignment_key
    assignments = {
        key(AssignmentKey("shard-a", "zone", "me", 0)): _status(RS.FAILED, "boom"),
        key(AssignmentKey("shard-b", "zone", "me", 0)): _status(RS.PRIMARY),
        key(AssignmentKey("shard-c", "zone", "me", 1)): _status(RS.FAILED, "boom"),
        key(AssignmentKey("shard-d", "zone", "other", 0)): _status(RS.FAILED, "boom"),
        key(AssignmentKey("shard-e", "zone", "me", 0)): b"",  # IDLE, just assigned.
    }
    await ks.txn([], [Put(k, v) for k, v in assignments.items()])
    decoder = ShardDecoder(LAYOUT)
    cleared = await clear_failed_assignments(ks, LAYOUT, decoder, "zone", "me")
    assert sorted(cleared) == ["shard-a", "shard-c"]
    left = sorted(LAYOUT.parse_assignment_key(kv.key).item for kv in ks.range(LAYOUT.assign_prefix))
    assert left == ["shard-b", "shard-d", "shard-e"]
    assert await clear_failed_assignments(ks, LAYOUT, decoder, "zone", "me") == []
