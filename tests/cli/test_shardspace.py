"""The shardspace YAML: Gazette's `consumer/shardspace` document, read, checked and written
back byte for byte as gazctl writes it."""

from __future__ import annotations

import pytest
from google.protobuf import duration_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pygazette.cli.shardspace import (
    ShardEntry,
    ShardSet,
    apply_request,
    dump_shardspace,
    flatten,
    from_list,
    parse_shardspace,
)
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.shard_validation import validate_shard_spec

# Gazette's own fixture (consumer/shardspace/shardspace_test.go, TestYAMLRoundTrip): the
# YAML that gazctl writes for it, exactly.
GAZETTE_FIXTURE = """\
common:
  recovery_log_prefix: recovery/logs
  hint_prefix: /hints
  hint_backups: 2
  max_txn_duration: 1s
  min_txn_duration: 1ms
  hot_standbys: 1
  labels:
  - name: name-1
    value: val-1
  disable_wait_for_ack: true
shards:
- comment: This is a comment
  delete: true
  id: shard-A
  sources:
  - journal: journal/A
  labels:
  - name: name-2
    value: val-2
  revision: 123
- id: shard-B
  sources:
  - journal: journal/B
  disable: true
  labels:
  - name: name-3
    value: val-3
  revision: 456
"""


def full_spec(shard_id: str, journal: str, **fields: object) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(
        id=shard_id,
        sources=[cpb.ShardSpec.Source(journal=journal)],
        recovery_log_prefix="recovery/logs",
        hint_prefix="/hints",
        hint_backups=2,
        hot_standbys=1,
        disable_wait_for_ack=True,
    )
    spec.max_txn_duration.seconds = 1
    spec.min_txn_duration.nanos = 1_000_000
    for name, value in fields.items():
        if name == "labels":
            assert isinstance(value, pb.LabelSet)
            spec.labels.CopyFrom(value)
        else:
            setattr(spec, name, value)
    return spec


def flat_fixture() -> list[ShardEntry]:
    """Gazette's buildFlatFixture."""
    return [
        ShardEntry(
            spec=full_spec(
                "shard-A", "journal/A", labels=label_set([("name-1", "val-1"), ("name-2", "val-2")])
            ),
            comment="This is a comment",
            delete=True,
            revision=123,
        ),
        ShardEntry(
            spec=full_spec(
                "shard-B",
                "journal/B",
                disable=True,
                labels=label_set([("name-1", "val-1"), ("name-3", "val-3")]),
            ),
            revision=456,
        ),
    ]


def listed(entries: list[ShardEntry]) -> list[cpb.ListResponse.Shard]:
    return [cpb.ListResponse.Shard(spec=e.spec, mod_revision=e.revision) for e in entries]


# Gazette's fixture -----------------------------------------------------------------------


def test_gazette_fixture_round_trips_byte_for_byte() -> None:
    shard_set = parse_shardspace(GAZETTE_FIXTURE)
    assert dump_shardspace(shard_set) == GAZETTE_FIXTURE


def test_gazette_fixture_pushes_down_to_the_flat_fixture_and_hoists_back() -> None:
    shard_set = parse_shardspace(GAZETTE_FIXTURE)
    assert flatten(shard_set) == flat_fixture()
    # Flattening works on a copy.
    assert dump_shardspace(shard_set) == GAZETTE_FIXTURE

    # Hoisting the flat shards recovers the fixture's common spec and per-shard differences.
    hoisted = ShardSet(shards=flat_fixture())
    hoisted.hoist()
    assert dump_shardspace(hoisted) == GAZETTE_FIXTURE


def test_listing_hoists_what_every_shard_shares() -> None:
    flat = flat_fixture()
    for entry in flat:  # A listing has no comments or deletions.
        entry.comment, entry.delete = "", None
    text = dump_shardspace(from_list(reversed(listed(flat))))
    assert text == (
        GAZETTE_FIXTURE.replace("- comment: This is a comment\n  delete: true\n  id:", "- id:")
    )
    assert flatten(parse_shardspace(text)) == flat


