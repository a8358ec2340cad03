"""The journalspace YAML hierarchy: parsing, validation, inheritance, hoisting, round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.cli.journalspace import (
    Node,
    apply_request,
    dump_journalspace,
    extract_tree,
    from_list,
    parse_journalspace,
    shared_prefix,
)
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.go_duration import format_duration, parse_duration
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "journalspace.yaml"

FULL_SPEC = """
fragment:
  length: 1048576
  compression_codec: SNAPPY
  stores: [file:///]
  refresh_interval: 1m
"""


def spec(name: str, **fields: object) -> pb.JournalSpec:
    return pb.JournalSpec(name=name, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("0s", 0),
        ("1s", 10**9),
        ("1.5s", 1_500_000_000),
        ("300ms", 300_000_000),
        ("2h45m", (2 * 3600 + 45 * 60) * 10**9),
        ("1h0m0s", 3600 * 10**9),
        ("10µs", 10_000),
        ("10us", 10_000),
        ("7ns", 7),
        ("-1m", -60 * 10**9),
        (".5m", 30 * 10**9),
    ],
)
def test_parse_duration(text: str, ns: int) -> None:
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["", "5", "1x", "m", "1.2.3s", "s5", "--1s"])
def test_parse_duration_rejects_garbage(text: str) -> None:
    with pytest.raises(ValidationError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (7, "7ns"),
        (1_500, "1.5µs"),
        (250_000_000, "250ms"),
        (10**9, "1s"),
        (1_500_000_000, "1.5s"),
        (60 * 10**9, "1m0s"),
        (3600 * 10**9, "1h0m0s"),
        ((3600 + 61) * 10**9, "1h1m1s"),
        (168 * 3600 * 10**9, "168h0m0s"),
    ],
)
def test_format_duration_like_go(ns: int, text: str) -> None:
    assert format_duration(ns) == text
    assert parse_duration(text) == ns


@given(st.integers(min_value=-(10**18), max_value=10**18))
def test_duration_round_trip(ns: int) -> None:
    assert parse_duration(format_duration(ns)) == ns


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [
        ("foo/bar", "foo/baz", 4),
        ("foo/bar/baz", "foo/bar/bing", 8),
        ("foo/bar/baz/1", "foo/bar/baz/2", 12),
        ("foo/bar/baz/match", "foo/bar/baz/match", 12),  # Whole components only.
        ("foo/bar/", "foo/baz/", 4),
        ("foo/bar/", "foo/bar/", 8),
        ("miss/", "match/", 0),
    ],
)
def test_shared_prefix(a: str, b: str, n: int) -> None:
    assert shared_prefix(a, b) == n
    assert shared_prefix(b, a) == n


def names(node: Node) -> object:
    if not node.children:
        return node.name
    return {node.name: [names(c) for c in node.children]}


def test_extract_tree_groups_by_shared_prefixes() -> None:
    leaves = [
        "root/aaa/000",
        "root/aaa/111/foo/i",
        "root/aaa/111/foo/j",
        "root/aaa/222",
        "root/bbb/333/a/x",
        "root/bbb/333/a/y",
        "root/bbb/333/z",
        "root/bbb/444",
    ]
    tree = extract_tree([Node(spec=spec(n)) for n in leaves])
    assert names(tree) == {
        "root/": [
            {
                "root/aaa/": [
                    "root/aaa/000",
                    # No separate "111/" node: every journal under it is also under foo/.
                    {"root/aaa/111/foo/": ["root/aaa/111/foo/i", "root/aaa/111/foo/j"]},
                    "root/aaa/222",
                ]
            },
            {
                "root/bbb/": [
                    {
                        "root/bbb/333/": [
                            {"root/bbb/333/a/": ["root/bbb/333/a/x", "root/bbb/333/a/y"]},
                            "root/bbb/333/z",
                        ]
                    },
                    "root/bbb/444",
                ]
            },
        ]
    }


def test_children_inherit_and_override() -> None:
    tree = parse_journalspace(
        """
name: shared/
replication: 1
labels: [{name: team, value: data}, {name: tier, value: gold}]
fragment:
  length: 1048576
  compression_codec: SNAPPY
  stores: [file:///]
  refresh_interval: 5m
children:
- name: shared/aaa/
  flags: O_RDWR
  children:
  - name: shared/aaa/111
    flags: O_RDONLY
  - name: shared/aaa/222
- name: shared/bbb/
  replication: 2
  delete: true
  children:
  - name: shared/bbb/x
    labels: [{name: tier, value: silver}]
    revision: 5
  - name: shared/bbb/y
    delete: false
    revision: 7
"""
    )
    changes = apply_request(tree).changes
    assert [c.upsert.name or c.delete for c in changes] == [
        "shared/aaa/111",
        "shared/aaa/222",
        "shared/bbb/x",
        "shared/bbb/y",
    ]
    a111, a222, bx, by = changes
    assert a111.upsert.flags == pb.JournalSpec.O_RDONLY
    assert a222.upsert.flags == pb.JournalSpec.O_RDWR
    assert a111.upsert.replication == 1
    assert a111.upsert.fragment.refresh_interval.seconds == 300
    assert a111.upsert.labels == label_set({"team": "data", "tier": "gold"})
    assert a111.expect_mod_revision == 0
    assert bx.delete == "shared/bbb/x" and not bx.HasField("upsert")
    assert bx.expect_mod_revision == 5  # A delete names its revision (gazctl's rule).
    assert by.upsert.replication == 2
    assert by.expect_mod_revision == 7
    assert by.upsert.labels == label_set({"team": "data", "tier": "gold"})


def test_hoisting_moves_shared_values_up() -> None:
    listing = [
        pb.ListResponse.Journal(
            spec=spec(
                "node/aaa",
                replication=2,
                flags=pb.JournalSpec.O_RDONLY,
                labels=label_set({"name-1": "val-1"}),
            ),
            mod_revision=3,
        ),
        pb.ListResponse.Journal(
            spec=spec(
                "node/bbb",
                replication=2,
                flags=pb.JournalSpec.O_RDONLY,
                labels=label_set({"name-1": "val-1", "name-2": "val-2"}),
            ),
            mod_revision=4,
        ),
    ]
    tree = from_list(listing)
    assert tree.spec == spec(
        "node/",
        replication=2,
        flags=pb.JournalSpec.O_RDONLY,
        labels=label_set({"name-1": "val-1"}),
    )
    assert [c.spec for c in tree.children] == [
        spec("node/aaa"),
        spec("node/bbb", labels=label_set({"name-2": "val-2"})),
    ]
    assert [c.revision for c in tree.children] == [3, 4]


def test_yaml_layout_matches_gazctl() -> None:
    text = """\
name: foo/
replication: 3
labels:
- name: a-name
  value: a-val
fragment:
  length: 1234
  compression_codec: SNAPPY
  stores:
  - s3://a-bucket/
  - gcs://another-bucket/
  refresh_interval: 1m0s
  retention: 1h0m0s
  flush_interval: 2m0s
flags: O_RDWR
max_append_rate: 11223344
children:
- delete: true
  name: foo/bar
- name: foo/baz/1
- name: foo/baz/2
  labels:
  - name: other-name
    value: ""
  revision: 1234
"""  # Gazette's fixture (broker/journalspace/node_test.go), but for path_postfix_template.
    tree = parse_journalspace(text)
    assert dump_journalspace(tree) == text
    flat = [n for n in _pushed_down(tree).walk_journals()]
    assert [n.name for n in flat] == ["foo/bar", "foo/baz/1", "foo/baz/2"]
    assert flat[0].delete is True
    assert flat[2].spec.labels == label_set({"a-name": "a-val", "other-name": ""})
    assert flat[1].spec.fragment.retention.seconds == 3600
    assert flat[1].spec.max_append_rate == 11223344


def _pushed_down(tree: Node) -> Node:
    import copy

    out = copy.deepcopy(tree)
    out.push_down()
    return out


def test_example_file_applies() -> None:
    request = apply_request(parse_journalspace(EXAMPLE.read_text()))
    by_name = {c.upsert.name: c.upsert for c in request.changes}
    assert sorted(by_name) == [
        "examples/clicks-per-user",
        "examples/clicks/part-000",
        "examples/clicks/part-001",
        "examples/logs/app",
        "examples/logs/audit",
    ]
    audit = by_name["examples/logs/audit"]
    assert audit.fragment.compression_codec == pb.ZSTANDARD
    assert audit.fragment.retention.seconds == 168 * 3600
    assert list(audit.fragment.stores) == ["file:///"]
    assert dict((lb.name, lb.value) for lb in audit.labels.labels)["sensitivity"] == "high"
    clicks = by_name["examples/clicks/part-000"]
    assert clicks.fragment.compression_codec == pb.SNAPPY
    assert not clicks.fragment.HasField("retention")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: [unclosed", "invalid YAML"),
        ("{{{{", "invalid YAML"),
        ("", "empty journalspace"),
        ("- a\n- b\n", "expected a YAML mapping"),
        ("just a string", "expected a YAML mapping"),
        ("name: a/\nreplicaton: 1\nchildren: [{name: a/b/c}]", "unknown node field 'replicaton'"),
        ("name: a/\nchildren: []", "node 'a/': a directory node needs one or more children"),
        ("name: a/\nrevision: 3\nchildren: [{name: a/bb}]", "node 'a/': unexpected revision"),
        ("name: a/\nchildren: [{name: b/cc}]", "not prefixed by its parent"),
        ("name: a/\nchildren: [{name: a/zz}, {name: a/bb}]", "ordered"),
        ("name: a/x y", "node 'a/x y': invalid journal name"),
        ("name: a/bb\nchildren: [{name: a/bb/c}]", "cannot have children"),
        ("name: a/bb\nflags: O_SOMETIMES", "'O_SOMETIMES' is not one of"),
        ("name: a/bb\nfragment: {refresh_interval: soon}", "fragment.refresh_interval"),
        ("name: a/bb\nreplication: three", "replication: expected an integer"),
        ("name: a/bb\nlabels: {a: b}", "labels: expected a list"),
        ("name: a/bb\nrevision: -5", "revision: expected -1 or more"),
    ],
)
def test_bad_journalspaces_give_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_journalspace(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_incomplete_specs_are_refused_with_the_journal_name() -> None:
    tree = parse_journalspace("name: a/\nreplication: 1\nchildren: [{name: a/bb}]")
    with pytest.raises(ValidationError, match=r"journal 'a/bb': .*Fragment"):
        apply_request(tree)
    tree = parse_journalspace("name: a/bb\nreplication: 9\n" + FULL_SPEC)
    with pytest.raises(ValidationError, match=r"journal 'a/bb': .*Replication"):
        apply_request(tree)


def test_single_journal_document() -> None:
    tree = parse_journalspace("name: a/bb\nreplication: 1\nrevision: -1\n" + FULL_SPEC)
    (change,) = apply_request(tree).changes
    assert change.expect_mod_revision == -1
    assert change.upsert.fragment.stores == ["file:///"]


# Round trip: listing -> hoisted YAML -> parse -> flatten gives back the listed specs.

_SEGMENTS = st.sampled_from(["aa", "bb", "cc", "dd"])
_NAMES = st.lists(_SEGMENTS, min_size=1, max_size=4).map(lambda parts: "jx/" + "/".join(parts))


@st.composite
def _specs(draw: st.DrawFn, name: str) -> pb.JournalSpec:
    s = pb.JournalSpec(
        name=name,
        replication=draw(st.integers(1, 3)),
        flags=draw(st.sampled_from([0, pb.JournalSpec.O_RDWR, pb.JournalSpec.O_RDONLY])),
        max_append_rate=draw(st.sampled_from([0, 1 << 20])),
    )
    pairs = draw(
        st.lists(st.sampled_from([("team", "a"), ("team", "b"), ("tier", "x"), ("zz", "")]))
    )
    if pairs:
        s.labels.CopyFrom(label_set(pairs))
    f = s.fragment
    f.length = draw(st.sampled_from([1024, 1 << 20]))
    f.compression_codec = draw(st.sampled_from([pb.SNAPPY, pb.GZIP]))  # type: ignore[assignment]
    f.stores.extend(draw(st.sampled_from([["file:///"], ["file:///x/", "file:///y/"]])))
    f.refresh_interval.seconds = draw(st.sampled_from([1, 60]))
    retention = draw(st.sampled_from([0, 3600]))
    if retention:
        f.retention.seconds = retention
    if draw(st.booleans()):
        f.flush_interval.seconds = 600
    if draw(st.booleans()):
        s.suspend.level = pb.JournalSpec.Suspend.PARTIAL
        s.suspend.offset = 5
    return s


@st.composite
def _listings(draw: st.DrawFn) -> list[pb.ListResponse.Journal]:
    journal_names = draw(st.lists(_NAMES, min_size=1, max_size=8, unique=True))
    return [
        pb.ListResponse.Journal(spec=draw(_specs(n)), mod_revision=draw(st.integers(1, 99)))
        for n in journal_names
    ]


@settings(max_examples=200, deadline=None)
@given(_listings())
def test_listing_round_trips_through_hoisted_yaml(listing: list[pb.ListResponse.Journal]) -> None:
    text = dump_journalspace(from_list(listing))
    changes = apply_request(parse_journalspace(text)).changes
    expected = sorted(listing, key=lambda j: j.spec.name)
    assert [c.upsert for c in changes] == [j.spec for j in expected]
    assert [c.expect_mod_revision for c in changes] == [j.mod_revision for j in expected]


def test_a_listing_quotes_strings_as_gazctl_does() -> None:
    """gazctl's YAML (yaml.v2) double-quotes a string that would read as something else;
    PyYAML single-quoted these ('1', 'true', '') or left some plain (Y, which yaml.v2 reads
    as true). The expected lines are gazctl v0.103.0's `journals list -o yaml` of such labels."""
    values = ["1", "true", "Y", "", "2024-01-01", "plain"]
    listing = []
    for i, value in enumerate(values):
        spec = pb.JournalSpec(name=f"quo/j{i}", replication=1)
        spec.labels.CopyFrom(label_set([("flag", value), ("content-type", "text/csv")]))
        spec.fragment.length = 1024
        spec.fragment.compression_codec = pb.NONE
        spec.fragment.refresh_interval.seconds = 1
        listing.append(pb.ListResponse.Journal(spec=spec, mod_revision=5))
    text = dump_journalspace(from_list(listing))
    written = [line.split("value: ", 1)[1] for line in text.splitlines() if "value: " in line]
    assert [w for w in written if w != "text/csv"] == [
        '"1"',
        '"true"',
        '"Y"',
        '""',
        '"2024-01-01"',
        "plain",
    ]
    changes = apply_request(parse_journalspace(text)).changes
    assert [c.upsert for c in changes] == [j.spec for j in listing]


def test_a_resumed_journals_empty_suspend_is_listed_and_applied_as_gazctl_does() -> None:
    """A journal suspended while empty and resumed by an append has a suspend of level NONE
    at offset 0: present, and empty on the wire. gazctl writes it 'suspend: {}' (Go holds it
    by pointer) and applies it back so; pygazette left it out. The expected text is gazctl
    v0.103.0's `journals list -o yaml` of such a journal (res/a) beside a resumed one that
    had content (res/b)."""
    listing = []
    for name, offset, revision in (("res/a", 0, 25), ("res/b", 2, 22)):
        spec = pb.JournalSpec(name=name, replication=1)
        spec.fragment.length = 1024
        spec.fragment.compression_codec = pb.NONE
        spec.fragment.stores.append("file:///")
        spec.fragment.refresh_interval.seconds = 1
        spec.suspend.level = pb.JournalSpec.Suspend.NONE
        spec.suspend.offset = offset
        listing.append(pb.ListResponse.Journal(spec=spec, mod_revision=revision))
    # As it comes off the wire: the empty suspend present.
    listing = [pb.ListResponse.Journal.FromString(j.SerializeToString()) for j in listing]
    assert listing[0].spec.HasField("suspend")
    text = dump_journalspace(from_list(listing))
    assert text == (
        "name: res/\n"
        "replication: 1\n"
        "fragment:\n"
        "  length: 1024\n"
        "  compression_codec: NONE\n"
        "  stores:\n"
        "  - file:///\n"
        "  refresh_interval: 1s\n"
        "children:\n"
        "- name: res/a\n"
        "  suspend: {}\n"
        "  revision: 25\n"
        "- name: res/b\n"
        "  suspend:\n"
        "    offset: 2\n"
        "  revision: 22\n"
    )
    changes = apply_request(parse_journalspace(text)).changes
    assert [c.upsert for c in changes] == [j.spec for j in listing]
    assert changes[0].upsert.HasField("suspend")
