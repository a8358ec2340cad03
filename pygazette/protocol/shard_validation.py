"""Consumer-protocol model: validation of shard specs, statuses, hints and Shard RPCs,
and the ShardSpec helpers (recovery log, hint keys, label set, spec algebra).

Rules and error wording follow Gazette v0.103 (consumer/protocol
shard_spec_extensions.go and rpc_extensions.go, consumer/recoverylog Segment and
FSMHints Validate), so errors read the same from either system. Every check
raises `ValidationError`, whose context names the field at fault
(``"Sources[1].Journal: invalid length (2; expected 4 <= length <= 512)"``).
Token, journal, label and route rules are those of `validation`, reused here.

`validate_checkpoint` has no Gazette counterpart (Gazette does not validate a
Checkpoint); its rules are the invariants of Gazette's checkpoint construction
(see its docstring).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.labels import intersect_label_sets as _intersect_labels
from pygazette.protocol.labels import label_values, union_label_sets
from pygazette.protocol.labels import subtract_label_sets as _subtract_labels
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from pygazette.protocol.validation import (
    TOKEN_SYMBOLS,
    go_path_clean,
    validate_apply_change,
    validate_go_duration,
    validate_header,
    validate_journal_name,
    validate_label_selector,
    validate_label_set,
    validate_process_spec,
    validate_route,
    validate_single_value_labels,
    validate_token,
)

__all__ = [
    "MAX_SHARD_ID_LEN",
    "MIN_SHARD_ID_LEN",
    "PRODUCER_ID_LEN",
    "SHARD_ID_LABEL",
    "desired_replication",
    "flatten_read_through",
    "hint_backup_keys",
    "hint_primary_key",
    "intersect_shard_specs",
    "recovery_log",
    "reduce_replica_status",
    "shard_label_set_ext",
    "subtract_shard_specs",
    "union_shard_specs",
    "validate_checkpoint",
    "validate_consumer_spec",
    "validate_consumer_status",
    "validate_fsm_hints",
    "validate_get_hints_request",
    "validate_get_hints_response",
    "validate_offsets",
    "validate_replica_status",
    "validate_segment",
    "validate_shard_apply_request",
    "validate_shard_apply_response",
    "validate_shard_id",
    "validate_shard_list_request",
    "validate_shard_list_response",
    "validate_shard_spec",
    "validate_shard_spec_source",
    "validate_stat_request",
    "validate_stat_response",
    "validate_unassign_request",
    "validate_unassign_response",
    "validate_unassign_response_status",
]

MIN_SHARD_ID_LEN, MAX_SHARD_ID_LEN = 4, 512
# Reserved label: a shard's ID, added to its labels for selection (LabelSetExt).
SHARD_ID_LABEL = "id"
# A message producer ID is 6 bytes (Gazette's message.ProducerID).
PRODUCER_ID_LEN = 6

_MAX_UINT32 = (1 << 32) - 1


def _journal(name: str, field: str) -> None:
    try:
        validate_journal_name(name)
    except ValidationError as err:
        raise err.extend(field) from None


# --- shard IDs and specs -----------------------------------------------------------


def validate_shard_id(shard_id: str) -> None:
    """A shard ID: a token of 4..512 UTF-8 bytes of letters, digits and ``-_+/.``."""
    validate_token(shard_id, "", TOKEN_SYMBOLS, MIN_SHARD_ID_LEN, MAX_SHARD_ID_LEN)


def _shard_id_field(shard_id: str, field: str) -> None:
    try:
        validate_shard_id(shard_id)
    except ValidationError as err:
        raise err.extend(field) from None


def validate_shard_spec_source(source: cpb.ShardSpec.Source) -> None:
    """A source journal name (a ";meta" suffix allowed) and a non-negative min_offset."""
    _journal(source.journal, "Journal")
    if source.min_offset < 0:
        # Gazette's wording ("expected > 0") although zero is accepted.
        raise ValidationError(f"invalid MinOffset ({source.min_offset}; expected > 0)")


def _is_absolute_clean_non_dir_path(path: str) -> bool:
    # Go: path.IsAbs(p) && path.Clean(p) == p && path.Base(p) != "" (never "").
    return path.startswith("/") and go_path_clean(path) == path


def validate_shard_spec(spec: cpb.ShardSpec) -> None:
    """Gazette's ShardSpec.Validate.

    - ``id`` is a valid shard ID;
    - with a ``recovery_log_prefix``, the recovery log ``<prefix>/<id>`` is a valid
      journal name, and ``hint_prefix`` is an absolute, clean path (like ``/hints``);
      without one, ``hint_prefix`` must be empty;
    - ``hint_backups >= 0``, ``min_txn_duration >= 0``, ``max_txn_duration > 0``;
    - labels are a valid label set, single-value labels have one value, and the
      reserved label ``id`` is absent;
    - sources are valid, and their journals unique and sorted.
    """
    try:
        validate_shard_id(spec.id)
    except ValidationError as err:
        raise err.extend("Id") from None
    if spec.recovery_log_prefix:
        try:
            validate_journal_name(recovery_log(spec))
        except ValidationError as err:
            raise err.extend("RecoveryLogPrefix") from None
        if not _is_absolute_clean_non_dir_path(spec.hint_prefix):
            raise ValidationError(
                f"HintPrefix is not an absolute, clean, non-directory path ({spec.hint_prefix})"
            )
    elif spec.hint_prefix:
        raise ValidationError(
            f"invalid non-empty HintPrefix with empty RecoveryLogPrefix ({spec.hint_prefix})"
        )
    if spec.hint_backups < 0:
        raise ValidationError(f"invalid HintBackups ({spec.hint_backups}; expected >= 0)")
    min_txn = spec.min_txn_duration.ToNanoseconds()
    if min_txn < 0:
        raise ValidationError(f"invalid MinTxnDuration ({min_txn}; expected >= 0)")
    max_txn = spec.max_txn_duration.ToNanoseconds()
    if max_txn <= 0:
        raise ValidationError(f"invalid MaxTxnDuration ({max_txn}; expected > 0)")
    try:
        validate_label_set(spec.labels)
        validate_single_value_labels(spec.labels)
    except ValidationError as err:
        raise err.extend("LabelSet") from None
    if label_values(spec.labels, SHARD_ID_LABEL):
        raise ValidationError(f'Labels cannot include label "{SHARD_ID_LABEL}"')
    for i, source in enumerate(spec.sources):
        try:
            validate_shard_spec_source(source)
        except ValidationError as err:
            raise err.extend(f"Sources[{i}]") from None
        if i and source.journal <= spec.sources[i - 1].journal:
            raise ValidationError(
                f"Sources.Journal not in unique, sorted order (index {i}; "
                f"{source.journal} <= {spec.sources[i - 1].journal})"
            )


def validate_consumer_spec(spec: cpb.ConsumerSpec) -> None:
    """The embedded ProcessSpec: a valid process ID and endpoint. (Any shard_limit.)"""
    validate_process_spec(spec.process_spec)


def _enum_name(enum: object, value: int) -> str:
    try:
        return str(enum.Name(value))  # type: ignore[attr-defined]
    except ValueError:
        return str(value)


def validate_consumer_status(status: int) -> None:
    """A known `consumer.Status` value."""
    if status not in cpb.Status.values():
        raise ValidationError(f"invalid status ({status})")


def validate_replica_status(status: cpb.ReplicaStatus) -> None:
    """A known code; errors present exactly when the code is FAILED."""
    if status.code not in cpb.ReplicaStatus.Code.values():
        raise ValidationError(f"invalid code ({status.code})", ["Code"])
    if not status.errors:
        if status.code == cpb.ReplicaStatus.FAILED:
            raise ValidationError("expected non-empty Errors with Code FAILED")
    elif status.code != cpb.ReplicaStatus.FAILED:
        raise ValidationError("expected Code FAILED with non-empty Errors")


def reduce_replica_status(into: cpb.ReplicaStatus, other: cpb.ReplicaStatus) -> None:
    """Fold `other` into `into` (in place): the greater code wins, errors accumulate."""
    if other.code > into.code:
        into.code = other.code
    into.errors.extend(other.errors)


# --- checkpoints -------------------------------------------------------------------


def validate_checkpoint(cp: cpb.Checkpoint) -> None:
    """Invariants of a checkpoint as Gazette builds one (BuildCheckpoint).

    Gazette itself has no Checkpoint.Validate; these rules are what a checkpoint
    recovered from a log must satisfy to be used:

    - every source key and ack-intent key is a valid journal name (";meta" allowed,
      as read-through offsets are keyed by the journal as read);
    - ``read_through >= 0``;
    - each producer ID is 6 bytes and appears once per source;
    - a producer's ``begin`` is -1 (no pending transaction) or an offset >= 0.
    """
    for journal in sorted(cp.sources):
        source = cp.sources[journal]
        try:
            _journal(journal, "Journal")
            if source.read_through < 0:
                raise ValidationError(f"invalid ReadThrough ({source.read_through}; expected >= 0)")
            seen: set[bytes] = set()
            for i, entry in enumerate(source.producers):
                try:
                    if len(entry.id) != PRODUCER_ID_LEN:
                        raise ValidationError(
                            f"invalid Id length ({len(entry.id)}; expected {PRODUCER_ID_LEN})"
                        )
                    if entry.id in seen:
                        raise ValidationError(f"duplicate producer Id ({entry.id.hex()})")
                    seen.add(entry.id)
                    if entry.state.begin < -1:
                        raise ValidationError(
                            f"invalid State.Begin ({entry.state.begin}; expected >= -1)"
                        )
                except ValidationError as err:
                    raise err.extend(f"Producers[{i}]") from None
        except ValidationError as err:
            raise err.extend(f"Sources[{journal}]") from None
    for journal in sorted(cp.ack_intents):
        _journal(journal, f"AckIntents[{journal}]")


def flatten_read_through(cp: cpb.Checkpoint) -> dict[str, int]:
    """Journal → read-through offset of each source of the checkpoint."""
    return {journal: int(source.read_through) for journal, source in cp.sources.items()}


def validate_offsets(offsets: Mapping[str, int]) -> None:
    """Gazette's Offsets.Validate: valid journal keys, offsets >= 0."""
    for journal in sorted(offsets):
        try:
            validate_journal_name(journal)
            if offsets[journal] < 0:
                raise ValidationError(f"invalid offset ({offsets[journal]}; expected >= 0)")
        except ValidationError as err:
            raise err.extend(f"Offsets[{journal}]") from None


