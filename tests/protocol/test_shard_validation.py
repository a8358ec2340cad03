"""Consumer-protocol validation and ShardSpec helpers, against Gazette's rules and wording.

Most cases follow Gazette's own tests (consumer/protocol *_test.go): a message starts
with several faults, and each step fixes one and expects the next error.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from pygazette.protocol.shard_validation import (
    MAX_SHARD_ID_LEN,
    MIN_SHARD_ID_LEN,
    desired_replication,
    flatten_read_through,
    hint_backup_keys,
    hint_primary_key,
    intersect_shard_specs,
    recovery_log,
    reduce_replica_status,
    shard_label_set_ext,
    subtract_shard_specs,
    union_shard_specs,
    validate_checkpoint,
    validate_consumer_spec,
    validate_fsm_hints,
    validate_get_hints_request,
    validate_get_hints_response,
    validate_replica_status,
    validate_shard_apply_request,
    validate_shard_apply_response,
    validate_shard_id,
    validate_shard_list_request,
    validate_shard_list_response,
    validate_shard_spec,
    validate_stat_request,
    validate_stat_response,
    validate_unassign_request,
    validate_unassign_response,
)
from pygazette.protocol.validation import TOKEN_SYMBOLS

Source = cpb.ShardSpec.Source
# Enum values the protocol does not define (typed Any: the stubs accept only known names).
UNKNOWN_STATUS: Any = 9101
UNKNOWN_CODE: Any = -1
INSTANCE = "app.gazette.dev/instance"
MANAGED_BY = "app.gazette.dev/managed-by"


def fails(fn: object, arg: object, pattern: str) -> None:
    """`fn(arg)` raises a ValidationError whose full text matches `pattern`."""
    with pytest.raises(ValidationError) as info:
        fn(arg)  # type: ignore[operator]
    assert re.fullmatch(pattern, str(info.value)), str(info.value)


def ok(fn: object, arg: object) -> None:
    fn(arg)  # type: ignore[operator]


def bad_header() -> pb.Header:
    member = pb.ProcessSpec.ID(zone="zone", suffix="name")
    return pb.Header(
        process_id=member,
        route=pb.Route(primary=0, members=[member]),
        # cluster_id is invalid, but easily fixed up.
        etcd=pb.Header.Etcd(cluster_id=0, member_id=34, revision=56, raft_term=78),
    )


# --- shard IDs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shard_id", "error"),
    [
        ("a-valid-shard", None),
        ("/good/shard/id", None),
        ("échantillon-7", None),
        ("not-$%|-a-token", r"not a valid token \(not-\$%\|-a-token\)"),
        ("bad id", r"not a valid token \(bad id\)"),
        ("a;b-c", r"not a valid token \(a;b-c\)"),
        ("", r"invalid length \(0; expected 4 <= length <= 512\)"),
        ("zz", r"invalid length \(2; expected 4 <= length <= 512\)"),
        ("é-a", None),  # 4 bytes of UTF-8.
        ("x" * 513, r"invalid length \(513; expected 4 <= length <= 512\)"),
    ],
)
def test_shard_id(shard_id: str, error: str | None) -> None:
    if error is None:
        validate_shard_id(shard_id)
    else:
        fails(validate_shard_id, shard_id, error)


# --- shard specs --------------------------------------------------------------------


def test_shard_spec_cases() -> None:
    spec = cpb.ShardSpec(
        id="bad id",
        sources=[Source(journal="journal 2"), Source(journal="journal/1", min_offset=-1)],
        recovery_log_prefix="bad prefix",
        hint_prefix="not empty",
        hint_backups=-1,
        min_txn_duration=Duration(nanos=-1),
        labels=pb.LabelSet(labels=[pb.Label(name="bad label", value="value")]),
    )
    v = validate_shard_spec
    fails(v, spec, r"Id: not a valid token \(bad id\)")
    spec.id = "a-shard-id"
    fails(v, spec, r"RecoveryLogPrefix: not a valid token \(bad prefix/a-shard-id\)")
    spec.recovery_log_prefix = ""
    fails(v, spec, r"invalid non-empty HintPrefix with empty RecoveryLogPrefix \(not empty\)")
    spec.hint_prefix, spec.recovery_log_prefix = "", "recovery/logs"
    fails(v, spec, r"HintPrefix is not an absolute, clean, non-directory path \(\)")
    for bad in ("relative/path", "/rooted/dir/", "/rooted//path", "/a/./b", "/a/../b"):
        spec.hint_prefix = bad
        fails(v, spec, rf"HintPrefix is not an absolute, clean, non-directory path \({bad}\)")
    spec.hint_prefix = "/rooted/path"
    fails(v, spec, r"invalid HintBackups \(-1; expected >= 0\)")
    spec.hint_backups = 2
    fails(v, spec, r"invalid MinTxnDuration \(-1; expected >= 0\)")
    spec.min_txn_duration.nanos = 0
    fails(v, spec, r"invalid MaxTxnDuration \(0; expected > 0\)")
    spec.max_txn_duration.seconds = -2
    fails(v, spec, r"invalid MaxTxnDuration \(-2000000000; expected > 0\)")
    spec.max_txn_duration.seconds = 0
    spec.max_txn_duration.nanos = 1
    fails(v, spec, r"LabelSet\.Labels\[0\]\.Name: not a valid token \(bad label\)")
    spec.labels.CopyFrom(label_set([(INSTANCE, "a"), (INSTANCE, "b")]))
    fails(
        v,
        spec,
        r"LabelSet: expected single-value Label has multiple values "
        rf"\(index 1; label {INSTANCE} value b\)",
    )
    spec.labels.CopyFrom(pb.LabelSet(labels=[pb.Label(name="aa", value="v", prefix=True)]))
    fails(v, spec, r"LabelSet\.Labels\[0\]: Prefix may not be set outside of a LabelSelector")
    spec.labels.CopyFrom(label_set({"id": "an-id"}))
    fails(v, spec, r'Labels cannot include label "id"')
    spec.labels.CopyFrom(label_set({"id": ""}))  # Rejected even if empty.
    fails(v, spec, r'Labels cannot include label "id"')
    spec.labels.CopyFrom(label_set({INSTANCE: "an-instance", MANAGED_BY: "a-tool"}))

    fails(v, spec, r"Sources\[0\]\.Journal: not a valid token \(journal 2\)")
    spec.sources[0].journal = "journal/2"
    fails(v, spec, r"Sources\[1\]: invalid MinOffset \(-1; expected > 0\)")
    spec.sources[1].min_offset = 1024
    fails(
        v,
        spec,
        r"Sources\.Journal not in unique, sorted order \(index 1; journal/1 <= journal/2\)",
    )
    spec.sources[0].journal, spec.sources[1].journal = "journal/1", "journal/2"
    validate_shard_spec(spec)

    # Duplicate source journals are refused as unsorted.
    spec.sources[1].journal = "journal/1"
    fails(v, spec, r"Sources\.Journal not in unique, sorted order \(index 1; .*\)")
    spec.sources[1].journal = "journal/2;some/meta"  # A metadata segment is allowed.
    validate_shard_spec(spec)
    spec.sources[1].journal = "journal/2;"
    fails(v, spec, r"Sources\[1\]\.Journal\.metadata path segment: invalid length \(0; .*\)")


def valid_spec() -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id="shard-000",
        sources=[Source(journal="a/journal"), Source(journal="b/journal", min_offset=10)],
        recovery_log_prefix="recovery/logs",
        hint_prefix="/hints",
        hint_backups=2,
        max_txn_duration=Duration(seconds=1),
        hot_standbys=1,
        labels=label_set({MANAGED_BY: "tool", "region": "eu"}),
    )


def test_shard_spec_recovery_log_must_be_a_journal() -> None:
    spec = valid_spec()
    validate_shard_spec(spec)
    # The ID is a valid token, but "<prefix>/<id>" is not a clean journal path.
    for shard_id, error in [
        ("shard/", r"must be a clean path \(recovery/logs/shard/\)"),
        ("a//b", r"must be a clean path \(recovery/logs/a//b\)"),
        ("x/../y", r"must be a clean path \(recovery/logs/x/\.\./y\)"),
    ]:
        spec.id = shard_id
        fails(validate_shard_spec, spec, "RecoveryLogPrefix: " + error)
        # Without a recovery log, the same ID is fine.
        bare = cpb.ShardSpec()
        bare.CopyFrom(spec)
        bare.recovery_log_prefix = bare.hint_prefix = ""
        validate_shard_spec(bare)
    spec.id, spec.recovery_log_prefix = "shard-000", "/abs"
    fails(validate_shard_spec, spec, r"RecoveryLogPrefix: cannot begin with '/' \(/abs/shard-000\)")


def test_shard_spec_valid_variants() -> None:
    spec = valid_spec()
    validate_shard_spec(spec)
    spec.hint_prefix = "/"  # Go's path.Clean("/") == "/": accepted, as by Gazette.
    validate_shard_spec(spec)
    minimal = cpb.ShardSpec(id="abcd", max_txn_duration=Duration(nanos=1))
    validate_shard_spec(minimal)  # No sources, no recovery log, no labels.


def test_shard_spec_helpers() -> None:
    spec = cpb.ShardSpec(
        id="shard-id",
        hot_standbys=4,
        labels=label_set({"hello": "world"}),
        hint_prefix="/a/path",
        hint_backups=2,
    )
    assert desired_replication(spec) == 5
    assert desired_replication(spec, max_hot_standbys=2) == 3
    spec.disable = True
    assert desired_replication(spec) == 0
    spec.disable, spec.hot_standbys = False, 0
    assert desired_replication(spec) == 1

    assert shard_label_set_ext(spec) == label_set({"id": "shard-id", "hello": "world"})
    assert hint_primary_key(spec) == "/a/path/shard-id.primary"
    assert hint_backup_keys(spec) == ["/a/path/shard-id.backup.0", "/a/path/shard-id.backup.1"]
    spec.hint_backups = 0
    assert hint_backup_keys(spec) == []

    assert recovery_log(spec) == ""
    spec.recovery_log_prefix = "recovery/logs"
    assert recovery_log(spec) == "recovery/logs/shard-id"


# --- consumer specs and replica statuses ---------------------------------------------


def test_consumer_spec_cases() -> None:
    spec = cpb.ConsumerSpec(
        process_spec=pb.ProcessSpec(
            id=pb.ProcessSpec.ID(zone="not valid", suffix="name"), endpoint="http://foo"
        ),
        shard_limit=5,
    )
    fails(validate_consumer_spec, spec, r"Id\.Zone: not a valid token \(not valid\)")
    spec.process_spec.id.zone = "zone"
    spec.process_spec.endpoint = "foo"
    fails(validate_consumer_spec, spec, r"Endpoint: not absolute: foo")
    spec.process_spec.endpoint = "http://foo:8080"
    validate_consumer_spec(spec)


def test_replica_status_cases() -> None:
    status = cpb.ReplicaStatus(code=UNKNOWN_CODE)
    fails(validate_replica_status, status, r"Code: invalid code \(-1\)")
    status.code = cpb.ReplicaStatus.STANDBY
    validate_replica_status(status)
    status.errors.append("error!")
    fails(validate_replica_status, status, r"expected Code FAILED with non-empty Errors")
    del status.errors[:]
    status.code = cpb.ReplicaStatus.FAILED
    fails(validate_replica_status, status, r"expected non-empty Errors with Code FAILED")
    status.errors.append("error!")
    validate_replica_status(status)


def test_replica_status_reduction() -> None:
    status = cpb.ReplicaStatus(code=cpb.ReplicaStatus.IDLE)
    reduce_replica_status(status, cpb.ReplicaStatus(code=cpb.ReplicaStatus.STANDBY))
    assert status == cpb.ReplicaStatus(code=cpb.ReplicaStatus.STANDBY)
    reduce_replica_status(status, cpb.ReplicaStatus(code=cpb.ReplicaStatus.BACKFILL))
    assert status == cpb.ReplicaStatus(code=cpb.ReplicaStatus.STANDBY)
    reduce_replica_status(status, cpb.ReplicaStatus(code=cpb.ReplicaStatus.FAILED, errors=["e1"]))
    reduce_replica_status(status, cpb.ReplicaStatus(code=cpb.ReplicaStatus.FAILED, errors=["e2"]))
    assert status == cpb.ReplicaStatus(code=cpb.ReplicaStatus.FAILED, errors=["e1", "e2"])


# --- checkpoints and hints -----------------------------------------------------------


def test_checkpoint_cases() -> None:
    cp = cpb.Checkpoint()
    validate_checkpoint(cp)  # Empty: a shard that has read nothing.
    src = cp.sources["a/journal"]
    src.read_through = -1
    entry = src.producers.add(id=b"\x01\x02\x03")
    entry.state.begin = -2
    cp.ack_intents["bad journal"] = b"ack"
    v = validate_checkpoint
    fails(v, cp, r"Sources\[a/journal\]: invalid ReadThrough \(-1; expected >= 0\)")
    src.read_through = 100
    fails(v, cp, r"Sources\[a/journal\]\.Producers\[0\]: invalid Id length \(3; expected 6\)")
    entry.id = b"\x01\x02\x03\x04\x05\x06"
    fails(v, cp, r"Sources\[a/journal\]\.Producers\[0\]: invalid State\.Begin \(-2; .*\)")
    entry.state.begin = -1
    src.producers.add(id=b"\x01\x02\x03\x04\x05\x06")
    fails(v, cp, r"Sources\[a/journal\]\.Producers\[1\]: duplicate producer Id \(010203040506\)")
    src.producers[1].id = b"\x06\x05\x04\x03\x02\x01"
    src.producers[1].state.begin = 50
    fails(v, cp, r"AckIntents\[bad journal\]: not a valid token \(bad journal\)")
    del cp.ack_intents["bad journal"]
    cp.ack_intents["a/journal"] = b"ack"
    cp.sources["b/journal;meta"].read_through = 7  # Keys may carry a metadata segment.
    validate_checkpoint(cp)
    assert flatten_read_through(cp) == {"a/journal": 100, "b/journal;meta": 7}
    cp.sources["zz"].read_through = 1
    fails(v, cp, r"Sources\[zz\]\.Journal: invalid length \(2; .*\)")


def test_fsm_hints_cases() -> None:
    hints = rpb.FSMHints(
        log="recovery/log",
        live_nodes=[
            rpb.FnodeSegments(
                fnode=1,
                segments=[rpb.Segment(author=0, first_seq_no=1, last_seq_no=3, last_offset=10)],
            )
        ],
    )
    seg = hints.live_nodes[0].segments[0]
    v = validate_fsm_hints
    fails(v, hints, r"Segment: Author is zero")
    seg.author = 0xFEEDBEEF
    validate_fsm_hints(hints)  # The empty segment log is the hints' log.
    seg.first_seq_no = 0
    fails(v, hints, r"Segment: FirstSeqNo <= 0")
    seg.first_seq_no, seg.first_offset = 1, -1
    fails(v, hints, r"Segment: FirstOffset < 0")
    seg.first_offset, seg.last_seq_no = 10, 0
    fails(v, hints, r"Segment: LastSeqNo < segment\.FirstSeqNo")
    seg.last_seq_no = 3
    fails(v, hints, r"Segment: LastOffset <= segment\.FirstOffset")
    seg.last_offset = 0  # Zero: unbounded.
    validate_fsm_hints(hints)
    seg.log = "recovery/log"
    fails(v, hints, r"contained segment\.Log duplicates FSMHints\.Log")
    seg.log = "older/log"
    validate_fsm_hints(hints)
    seg.log = "bad log"
    fails(v, hints, r"Segment\.Log: not a valid token \(bad log\)")
    seg.log, hints.log = "", ""
    fails(v, hints, r"Segment\.Log: invalid length \(0; .*\)")
    validate_fsm_hints(rpb.FSMHints())


# --- Shard RPCs ----------------------------------------------------------------------


def test_stat_request_cases() -> None:
    req = cpb.StatRequest(header=bad_header(), shard="invalid shard")
    req.read_through["a/journal"] = -123
    fails(validate_stat_request, req, r"Header\.Etcd: invalid ClusterId .*")
    req.header.etcd.cluster_id = 1234
    fails(validate_stat_request, req, r"Shard: not a valid token \(invalid shard\)")
    req.shard = "valid-shard"
    fails(
        validate_stat_request,
        req,
        r"ReadThrough\.Offsets\[a/journal\]: invalid offset \(-123; expected >= 0\)",
    )
    req.read_through["a/journal"] = 123
    validate_stat_request(req)
    req.ClearField("header")  # The header is optional.
    validate_stat_request(req)


def test_stat_response_cases() -> None:
    resp = cpb.StatResponse(status=UNKNOWN_STATUS, header=bad_header())
    resp.read_through["a/journal"] = -123
    resp.publish_at["other/journal"] = -456
    v = validate_stat_response
    fails(v, resp, r"Status: invalid status \(9101\)")
    resp.status = cpb.OK
    fails(v, resp, r"Header\.Etcd: invalid ClusterId .*")
    resp.header.etcd.cluster_id = 1234
    fails(v, resp, r"ReadThrough\.Offsets\[a/journal\]: invalid offset \(-123; expected >= 0\)")
    resp.read_through["a/journal"] = 123
    fails(v, resp, r"PublishAt\.Offsets\[other/journal\]: invalid offset \(-456; .*\)")
    resp.publish_at["other/journal"] = 456
    validate_stat_response(resp)


def test_list_request_cases() -> None:
    req = cpb.ListRequest(
        selector=pb.LabelSelector(
            include=pb.LabelSet(labels=[pb.Label(name="a invalid name", value="foo")]),
            exclude=label_set({"id": "bar"}),  # Selecting on "id" is fine.
        )
    )
    fails(
        validate_shard_list_request,
        req,
        r"Selector\.Include\.Labels\[0\]\.Name: not a valid token \(a invalid name\)",
    )
    req.selector.include.labels[0].name = "a-valid-name"
    validate_shard_list_request(req)


def test_list_response_cases() -> None:
    resp = cpb.ListResponse(
        status=UNKNOWN_STATUS,
        header=bad_header(),
        shards=[
            cpb.ListResponse.Shard(
                mod_revision=0,
                spec=cpb.ShardSpec(
                    id="a invalid id",
                    sources=[Source(journal="a/journal")],
                    recovery_log_prefix="a/log/prefix",
                    hint_prefix="/a/hint/prefix",
                    max_txn_duration=Duration(nanos=1),
                ),
                route=pb.Route(primary=0),
            )
        ],
    )
    v = validate_shard_list_response
    fails(v, resp, r"Status: invalid status \(9101\)")
    resp.status = cpb.OK
    fails(v, resp, r"Header\.Etcd: invalid ClusterId .*")
    resp.header.etcd.cluster_id = 1234
    fails(v, resp, r"Shards\[0\]\.Spec\.Id: not a valid token \(.*\)")
    shard = resp.shards[0]
    shard.spec.id = "a-valid-id"
    fails(v, resp, r"Shards\[0\]: invalid ModRevision \(0; expected > 0\)")
    shard.mod_revision = 1
    fails(v, resp, r"Shards\[0\]\.Route: invalid Primary .*")
    shard.route.members.add(zone="zone", suffix="suffix")
    fails(v, resp, r"Shards\[0\]: length of Route\.Members and Status are not equal \(1 vs 0\)")
    shard.status.add(code=cpb.ReplicaStatus.FAILED)
    fails(v, resp, r"Shards\[0\]\.Status\[0\]: expected non-empty Errors with Code FAILED")
    shard.status[0].code = cpb.ReplicaStatus.STANDBY
    validate_shard_list_response(resp)


def test_apply_request_cases() -> None:
    hints = rpb.FSMHints(
        log="valid",
        live_nodes=[
            rpb.FnodeSegments(
                fnode=32, segments=[rpb.Segment(author=0, first_seq_no=1, last_seq_no=2)]
            )
        ],
    )
    req = cpb.ApplyRequest(
        changes=[
            cpb.ApplyRequest.Change(
                expect_mod_revision=-2,
                upsert=cpb.ShardSpec(
                    id="invalid id",
                    sources=[Source(journal="a/journal")],
                    recovery_log_prefix="a/log/prefix",
                    hint_prefix="/a/hint/prefix",
                    max_txn_duration=Duration(nanos=1),
                ),
                delete="another-id",
                primary_hints=hints,
            ),
            cpb.ApplyRequest.Change(
                expect_mod_revision=0,
                delete="another invalid id",
                primary_hints=rpb.FSMHints(log="invalid"),
            ),
            cpb.ApplyRequest.Change(expect_mod_revision=1),
        ]
    )
    v = validate_shard_apply_request
    c0, c1, c2 = req.changes
    fails(v, req, r"Changes\[0\]: both Upsert and Delete are set \(expected exactly one\)")
    c0.delete = ""
    fails(v, req, r"Changes\[0\]\.Upsert\.Id: not a valid token \(invalid id\)")
    c0.upsert.id = "a-valid-id"
    fails(v, req, r"Changes\[0\]: invalid ExpectModRevision \(-2; expected >= 0 or -1\)")
    c0.expect_mod_revision = 0
    fails(v, req, r"Changes\[0\]\.PrimaryHints\.Segment: Author is zero")
    c0.primary_hints.live_nodes[0].segments[0].author = 1
    fails(v, req, r"Changes\[1\]\.Delete: not a valid token \(another invalid id\)")
    c1.delete = "other-valid-id"
    fails(v, req, r"Changes\[1\]: invalid ExpectModRevision \(0; expected > 0 or -1\)")
    c1.expect_mod_revision = 1
    fails(v, req, r"Changes\[1\]: hints may be set only with an upsert, not a delete")
    c1.ClearField("primary_hints")
    fails(v, req, r"Changes\[2\]: neither Upsert nor Delete are set \(expected exactly one\)")
    c2.delete = "yet-another-valid-id"
    validate_shard_apply_request(req)
    c2.expect_mod_revision = -1  # Any revision.
    validate_shard_apply_request(req)


@pytest.mark.parametrize(
    ("field", "seconds", "nanos", "expect"),
    [
        # Go time.Durations on Gazette's side: one it can't convert fails the decode of the
        # whole message (a stored spec is dropped by Gazette consumers, gazctl's List fails).
        ("max_txn_duration", 0, 1_500_000_000, "nanos out of range"),
        ("max_txn_duration", 2, -1, "seconds and nanos have different signs"),
        ("min_txn_duration", 10**10, 0, "out of range for a Go time.Duration"),
        ("max_txn_duration", 9223372036, 854775807, ""),
    ],
)
def test_apply_request_durations_gazette_can_decode(
    field: str, seconds: int, nanos: int, expect: str
) -> None:
    spec = valid_spec()
    getattr(spec, field).CopyFrom(Duration(seconds=seconds, nanos=nanos))
    req = cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=-1)])
    if not expect:
        validate_shard_apply_request(req)
        return
    name = "".join(part.capitalize() for part in field.split("_"))
    fails(validate_shard_apply_request, req, rf"Changes\[0\]\.Upsert\.{name}: .*{expect}.*")


def test_apply_response_cases() -> None:
    resp = cpb.ApplyResponse(status=UNKNOWN_STATUS, header=bad_header())
    fails(validate_shard_apply_response, resp, r"Status: invalid status \(9101\)")
    resp.status = cpb.OK
    fails(validate_shard_apply_response, resp, r"Header\.Etcd: invalid ClusterId .*")
    resp.header.etcd.cluster_id = 1234
    validate_shard_apply_response(resp)


def test_get_hints_cases() -> None:
    fails(
        validate_get_hints_request, cpb.GetHintsRequest(shard="a bad id"), r"Shard: not a valid .*"
    )
    validate_get_hints_request(cpb.GetHintsRequest(shard="a-shard"))

    bad = rpb.FSMHints(log="a/log", live_nodes=[rpb.FnodeSegments(segments=[rpb.Segment()])])
    resp = cpb.GetHintsResponse(status=UNKNOWN_STATUS)
    fails(validate_get_hints_response, resp, r"Status: invalid status \(9101\)")
    resp.status = cpb.OK
    validate_get_hints_response(resp)  # No hints at all: fine (no header check either).
    resp.primary_hints.hints.CopyFrom(bad)
    fails(validate_get_hints_response, resp, r"primary hints\.Segment: Author is zero")
    resp.primary_hints.ClearField("hints")
    resp.backup_hints.add()  # An empty backup slot.
    resp.backup_hints.add().hints.CopyFrom(bad)
    fails(validate_get_hints_response, resp, r"backup hints\.Segment: Author is zero")
    resp.backup_hints[1].hints.live_nodes[0].segments[0].CopyFrom(
        rpb.Segment(author=1, first_seq_no=1, last_seq_no=1)
    )
    validate_get_hints_response(resp)


def test_unassign_cases() -> None:
    req = cpb.UnassignRequest(shards=["/good/shard/id", ""])
    fails(validate_unassign_request, req, r"Shards\[1\]: invalid length .*")
    req.shards[1] = "/another/valid/shard/id"
    validate_unassign_request(req)

    resp = cpb.UnassignResponse(status=UNKNOWN_STATUS)
    fails(validate_unassign_response, resp, r"Status: invalid status \(9101\)")
    resp.status = cpb.ETCD_TRANSACTION_FAILED
    fails(validate_unassign_response, resp, r"bad status: ETCD_TRANSACTION_FAILED")
    resp.status = cpb.OK
    validate_unassign_response(resp)


# --- spec algebra --------------------------------------------------------------------


def model_spec() -> cpb.ShardSpec:
    return cpb.ShardSpec(
        sources=[Source(journal="a/source", min_offset=1234)],
        recovery_log_prefix="log/prefix",
        hint_prefix="/hints/prefix",
        hint_backups=3,
        max_txn_duration=Duration(seconds=5),
        min_txn_duration=Duration(seconds=1),
        disable=True,
        hot_standbys=2,
        labels=label_set({"aaa": "val", "bbb": "val", "ccc": "val"}),
        disable_wait_for_ack=True,
        ring_buffer_size=123,
        read_channel_size=456,
    )


def other_spec() -> cpb.ShardSpec:
    return cpb.ShardSpec(
        sources=[Source(journal="other/source", min_offset=5678)],
        recovery_log_prefix="other/log/prefix",
        hint_prefix="/hints/other/prefix",
        hint_backups=2,
        max_txn_duration=Duration(seconds=3600),
        min_txn_duration=Duration(seconds=60),
        disable=False,
        hot_standbys=1,
        labels=label_set({"aaa": "other", "bbb": "other", "ccc": "other"}),
        disable_wait_for_ack=False,
        ring_buffer_size=456,
        read_channel_size=789,
    )


def test_set_operations() -> None:
    """Gazette's TestSetOperations."""
    model, other, zero = model_spec(), other_spec(), cpb.ShardSpec()
    assert union_shard_specs(zero, model) == model
    assert union_shard_specs(model, zero) == model

    other.disable = True  # Disable == true dominates in a union.
    other.disable_wait_for_ack = True
    assert union_shard_specs(other, model) == other
    other.disable = other.disable_wait_for_ack = False
    assert union_shard_specs(model, other) == model

    assert intersect_shard_specs(model, model) == model
    assert intersect_shard_specs(model, zero) == zero
    assert intersect_shard_specs(zero, model) == zero
    assert intersect_shard_specs(other, model) == zero
    assert intersect_shard_specs(model, other) == zero

    assert subtract_shard_specs(model, model) == zero
    assert subtract_shard_specs(model, zero) == model
    assert subtract_shard_specs(zero, model) == zero
    assert subtract_shard_specs(other, model) == other
    assert subtract_shard_specs(model, other) == model