def test_listing_of_one_shard_hoists_all_but_its_id() -> None:
    spec = full_spec("shard-A", "journal/A")
    text = dump_shardspace(from_list([cpb.ListResponse.Shard(spec=spec, mod_revision=7)]))
    assert text.endswith("shards:\n- id: shard-A\n  revision: 7\n")
    assert "  sources:\n  - journal: journal/A\n" in text
    assert flatten(parse_shardspace(text)) == [ShardEntry(spec=spec, revision=7)]


def test_a_listing_quotes_strings_as_gazctl_does() -> None:
    """gazctl's YAML (yaml.v2) double-quotes a string that would read as something else;
    PyYAML single-quoted these ('1', 'true', '2024-01-01') or left some plain (1e3, Y, 0o17,
    which yaml.v2 reads as numbers and booleans). The expected text is gazctl v0.103.0's
    `shards list -o yaml` of such shards."""
    values = ["", "1", "true", "Y", "n", "1e3", "0o17", "09", ".5", "2024-01-01", "-", "x1"]
    shards = [
        cpb.ListResponse.Shard(
            spec=cpb.ShardSpec(
                id=f"shard-{i:02d}",
                max_txn_duration=duration_pb2.Duration(seconds=1),
                labels=label_set([("tier", v)]),
            ),
            mod_revision=3,
        )
        for i, v in enumerate(values)
    ]
    text = dump_shardspace(from_list(shards))
    written = [line.split("value: ", 1)[1] for line in text.splitlines() if "value: " in line]
    assert written == [
        '""',
        '"1"',
        '"true"',
        '"Y"',
        '"n"',
        '"1e3"',
        '"0o17"',
        '"09"',
        '".5"',
        '"2024-01-01"',
        "'-'",
        "x1",
    ]
    # And each reads back as written, as do the ones PyYAML would misread (0x_: an int).
    assert [e.spec for e in flatten(parse_shardspace(text))] == [s.spec for s in shards]
    odd = text.replace('"2024-01-01"', "0x_")
    assert flatten(parse_shardspace(odd))[9].spec.labels.labels[0].value == "0x_"


def test_empty_listing() -> None:
    text = dump_shardspace(from_list([]))
    assert text == "common: {}\nshards: []\n"
    assert parse_shardspace(text) == ShardSet()


def test_every_field_by_its_gazette_name() -> None:
    text = """
common:
  max_txn_duration: 1m30s
  min_txn_duration: 100ms
  ring_buffer_size: 4096
  read_channel_size: 512
  hint_backups: 3
shards:
- id: counter-0
  sources:
  - journal: events/a
    min_offset: 1024
  - journal: events/b
  recovery_log_prefix: recovery
  hint_prefix: /counter/hints
  hot_standbys: 2
  disable: true
  disable_wait_for_ack: true
  labels:
  - name: app
    value: counter
  - name: flag
    value: ""
  revision: -1
"""
    [entry] = flatten(parse_shardspace(text))
    spec = entry.spec
    assert entry.revision == -1
    assert [(s.journal, s.min_offset) for s in spec.sources] == [
        ("events/a", 1024),
        ("events/b", 0),
    ]
    assert (spec.max_txn_duration.seconds, spec.max_txn_duration.nanos) == (90, 0)
    assert (spec.min_txn_duration.seconds, spec.min_txn_duration.nanos) == (0, 100_000_000)
    assert (spec.ring_buffer_size, spec.read_channel_size) == (4096, 512)
    assert (spec.hint_backups, spec.hot_standbys) == (3, 2)
    assert (spec.recovery_log_prefix, spec.hint_prefix) == ("recovery", "/counter/hints")
    assert spec.disable and spec.disable_wait_for_ack
    assert [(lb.name, lb.value) for lb in spec.labels.labels] == [("app", "counter"), ("flag", "")]
    validate_shard_spec(spec)


# ApplyRequest ----------------------------------------------------------------------------