# --- recovery-log hints ------------------------------------------------------------


def validate_segment(segment: rpb.Segment) -> None:
    """Gazette's recoverylog Segment.Validate."""
    if segment.author == 0:
        raise ValidationError("Author is zero")
    if segment.first_seq_no <= 0:
        raise ValidationError("FirstSeqNo <= 0")
    if segment.first_offset < 0:
        raise ValidationError("FirstOffset < 0")
    if segment.last_seq_no < segment.first_seq_no:
        raise ValidationError("LastSeqNo < segment.FirstSeqNo")
    if segment.last_offset != 0 and segment.last_offset <= segment.first_offset:
        raise ValidationError("LastOffset <= segment.FirstOffset")
    _journal(segment.log, "Log")


def validate_fsm_hints(hints: rpb.FSMHints) -> None:
    """Every segment is valid; a segment's empty log means the hints' log, and a
    segment may not repeat the hints' log explicitly."""
    for node in hints.live_nodes:
        for segment in node.segments:
            if not segment.log:
                effective = rpb.Segment()
                effective.CopyFrom(segment)
                effective.log = hints.log
                segment = effective
            elif segment.log == hints.log:
                raise ValidationError("contained segment.Log duplicates FSMHints.Log")
            try:
                validate_segment(segment)
            except ValidationError as err:
                raise err.extend("Segment") from None


