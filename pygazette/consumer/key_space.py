"""Shards and consumer processes as the allocator's items and members.

A consumer application's keyspace uses Gazette's allocator layout (`keyspace.layout`) under
the application's own etcd root (e.g. `/gazette/consumers/<app>`), exactly as Gazette's
`consumer.NewKeySpace(prefix)` lays it out:

    <root>/items/<shard id>                          ShardSpec (protobuf)
    <root>/members/<zone>#<suffix>                   ConsumerSpec (protobuf), under its lease
    <root>/assign/<shard id>#<zone>#<suffix>#<slot>  ReplicaStatus (protobuf; empty = IDLE),
                                                     under the assigned consumer's lease

A shard (item) wants no replica when disabled, else a primary plus `hot_standbys` standbys;
a consumer (member) takes up to its `shard_limit`, and sheds its shards when `exiting`. An
assignment's value is the status its replica last reported. A replica is *consistent* (may
stand in for the primary, so the allocator may drop another one) when it is STANDBY or
PRIMARY; an IDLE or BACKFILL replica is not; a FAILED one is only when the primary has
failed too (Gazette's ShardIsConsistent).

Decoding is strict, as Gazette's decoder is: a spec must validate and carry the ID (or
process ID) its key names. Decoded values are cached per key and mod revision and shared:
callers must not modify them.
"""

from __future__ import annotations

from collections.abc import Sequence

from pygazette.allocator.state import Assignment, Item
from pygazette.keyspace.keyspace import KeyValue
from pygazette.keyspace.layout import KeyDecodeError, KeyLayout, decode_value
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.shard_validation import (
    desired_replication,
    validate_consumer_spec,
    validate_replica_status,
    validate_shard_spec,
)

__all__ = [
    "ShardDecoder",
    "canonical_shard_spec",
    "decode_consumer_spec",
    "decode_replica_status",
    "decode_shard_spec",
    "shard_is_consistent",
]

_CACHE_LIMIT = 100_000


def canonical_shard_spec(spec: cpb.ShardSpec) -> cpb.ShardSpec:
    """A copy of `spec` as Gazette encodes it: its non-nullable sub-messages (labels, both
    transaction durations) present even when empty, so stored specs match Gazette's."""
    out = cpb.ShardSpec()
    out.CopyFrom(spec)
    out.labels.SetInParent()
    out.max_txn_duration.SetInParent()
    out.min_txn_duration.SetInParent()
    return out


def decode_shard_spec(layout: KeyLayout, kv: KeyValue) -> cpb.ShardSpec:
    """The ShardSpec of an item key, which must be valid and carry the key's shard ID."""
    shard_id = layout.parse_item_key(kv.key)
    spec = decode_value(kv, cpb.ShardSpec(), validate_shard_spec)
    if spec.id != shard_id:
        raise KeyDecodeError(f"ShardSpec ID doesn't match Item ID ({spec.id} vs {shard_id})")
    return spec


def decode_consumer_spec(layout: KeyLayout, kv: KeyValue) -> cpb.ConsumerSpec:
    """The ConsumerSpec of a member key, which must be valid and identified like its key."""
    zone, suffix = layout.parse_member_key(kv.key)
    spec = decode_value(kv, cpb.ConsumerSpec(), validate_consumer_spec)
    pid = spec.process_spec.id
    if pid.zone != zone:
        raise KeyDecodeError(f"ConsumerSpec Zone doesn't match Member Zone ({pid.zone} vs {zone})")
    if pid.suffix != suffix:
        raise KeyDecodeError(
            f"ConsumerSpec Suffix doesn't match Member Suffix ({pid.suffix} vs {suffix})"
        )
    return spec


def decode_replica_status(kv: KeyValue) -> cpb.ReplicaStatus:
    """An assignment's ReplicaStatus (an empty value — a new assignment — is IDLE)."""
    return decode_value(kv, cpb.ReplicaStatus(), validate_replica_status)


def shard_is_consistent(
    status: cpb.ReplicaStatus | None, all_statuses: Sequence[tuple[int, cpb.ReplicaStatus | None]]
) -> bool:
    """Gazette's ShardIsConsistent, over decoded statuses.

    `status` is the assignment's (None: undecodable, which Gazette would not even see, so
    it is not consistent); `all_statuses` are (slot, status) of all the shard's assignments.
    """
    if status is None:
        return False
    code = status.code
    if code in (cpb.ReplicaStatus.STANDBY, cpb.ReplicaStatus.PRIMARY):
        return True  # Ready to take over.
    if code == cpb.ReplicaStatus.FAILED:
        # Consistent iff the primary has failed too: swapping one failed replica for
        # another does no harm, and it leaves the current primary free to move or exit.
        return any(
            slot == 0 and other is not None and other.code == cpb.ReplicaStatus.FAILED
            for slot, other in all_statuses
        )
    return False  # IDLE (starting) or BACKFILL (reading the recovery log).


class ShardDecoder:
    """The allocator's decoder for a consumer keyspace (an `AllocatorDecoder`)."""

    def __init__(self, layout: KeyLayout) -> None:
        self.layout = layout
        self._specs: dict[tuple[str, int], cpb.ShardSpec] = {}
        self._members: dict[tuple[str, int], cpb.ConsumerSpec] = {}
        self._statuses: dict[tuple[str, int], cpb.ReplicaStatus | None] = {}

    # Cached decoding (values are shared: don't modify them).
    def shard_spec(self, kv: KeyValue) -> cpb.ShardSpec:
        """The decoded spec of an item key (raises KeyDecodeError)."""
        key = (kv.key, kv.mod_revision)
        spec = self._specs.get(key)
        if spec is None:
            spec = decode_shard_spec(self.layout, kv)
            if len(self._specs) > _CACHE_LIMIT:
                self._specs.clear()
            self._specs[key] = spec
        return spec

    def consumer_spec(self, kv: KeyValue) -> cpb.ConsumerSpec:
        """The decoded spec of a member key (raises KeyDecodeError)."""
        key = (kv.key, kv.mod_revision)
        spec = self._members.get(key)
        if spec is None:
            spec = decode_consumer_spec(self.layout, kv)
            if len(self._members) > _CACHE_LIMIT:
                self._members.clear()
            self._members[key] = spec
        return spec

    def replica_status(self, kv: KeyValue) -> cpb.ReplicaStatus | None:
        """The decoded status of an assignment key (None if it doesn't decode)."""
        key = (kv.key, kv.mod_revision)
        if key in self._statuses:
            return self._statuses[key]
        try:
            status: cpb.ReplicaStatus | None = decode_replica_status(kv)
        except KeyDecodeError:
            status = None
        if len(self._statuses) > _CACHE_LIMIT:
            self._statuses.clear()
        self._statuses[key] = status
        return status

    # AllocatorDecoder.
    def item_replication(self, item_id: str, kv: KeyValue) -> int:
        return desired_replication(self.shard_spec(kv))

    def member_limit(self, zone: str, suffix: str, kv: KeyValue) -> tuple[int, bool]:
        spec = self.consumer_spec(kv)
        return int(spec.shard_limit), bool(spec.exiting)

    def is_consistent(self, item: Item, assignment: Assignment, all_: Sequence[Assignment]) -> bool:
        return shard_is_consistent(
            self.replica_status(assignment.kv),
            [(a.slot, self.replica_status(a.kv)) for a in all_],
        )