def test_set_operations_details() -> None:
    a, b = model_spec(), model_spec()
    a.id, b.id = "shard-a", "shard-b"
    b.labels.CopyFrom(label_set({"aaa": "val", "bbb": "x", "ddd": "new"}))
    b.max_txn_duration.CopyFrom(Duration(seconds=4, nanos=1_000_000_000))  # Same, other form.
    # The result keeps a's id; labels work per name.
    inter = intersect_shard_specs(a, b)
    assert inter.id == "shard-a"
    assert inter.labels == label_set({"aaa": "val"})
    assert inter.max_txn_duration.ToNanoseconds() == 5_000_000_000
    sub = subtract_shard_specs(a, b)
    assert sub.labels == label_set({"bbb": "val", "ccc": "val"})
    assert not sub.HasField("max_txn_duration")
    uni = union_shard_specs(a, b)
    assert uni.labels == label_set({"aaa": "val", "bbb": "val", "ccc": "val", "ddd": "new"})
    # Sources are compared (and taken) as a whole list.
    b.sources.add(journal="b/source")
    assert len(intersect_shard_specs(a, b).sources) == 0
    assert list(subtract_shard_specs(a, b).sources) == list(a.sources)
    # Inputs are not modified.
    assert a.id == "shard-a" and len(a.sources) == 1
    assert a.labels == label_set({"aaa": "val", "bbb": "val", "ccc": "val"})