# --- Shard RPCs --------------------------------------------------------------------


def validate_shard_list_request(req: cpb.ListRequest) -> None:
    try:
        validate_label_selector(req.selector)
    except ValidationError as err:
        raise err.extend("Selector") from None


def _status_header(resp: object) -> None:
    try:
        validate_consumer_status(resp.status)  # type: ignore[attr-defined]
    except ValidationError as err:
        raise err.extend("Status") from None
    try:
        validate_header(resp.header)  # type: ignore[attr-defined]
    except ValidationError as err:
        raise err.extend("Header") from None


def _validate_listed_shard(shard: cpb.ListResponse.Shard) -> None:
    try:
        validate_shard_spec(shard.spec)
    except ValidationError as err:
        raise err.extend("Spec") from None
    if shard.mod_revision <= 0:
        raise ValidationError(f"invalid ModRevision ({shard.mod_revision}; expected > 0)")
    try:
        validate_route(shard.route)
    except ValidationError as err:
        raise err.extend("Route") from None
    members, statuses = len(shard.route.members), len(shard.status)
    if members != statuses:
        raise ValidationError(
            f"length of Route.Members and Status are not equal ({members} vs {statuses})"
        )
    for i, status in enumerate(shard.status):
        try:
            validate_replica_status(status)
        except ValidationError as err:
            raise err.extend(f"Status[{i}]") from None