def test_apply_request_guards_each_change_with_its_revision() -> None:
    text = """
common:
  max_txn_duration: 1s
  sources:
  - journal: events/a
shards:
- id: new-shard
- id: updated-shard
  revision: 12
- id: forced-shard
  revision: -1
- id: gone-shard
  delete: true
  revision: 40
- id: kept-shard
  delete: false
  revision: 41
"""
    request = apply_request(parse_shardspace(text))
    changes = {(c.upsert.id or c.delete): c for c in request.changes}
    assert [c.upsert.id or c.delete for c in request.changes] == [
        "new-shard",
        "updated-shard",
        "forced-shard",
        "gone-shard",
        "kept-shard",
    ]
    assert changes["new-shard"].expect_mod_revision == 0
    assert changes["updated-shard"].expect_mod_revision == 12
    assert changes["forced-shard"].expect_mod_revision == -1
    assert changes["gone-shard"].delete == "gone-shard"
    assert not changes["gone-shard"].HasField("upsert")
    assert changes["gone-shard"].expect_mod_revision == 40
    assert changes["kept-shard"].upsert.sources[0].journal == "events/a"
    assert changes["kept-shard"].upsert.max_txn_duration.seconds == 1


def test_a_delete_needs_a_revision() -> None:
    with pytest.raises(ValidationError, match=r"shard 'gone-shard': a delete needs .*revision"):
        apply_request(parse_shardspace("shards:\n- id: gone-shard\n  delete: true\n"))


def test_deleted_shards_need_no_complete_spec() -> None:
    request = apply_request(
        parse_shardspace("shards:\n- id: gone-shard\n  delete: true\n  revision: 3\n")
    )
    assert request.changes[0].delete == "gone-shard"


# Errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty shardspace"),
        ("- id: a\n", "expected a YAML mapping at the top, got list"),
        ("shards: [\n", r"invalid YAML: .*\(line \d+, column \d+\)"),
        ("shard:\n- id: abcd\n", "unknown top-level field 'shard'"),
        ("shards: {id: abcd}\n", "shards: expected a list of shards, got dict"),
        ("shards:\n- sources: []\n", r"shards\[0\]: every shard needs an id"),
        ("shards:\n- abcd\n", r"shards\[0\]: expected a mapping of shard fields, got str"),
        (
            "shards:\n- id: abcd\n  hot_standby: 1\n",
            "shard 'abcd': unknown shard field 'hot_standby'",
        ),
        ("shards:\n- id: abcd\n- id: abcd\n", "shard 'abcd': listed more than once"),
        ("shards:\n- id: abcd\n  id: efgh\n", "found duplicate key 'id'"),
        ("common:\n  id: abcd\n", "common: unknown common spec field 'id'"),
        ("common:\n  revision: 3\n", "common: unknown common spec field 'revision'"),
        ("common: [a]\n", "common: expected a mapping, got list"),
        (
            "shards:\n- id: abcd\n  max_txn_duration: 1 second\n",
            "shard 'abcd': max_txn_duration: invalid duration '1 second'",
        ),
        (
            "shards:\n- id: abcd\n  max_txn_duration: 1000\n",
            "shard 'abcd': max_txn_duration: expected a duration such as 1s",
        ),
        ("shards:\n- id: abcd\n  min_txn_duration: -1s\n", "min_txn_duration: negative duration"),
        ("shards:\n- id: abcd\n  hot_standbys: two\n", "hot_standbys: expected an integer"),
        # gazctl truncates 2.5 to 2; refused here (a whole number such as 2.0 is taken).
        ("shards:\n- id: abcd\n  hot_standbys: 2.5\n", "hot_standbys: expected an integer"),
        ("shards:\n- id: abcd\n  hot_standbys: .nan\n", "hot_standbys: expected an integer"),
        ("shards:\n- id: abcd\n  hot_standbys: -1\n", r"hot_standbys: -1 is out of range"),
        (
            "shards:\n- id: abcd\n  ring_buffer_size: 4294967296\n",
            "ring_buffer_size: .* out of range",
        ),
        ("shards:\n- id: abcd\n  disable: 1\n", "disable: expected true or false, got 1"),
        ("shards:\n- id: abcd\n  delete: yes please\n", "delete: expected true or false"),
        ("shards:\n- id: abcd\n  revision: -2\n", r"revision: -2 is out of range \[-1, "),
        ("shards:\n- id: abcd\n  sources: events/a\n", "sources: expected a list"),
        (
            "shards:\n- id: abcd\n  sources:\n  - min_offset: 3\n",
            r"sources\[0\]: a source needs a journal",
        ),
        (
            "shards:\n- id: abcd\n  sources:\n  - journal: a/b\n    max_offset: 3\n",
            "unknown source field 'max_offset'",
        ),
        (
            "shards:\n- id: abcd\n  sources:\n  - journal: a/b\n    min_offset: -3\n",
            r"sources\[0\].min_offset: -3 is out of range",
        ),
        ("shards:\n- id: abcd\n  labels: {app: x}\n", "labels: expected a list of {name, value}"),
        ("shards:\n- id: abcd\n  labels:\n  - value: x\n", "labels: every label needs a name"),
        ("shards:\n- id: abcd\n  labels:\n  - name: a\n    val: x\n", "unknown label field 'val'"),
    ],
)
def test_parse_errors_name_the_shard_and_field(text: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        parse_shardspace(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "written",
    ["true", "yes", "ON", "False", "no", "1.5", ".5", "1.50", "1.0e+3", ".inf", "2024-01-01"],
)
def test_a_string_written_as_a_boolean_float_or_date_is_its_text(written: str) -> None:
    """gazctl (YAML v2) reads a plain scalar into a string field as its text; PyYAML resolves
    these to bools, floats and dates, and the shardspace was refused ('labels.value: expected
    a string, got True')."""
    text = (
        "common:\n  max_txn_duration: 1s\n  disable: yes\n  sources:\n  - journal: aa/bb\n"
        f"shards:\n- id: {written}-x\n  labels:\n  - name: tier\n    value: {written}\n"
    )
    (change,) = apply_request(parse_shardspace(text)).changes
    assert [(lb.name, lb.value) for lb in change.upsert.labels.labels] == [("tier", written)]
    assert change.upsert.disable is True  # A boolean field still reads YAML's booleans.


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("hot_standbys: true", "hot_standbys: expected an integer, got True"),
        ("max_txn_duration: false", "max_txn_duration: expected a duration such as"),
        ("disable: 1.0", "disable: expected true or false, got 1.0"),
    ],
)
def test_a_boolean_or_float_in_another_kind_of_field_is_refused(field: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_shardspace(f"shards:\n- id: abcd\n  {field}\n")


@pytest.mark.parametrize(
    ("shard", "message"),
    [
        ("id: ab", r"shard 'ab': Id: invalid length \(2; expected 4 <= length <= 512\)"),
        (
            "id: abcd\n  recovery_log_prefix: logs",
            r"shard 'abcd': HintPrefix is not an absolute, clean, non-directory path",
        ),
        (
            "id: abcd\n  sources:\n  - journal: bb/b\n  - journal: aa/a",
            r"shard 'abcd': Sources.Journal not in unique, sorted order",
        ),
        (
            "id: abcd\n  labels:\n  - name: id\n    value: x",
            "shard 'abcd': Labels cannot include label \"id\"",
        ),
    ],
)
def test_incomplete_or_invalid_specs_fail_naming_the_shard(shard: str, message: str) -> None:
    text = f"common:\n  max_txn_duration: 1s\nshards:\n- {shard}\n"
    shard_set = parse_shardspace(text)  # Partial specs parse...
    with pytest.raises(ValidationError, match=message):
        apply_request(shard_set)  # ...and are validated whole.


def test_a_zero_value_takes_the_common_one_and_none_at_all_is_invalid() -> None:
    text = "common:\n  max_txn_duration: 1s\nshards:\n- id: abcd\n  max_txn_duration: 0s\n"
    [entry] = flatten(parse_shardspace(text))
    assert entry.spec.max_txn_duration.seconds == 1
    with pytest.raises(
        ValidationError, match=r"shard 'abcd': invalid MaxTxnDuration \(0; expected > 0\)"
    ):
        apply_request(parse_shardspace("shards:\n- id: abcd\n  max_txn_duration: 0s\n"))


def test_common_values_are_overridden_by_a_shards_own() -> None:
    text = """
common:
  max_txn_duration: 1s
  hot_standbys: 2
  labels:
  - name: app
    value: counter
  - name: tier
    value: gold
shards:
- id: shard-A
  hot_standbys: 3
  labels:
  - name: tier
    value: silver
"""
    [entry] = flatten(parse_shardspace(text))
    assert entry.spec.hot_standbys == 3
    assert [(lb.name, lb.value) for lb in entry.spec.labels.labels] == [
        ("app", "counter"),
        ("tier", "silver"),
    ]


# Properties ------------------------------------------------------------------------------

# Arbitrary text, including what YAML would otherwise read as another type ("true", "1e3",
# "null", "~", "0x10", "- a", ": b", leading/trailing spaces, line breaks, unicode).
_tricky = st.sampled_from(["true", "no", "1e3", "null", "~", "0x10", "- a", "a: b", " x ", "#c"])
_text = st.one_of(_tricky, st.text(st.characters(exclude_categories=["Cs"]), max_size=12))
_nonempty_text = _text.filter(bool)
_u32 = st.integers(0, (1 << 32) - 1)
_durations = st.integers(0, 10**15)


@st.composite
def partial_specs(draw: st.DrawFn, shard_id: str = "") -> cpb.ShardSpec:
    spec = cpb.ShardSpec(id=shard_id)
    for journal in draw(st.lists(_nonempty_text, max_size=3)):
        spec.sources.add(journal=journal, min_offset=draw(st.integers(0, (1 << 63) - 1)))
    spec.recovery_log_prefix = draw(_text)
    spec.hint_prefix = draw(_text)
    spec.hint_backups = draw(st.integers(0, (1 << 31) - 1))
    for name in ("max_txn_duration", "min_txn_duration"):
        ns = draw(_durations)
        if ns:
            getattr(spec, name).seconds, getattr(spec, name).nanos = divmod(ns, 10**9)
    spec.disable = draw(st.booleans())
    spec.disable_wait_for_ack = draw(st.booleans())
    spec.hot_standbys = draw(_u32)
    spec.ring_buffer_size = draw(_u32)
    spec.read_channel_size = draw(_u32)
    # A name ending in ":prefix" means a prefix label to label_set, which a spec can't have.
    label_names = _nonempty_text.filter(lambda t: not t.endswith(":prefix"))
    labels = label_set(draw(st.lists(st.tuples(label_names, _text), max_size=4)))
    if labels.labels:
        spec.labels.CopyFrom(labels)
    return spec


@st.composite
def shard_sets(draw: st.DrawFn) -> ShardSet:
    ids = draw(st.lists(_nonempty_text, max_size=4, unique=True))
    return ShardSet(
        common=draw(partial_specs()),
        shards=[
            ShardEntry(
                spec=draw(partial_specs(shard_id)),
                comment=draw(_text),
                delete=draw(st.sampled_from([None, True, False])),
                revision=draw(st.integers(-1, (1 << 63) - 1)),
            )
            for shard_id in ids
        ],
    )


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(shard_sets())
def test_render_then_parse_is_identity(shard_set: ShardSet) -> None:
    assert parse_shardspace(dump_shardspace(shard_set)) == shard_set


# Valid specs, for listings: the flattened result must validate.
_token = st.text(st.sampled_from("abcxyz019-_+."), min_size=4, max_size=12)
_journal = st.builds(
    lambda a, b: f"{a}/{b}",
    st.text(st.sampled_from("abc019-_"), min_size=2, max_size=6),
    st.text(st.sampled_from("abc019-_"), min_size=2, max_size=6),
)


@st.composite
def valid_specs(draw: st.DrawFn, shard_id: str) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(id=shard_id)
    for journal in sorted(draw(st.sets(_journal, max_size=3))):
        spec.sources.add(journal=journal, min_offset=draw(st.sampled_from([0, 0, 7, 1 << 40])))
    if draw(st.booleans()):
        spec.recovery_log_prefix = draw(st.sampled_from(["recovery/logs", "logs"]))
        spec.hint_prefix = draw(st.sampled_from(["/hints", "/a/b/hints"]))
    spec.hint_backups = draw(st.sampled_from([0, 1, 2]))
    spec.max_txn_duration.seconds, spec.max_txn_duration.nanos = divmod(
        draw(st.sampled_from([10**9, 10**9, 1, 90 * 10**9, 1_500_000])), 10**9
    )
    ns = draw(st.sampled_from([0, 0, 10**6, 10**9]))
    if ns:
        spec.min_txn_duration.seconds, spec.min_txn_duration.nanos = divmod(ns, 10**9)
    spec.disable = draw(st.booleans())
    spec.disable_wait_for_ack = draw(st.booleans())
    spec.hot_standbys = draw(st.sampled_from([0, 1, 1, 3]))
    spec.ring_buffer_size = draw(st.sampled_from([0, 0, 8192]))
    spec.read_channel_size = draw(st.sampled_from([0, 0, 1024]))
    labels = label_set(
        draw(
            st.lists(
                st.tuples(
                    st.sampled_from(["app", "tier", "zone", "flag"]),
                    st.sampled_from(["", "a", "b", "gold", "x/y"]),
                ),
                max_size=4,
            )
        )
    )
    # A label name has either one empty value or non-empty values.
    keep = [lb for lb in labels.labels if lb.value or len(label_values_of(labels, lb.name)) == 1]
    if keep:
        spec.labels.CopyFrom(pb.LabelSet(labels=keep))
    return spec


def label_values_of(ls: pb.LabelSet, name: str) -> list[str]:
    return [lb.value for lb in ls.labels if lb.name == name]


@st.composite
def listings(draw: st.DrawFn) -> list[cpb.ListResponse.Shard]:
    ids = draw(st.lists(_token, min_size=1, max_size=5, unique=True))
    return [
        cpb.ListResponse.Shard(
            spec=draw(valid_specs(shard_id)), mod_revision=draw(st.integers(1, 10**9))
        )
        for shard_id in ids
    ]


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(listings())
def test_listed_yaml_applies_back_as_the_same_specs(shards: list[cpb.ListResponse.Shard]) -> None:
    text = dump_shardspace(from_list(shards))
    request = apply_request(parse_shardspace(text))
    by_id = {s.spec.id: s for s in shards}
    assert sorted(c.upsert.id for c in request.changes) == sorted(by_id)
    for change in request.changes:
        original = by_id[change.upsert.id]
        assert change.upsert == original.spec
        assert change.expect_mod_revision == original.mod_revision
    # And the hoisted form is stable: listing the applied specs writes the same YAML.
    assert dump_shardspace(from_list(shards)) == text


def test_yaml_merge_keys_may_be_overridden() -> None:
    # gazctl's strict decoding (yaml.UnmarshalStrict) lets a shard's own key override one it
    # merges in ("<<: *base"), as YAML merges mean; only a key given twice is refused. The
    # merged 'id' was taken for a duplicate ("found duplicate key 'id'").
    text = (
        "shards:\n"
        "- &base\n  id: shard-a\n  max_txn_duration: 1s\n  sources: [{journal: a/b/c}]\n"
        "- <<: *base\n  id: shard-b\n"
    )
    ids = [c.upsert.id for c in apply_request(parse_shardspace(text)).changes]
    assert ids == ["shard-a", "shard-b"]