# --- properties ----------------------------------------------------------------------

letters_digits = st.characters(categories=("L", "N"))
token_char = st.one_of(letters_digits, st.sampled_from(TOKEN_SYMBOLS))


def _byte_len(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


shard_ids = st.text(token_char, min_size=1, max_size=40).filter(
    lambda s: MIN_SHARD_ID_LEN <= _byte_len(s) <= MAX_SHARD_ID_LEN
)


@settings(max_examples=300)
@given(shard_ids)
def test_valid_shard_ids_accepted(shard_id: str) -> None:
    validate_shard_id(shard_id)
    # And a spec without a recovery log accepts it as its id.
    validate_shard_spec(cpb.ShardSpec(id=shard_id, max_txn_duration=Duration(seconds=1)))


@settings(max_examples=300)
@given(st.text(max_size=20))
def test_shard_id_rule(text: str) -> None:
    """A string is accepted exactly when it is 4..512 bytes of token characters."""
    valid = MIN_SHARD_ID_LEN <= _byte_len(text) <= MAX_SHARD_ID_LEN and all(
        c in TOKEN_SYMBOLS or unicodedata.category(c)[0] in "LN" for c in text
    )
    if valid:
        validate_shard_id(text)
    else:
        with pytest.raises(ValidationError):
            validate_shard_id(text)


@settings(max_examples=200)
@given(shard_ids, st.sampled_from(list(" ;#$*!\n\x00~")), st.integers(0, 40))
def test_shard_id_with_bad_char_rejected(shard_id: str, bad: str, at: int) -> None:
    broken = shard_id[:at] + bad + shard_id[at:]
    assume(_byte_len(broken) <= MAX_SHARD_ID_LEN)
    with pytest.raises(ValidationError, match="not a valid token"):
        validate_shard_id(broken)


label_names = st.sampled_from(["aa", "bb", "cc", "dd"])
label_vals = st.sampled_from(["", "x", "y"])


@st.composite
def specs(draw: st.DrawFn) -> cpb.ShardSpec:
    """Specs over small domains, so that two draws often share field values."""
    spec = cpb.ShardSpec(id="shard-id")
    journals = draw(st.lists(st.sampled_from(["a/one", "a/two"]), unique=True, max_size=2))
    for journal in sorted(journals):
        spec.sources.add(journal=journal, min_offset=draw(st.sampled_from([0, 5])))
    spec.recovery_log_prefix = draw(st.sampled_from(["", "logs", "other"]))
    spec.hint_prefix = draw(st.sampled_from(["", "/h"]))
    spec.hint_backups = draw(st.sampled_from([0, 1, 2]))
    for name in ("max_txn_duration", "min_txn_duration"):
        nanos = draw(st.sampled_from([0, 1_000_000_000, 5]))
        if nanos:
            getattr(spec, name).FromNanoseconds(nanos)
    spec.disable = draw(st.booleans())
    spec.hot_standbys = draw(st.sampled_from([0, 1, 3]))
    pairs: list[tuple[str, str]] = []
    for name in draw(st.lists(label_names, unique=True, max_size=3)):
        values = draw(st.lists(label_vals, unique=True, min_size=1, max_size=2))
        if "" in values:
            values = [""]  # A name has either the empty value or non-empty ones.
        pairs += [(name, v) for v in values]
    if pairs:
        spec.labels.CopyFrom(label_set(pairs))
    spec.disable_wait_for_ack = draw(st.booleans())
    spec.ring_buffer_size = draw(st.sampled_from([0, 7]))
    spec.read_channel_size = draw(st.sampled_from([0, 9]))
    return spec


@settings(max_examples=300)
@given(specs(), specs())
def test_spec_algebra_laws(a: cpb.ShardSpec, b: cpb.ShardSpec) -> None:
    zero = cpb.ShardSpec(id=a.id)
    # Idempotence, identities.
    assert union_shard_specs(a, a) == a
    assert intersect_shard_specs(a, a) == a
    assert subtract_shard_specs(a, a) == zero
    assert union_shard_specs(a, zero) == a
    assert subtract_shard_specs(a, zero) == a
    # Intersection is symmetric (the result's id is the left operand's).
    assert intersect_shard_specs(a, b) == intersect_shard_specs(b, a)
    # What a shares with b, plus what it does not, rebuilds a: the decomposition
    # gazctl's shardspace uses to hoist common fields to a parent.
    common = intersect_shard_specs(a, b)
    rest = subtract_shard_specs(a, b)
    assert union_shard_specs(rest, common) == a
    assert union_shard_specs(common, rest) == a
    # Nothing of the common part survives subtraction of it from the rest.
    assert subtract_shard_specs(common, rest) == common
    # Union keeps every non-zero field of its left operand.
    assert subtract_shard_specs(a, union_shard_specs(a, b)) == zero


@settings(max_examples=200)
@given(specs())
def test_generated_specs_validate_or_explain(spec: cpb.ShardSpec) -> None:
    """Validation never crashes, and its verdict follows the documented rules."""
    try:
        validate_shard_spec(spec)
    except ValidationError as err:
        assert str(err)
        no_max = spec.max_txn_duration.ToNanoseconds() <= 0
        hint_mismatch = bool(spec.recovery_log_prefix) != bool(spec.hint_prefix)
        assert no_max or hint_mismatch
    else:
        assert spec.max_txn_duration.ToNanoseconds() > 0
        assert bool(spec.recovery_log_prefix) == bool(spec.hint_prefix)