def validate_shard_list_response(resp: cpb.ListResponse) -> None:
    _status_header(resp)
    for i, shard in enumerate(resp.shards):
        try:
            _validate_listed_shard(shard)
        except ValidationError as err:
            raise err.extend(f"Shards[{i}]") from None


def _validate_applied_spec(spec: cpb.ShardSpec) -> None:
    validate_shard_spec(spec)
    # Durations Gazette can decode (see validation.validate_go_duration): not part of
    # validate_shard_spec, so that a spec stored before this check stays readable here.
    for field, name in (
        ("max_txn_duration", "MaxTxnDuration"),
        ("min_txn_duration", "MinTxnDuration"),
    ):
        if spec.HasField(field):
            try:
                validate_go_duration(getattr(spec, field))
            except ValidationError as err:
                raise err.extend(name) from None


def _validate_change(change: cpb.ApplyRequest.Change) -> None:
    validate_apply_change(change, _validate_applied_spec, validate_shard_id)
    if not change.HasField("primary_hints"):
        return
    if not change.HasField("upsert"):
        raise ValidationError("hints may be set only with an upsert, not a delete")
    try:
        validate_fsm_hints(change.primary_hints)
    except ValidationError as err:
        raise err.extend("PrimaryHints") from None


def validate_shard_apply_request(req: cpb.ApplyRequest) -> None:
    """Each change is exactly one of upsert / delete, with a sane expect_mod_revision.

    Upsert: revision >= 0 (0 creates) or -1 (any), optional primary hints.
    Delete: revision > 0 or -1, no hints.
    """
    for i, change in enumerate(req.changes):
        try:
            _validate_change(change)
        except ValidationError as err:
            raise err.extend(f"Changes[{i}]") from None


def validate_shard_apply_response(resp: cpb.ApplyResponse) -> None:
    _status_header(resp)


def validate_stat_request(req: cpb.StatRequest) -> None:
    if req.HasField("header"):
        try:
            validate_header(req.header)
        except ValidationError as err:
            raise err.extend("Header") from None
    _shard_id_field(req.shard, "Shard")
    try:
        validate_offsets(req.read_through)
    except ValidationError as err:
        raise err.extend("ReadThrough") from None


def validate_stat_response(resp: cpb.StatResponse) -> None:
    _status_header(resp)
    for field, offsets in (("ReadThrough", resp.read_through), ("PublishAt", resp.publish_at)):
        try:
            validate_offsets(offsets)
        except ValidationError as err:
            raise err.extend(field) from None


def validate_get_hints_request(req: cpb.GetHintsRequest) -> None:
    _shard_id_field(req.shard, "Shard")


def _response_hints(hints: cpb.GetHintsResponse.ResponseHints, field: str) -> None:
    if hints.HasField("hints"):
        try:
            validate_fsm_hints(hints.hints)
        except ValidationError as err:
            raise err.extend(field) from None


def validate_get_hints_response(resp: cpb.GetHintsResponse) -> None:
    """Status, then primary and backup hints (Gazette does not check the header)."""
    try:
        validate_consumer_status(resp.status)
    except ValidationError as err:
        raise err.extend("Status") from None
    _response_hints(resp.primary_hints, "primary hints")
    for hints in resp.backup_hints:
        _response_hints(hints, "backup hints")


def validate_unassign_request(req: cpb.UnassignRequest) -> None:
    for i, shard in enumerate(req.shards):
        _shard_id_field(shard, f"Shards[{i}]")


def validate_unassign_response_status(resp: cpb.UnassignResponse) -> None:
    """A known status: what may be checked of an UnassignResponse whatever its status.

    Gazette's UnassignResponse.Validate (`validate_unassign_response`) refuses every status but
    OK, while its own server answers ETCD_TRANSACTION_FAILED when the transaction fails: a
    status to report, not a malformed response.
    """
    try:
        validate_consumer_status(resp.status)
    except ValidationError as err:
        raise err.extend("Status") from None


def validate_unassign_response(resp: cpb.UnassignResponse) -> None:
    """A known status, which must be OK (as Gazette's: "bad status: <name>")."""
    try:
        validate_consumer_status(resp.status)
    except ValidationError as err:
        raise err.extend("Status") from None
    if resp.status != cpb.OK:
        raise ValidationError(f"bad status: {_enum_name(cpb.Status, resp.status)}")


# --- ShardSpec helpers -------------------------------------------------------------


def recovery_log(spec: cpb.ShardSpec) -> str:
    """The shard's recovery-log journal, ``<recovery_log_prefix>/<id>``; "" if none."""
    if not spec.recovery_log_prefix:
        return ""
    return f"{spec.recovery_log_prefix}/{spec.id}"


def hint_primary_key(spec: cpb.ShardSpec) -> str:
    """Etcd key of the shard's recorded primary hints: ``<hint_prefix>/<id>.primary``."""
    return f"{spec.hint_prefix}/{spec.id}.primary"


def hint_backup_keys(spec: cpb.ShardSpec) -> list[str]:
    """Etcd keys of verified backup hints, newest first:
    ``<hint_prefix>/<id>.backup.<i>`` for i in 0..hint_backups-1."""
    return [f"{spec.hint_prefix}/{spec.id}.backup.{i}" for i in range(max(spec.hint_backups, 0))]


def shard_label_set_ext(spec: cpb.ShardSpec) -> pb.LabelSet:
    """The shard's labels plus ``id=<shard id>`` — what List selectors match against."""
    meta = pb.LabelSet(labels=[pb.Label(name=SHARD_ID_LABEL, value=spec.id)])
    return union_label_sets(meta, spec.labels)


def desired_replication(spec: cpb.ShardSpec, max_hot_standbys: int = _MAX_UINT32) -> int:
    """Replicas the allocator assigns: 0 if disabled, else 1 + hot standbys (capped)."""
    if spec.disable:
        return 0
    return 1 + min(int(spec.hot_standbys), max_hot_standbys)


def _sources(spec: cpb.ShardSpec) -> list[tuple[str, int]]:
    return [(s.journal, int(s.min_offset)) for s in spec.sources]


def _set_sources(spec: cpb.ShardSpec, sources: Iterable[cpb.ShardSpec.Source]) -> None:
    copies = [cpb.ShardSpec.Source(journal=s.journal, min_offset=s.min_offset) for s in sources]
    del spec.sources[:]
    spec.sources.extend(copies)


def _copy(spec: cpb.ShardSpec) -> cpb.ShardSpec:
    out = cpb.ShardSpec()
    out.CopyFrom(spec)
    return out


# Scalar fields of ShardSpec handled alike by the spec algebra (zero = unset).
_SCALARS = (
    "recovery_log_prefix",
    "hint_prefix",
    "hint_backups",
    "disable",
    "hot_standbys",
    "disable_wait_for_ack",
    "ring_buffer_size",
    "read_channel_size",
)
_DURATIONS = ("max_txn_duration", "min_txn_duration")


def _finish(spec: cpb.ShardSpec, labels: pb.LabelSet) -> cpb.ShardSpec:
    """Set the result's labels, and leave zero-valued messages unset (canonical form)."""
    spec.ClearField("labels")
    if labels.labels:
        spec.labels.CopyFrom(labels)
    for name in _DURATIONS:
        if getattr(spec, name).ToNanoseconds() == 0:
            spec.ClearField(name)
    return spec


def union_shard_specs(a: cpb.ShardSpec, b: cpb.ShardSpec) -> cpb.ShardSpec:
    """Gazette's UnionShardSpecs: `a`, with each zero-valued field taken from `b`.

    Sources are taken from `b` only if `a` has none; labels are unioned name by
    name, `a`'s values winning. `a`'s id is kept. Inputs are not modified.
    """
    out = _copy(a)
    if not out.sources:
        _set_sources(out, b.sources)
    for name in _SCALARS:
        if not getattr(out, name):
            setattr(out, name, getattr(b, name))
    for name in _DURATIONS:
        if getattr(out, name).ToNanoseconds() == 0:
            getattr(out, name).CopyFrom(getattr(b, name))
    return _finish(out, union_label_sets(a.labels, b.labels))


def intersect_shard_specs(a: cpb.ShardSpec, b: cpb.ShardSpec) -> cpb.ShardSpec:
    """Gazette's IntersectShardSpecs: `a`, keeping only the field values shared with `b`.

    Every other field is zeroed; labels keep the names whose values are equal in
    both. `a`'s id is kept. Inputs are not modified.
    """
    out = _copy(a)
    if _sources(a) != _sources(b):
        out.ClearField("sources")
    for name in _SCALARS:
        if getattr(a, name) != getattr(b, name):
            out.ClearField(name)
    for name in _DURATIONS:
        if getattr(a, name).ToNanoseconds() != getattr(b, name).ToNanoseconds():
            out.ClearField(name)
    return _finish(out, _intersect_labels(a.labels, b.labels))


def subtract_shard_specs(a: cpb.ShardSpec, b: cpb.ShardSpec) -> cpb.ShardSpec:
    """Gazette's SubtractShardSpecs: `a`, with each field whose value `b` matches zeroed.

    Labels lose the names whose values are equal in `b`. `a`'s id is kept.
    ``union_shard_specs(subtract_shard_specs(a, b), intersect_shard_specs(a, b))``
    equals `a` — how gazctl's shardspace hoists shared fields to a common parent.
    """
    out = _copy(a)
    if _sources(a) == _sources(b):
        out.ClearField("sources")
    for name in _SCALARS:
        if getattr(a, name) == getattr(b, name):
            out.ClearField(name)
    for name in _DURATIONS:
        if getattr(a, name).ToNanoseconds() == getattr(b, name).ToNanoseconds():
            out.ClearField(name)
    return _finish(out, _subtract_labels(a.labels, b.labels))
