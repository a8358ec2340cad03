"""Validation rules and messages (cases ported from Gazette's *_extensions_test.go)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from pygazette.protocol import validation as v
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import peer_pb2 as ppb
from pygazette.protocol.pb import protocol_pb2 as pb


def ls(*nv: str) -> pb.LabelSet:
    return label_set(list(zip(nv[::2], nv[1::2], strict=True)))


def fails(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ValidationError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_token_and_path_component() -> None:
    v.validate_token("zone-a_1+/.é", "", v.TOKEN_SYMBOLS, 1, 32)
    assert fails(v.validate_token, "a b", "Zone", v.TOKEN_SYMBOLS, 1, 32) == (
        "Zone: not a valid token (a b)"
    )
    # Length is counted in UTF-8 bytes, as in Go.
    assert fails(v.validate_token, "éé", "", v.TOKEN_SYMBOLS, 1, 3) == (
        "invalid length (4; expected 1 <= length <= 3)"
    )
    for bad in ("a#b", "a;b", "a:b", "a=b", "a%b", "a b", "a\x00b", "a,b"):
        fails(v.validate_token, bad, "", v.TOKEN_SYMBOLS, 1, 32)
    v.validate_path_component("a=b/c%20d", "", 1, 32)
    assert v.go_path_clean("a//b/./c/../d/") == "a/b/d"
    assert v.go_path_clean("") == "." and v.go_path_clean("/..") == "/"


@pytest.mark.parametrize(
    ("name", "value", "expect"),
    [
        ("a-label", "a-value", ""),
        ("a/label", "a%20value", ""),
        ("a|label", "a-value", "Name: not a valid token (a|label)"),
        ("a-label", "a|value", "Value: not a valid token (a|value)"),
        ("a", "a-value", "Name: invalid length (1; expected 2 <= length <= 64)"),
        ("a" * 65, "a-value", "Name: invalid length (65; expected 2 <= length <= 64)"),
        ("a-label", "", ""),
        ("a-label", "a" * 1025, "Value: invalid length (1025; expected 0 <= length <= 1024)"),
        ("a-label:prefix", "a-value", "Name: not a valid token (a-label:prefix)"),
    ],
)
def test_label_cases(name: str, value: str, expect: str) -> None:
    label = pb.Label(name=name, value=value)
    if expect:
        assert fails(v.validate_label, label) == expect
    else:
        v.validate_label(label)


def test_single_value_labels() -> None:
    v.validate_single_value_labels(ls("aaa", "bar", "aaa", "baz", "content-type", "a/type"))
    assert fails(
        v.validate_single_value_labels,
        ls("aaa", "bar", "content-type", "a/type", "content-type", "other/type"),
    ) == (
        "expected single-value Label has multiple values (index 2; label content-type "
        "value other/type)"
    )


def test_label_set_cases() -> None:
    labels = [
        pb.Label(name="bad label", value="111"),
        pb.Label(name="aaa", value="444"),
        pb.Label(name="aaa", value="333"),
        pb.Label(name="aaa", value="222"),
        pb.Label(name="ccc", value=""),
        pb.Label(name="ccc", value=""),
        pb.Label(name="ccc", value="555"),
        pb.Label(name="ddd", value="666", prefix=True),
    ]
    s = pb.LabelSet(labels=labels)
    assert fails(v.validate_label_set, s) == "Labels[0].Name: not a valid token (bad label)"
    s.labels[0].name = "bbb"
    assert fails(v.validate_label_set, s) == (
        "Labels not in unique, sorted order (index 1; label name aaa <= bbb)"
    )
    s.labels[0].name, s.labels[3].name = "aaa", "bbb"
    s.labels[0].value, s.labels[3].value = "222", "111"
    assert fails(v.validate_label_set, s) == (
        "Labels not in unique, sorted order (index 2; label aaa value 333 <= 444)"
    )
    s.labels[1].value, s.labels[2].value = "333", "444"
    assert fails(v.validate_label_set, s) == (
        "Labels not in unique, sorted order (index 5; label ccc value  <= )"
    )
    s.labels[5].value = "444"
    assert fails(v.validate_label_set, s) == (
        "Label has empty & non-empty values (index 5; label ccc value 444)"
    )
    s.labels[4].value = "44"
    assert fails(v.validate_label_set, s) == (
        "Labels[7]: Prefix may not be set outside of a LabelSelector"
    )
    v.validate_label_set(s, allow_prefix=True)
    s.labels[7].prefix = False
    v.validate_label_set(s)


def test_label_selector_cases() -> None:
    sel = pb.LabelSelector(
        include=pb.LabelSet(
            labels=[
                pb.Label(name="include", value="a-value"),
                pb.Label(name="prefix-thing", value="prefix/", prefix=True),
            ]
        ),
        exclude=ls("exclude", "other-value"),
    )
    v.validate_label_selector(sel)
    sel.include.labels[0].name = "bad label"
    assert fails(v.validate_label_selector, sel) == (
        "Include.Labels[0].Name: not a valid token (bad label)"
    )
    sel.include.labels[0].name = "include"
    sel.exclude.labels[0].name = "bad label"
    assert fails(v.validate_label_selector, sel) == (
        "Exclude.Labels[0].Name: not a valid token (bad label)"
    )


@pytest.mark.parametrize(
    ("journal", "expect"),
    [
        ("a/valid/path/to/a/journal", ""),
        ("/leading/slash", "cannot begin with '/' (/leading/slash)"),
        ("trailing/slash/", "must be a clean path (trailing/slash/)"),
        ("extra-middle//slash", "must be a clean path (extra-middle//slash)"),
        ("dot/./segment", "must be a clean path (dot/./segment)"),
        ("not-$%|-a valid token", "not a valid token (not-$%|-a valid token)"),
        ("", "invalid length (0; expected 4 <= length <= 512)"),
        ("zz", "invalid length (2; expected 4 <= length <= 512)"),
        ("a" * 513, "invalid length (513; expected 4 <= length <= 512)"),
        ("foo/bar;baz/bing", ""),
        ("foo/bar/webhook;foo/bar/webhook/http%3A%2F%2Fexample.com%3A9000%2F", ""),
        ("foo/bar;disallowed#rune", "metadata path segment: not a valid token (disallowed#rune)"),
        ("foo/bar;", "metadata path segment: invalid length (0; expected 1 <= length <= 512)"),
        ("a=1/b%20c", ""),
    ],
)
def test_journal_names(journal: str, expect: str) -> None:
    if expect:
        assert fails(v.validate_journal_name, journal) == expect
    else:
        v.validate_journal_name(journal)


def test_journal_name_without_meta() -> None:
    assert fails(v.validate_journal_name, "a/journal;meta", allow_meta=False) == (
        "Name cannot have a metadata path segment (;meta; expected no segment)"
    )
    assert v.split_journal_meta("foo/bar;meta-part") == ("foo/bar", ";meta-part")
    assert v.split_journal_meta("foo/bar") == ("foo/bar", "")


def test_journal_names_remembered_only_when_valid() -> None:
    # A valid name is remembered per allow_meta; an invalid one fails every time.
    v.validate_journal_name("a/journal;meta")
    assert fails(v.validate_journal_name, "a/journal;meta", allow_meta=False) != ""
    for _ in range(2):
        assert fails(v.validate_journal_name, "bad//name") == "must be a clean path (bad//name)"


@pytest.mark.parametrize(
    ("store", "expect"),
    [
        ("s3://my-bucket/?query", ""),
        ("s3://my-bucket/subpath/?query", ""),
        ("file:///mnt/path/", ""),
        ("file:///mnt/path/?query", ""),
        ("gs://bucket/a/b/", ""),
        ("azure://container/prefix/", ""),
        ("azure-ad://tenant/account/container/", ""),
        ("S3://bucket/", ""),  # Go lower-cases the scheme.
        ("s3://my-bucket", "path component doesn't end in '/' ()"),
        ("s3://my-bucket/subpath?query", "path component doesn't end in '/' (/subpath)"),
        (":garbage: :garbage:", 'parse ":garbage: :garbage:": missing protocol scheme'),
        ("foobar://baz/", "invalid scheme (foobar)"),
        ("/baz/bing/", "not absolute (/baz/bing/)"),
        ("gs:///baz/bing/", "missing bucket (gs:///baz/bing/)"),
        ("file://host/mnt/path/", "file scheme cannot have host (file://host/mnt/path/)"),
        ("file:///mnt/path", "path component doesn't end in '/' (/mnt/path)"),
        ("file:mnt/path/", "path component doesn't end in '/' ()"),
        ("azure-ad:///account/container/", "missing tenant ID (azure-ad:///account/container/)"),
        (
            "azure-ad://tenant//container/",
            "missing storage account (azure-ad://tenant//container/)",
        ),
        ("azure-ad://tenant/account/", "missing storage container (azure-ad://tenant/account/)"),
        (
            "s3://bucket/\x7f/",
            'parse "s3://bucket/\x7f/": net/url: invalid control character in URL',
        ),
        ("s3://bucket/%zz/", 'parse "s3://bucket/%zz/": invalid URL escape'),
        # Hosts as Go's net/url parses them (go.gazette.dev/core v0.103.0's Validate refuses
        # these): no space or other character outside RFC 3986's host set, and %-escapes
        # only of non-ASCII bytes.
        ("s3://my bucket/", 'parse "s3://my bucket/": invalid character " " in host name'),
        ("gs://b%20c/p/", 'parse "gs://b%20c/p/": invalid URL escape "%20"'),
        ("s3://%41/", 'parse "s3://%41/": invalid URL escape "%41"'),
        ("s3://a{b}/", 'parse "s3://a{b}/": invalid character "{" in host name'),
        ("s3://a[b]/", 'parse "s3://a[b]/": invalid IP-literal'),
        ("s3://b%C3%BCcket/", ""),
        ("s3://bücket/", ""),
        ("s3://my-bucket_1.x~/p/", ""),
        ("s3://user@bucket:9000/p/", ""),
        ("s3://[::1]:9000/p/", ""),
    ],
)
def test_fragment_stores(store: str, expect: str) -> None:
    if expect:
        assert fails(v.validate_fragment_store, store) == expect
    else:
        v.validate_fragment_store(store)


@pytest.mark.parametrize(
    ("template", "expect"),
    [
        # Comments may hold anything up to their "*/}}" (Go's text/template lexer): Gazette
        # accepts these, and a listing holding one was refused whole by pygazette's client.
        ("a{{/* }} */}}b", ""),
        ("{{/* {{ }} */}}", ""),
        ("{{/* }}{{ }} */}}", ""),
        ("{{- /* x }} */ -}}/{{ .Name }}", ""),
        ("{{/* x */}}{{ }}", "missing value for command"),
        ("{{/* x }}", "unclosed comment"),
        ("{{/* x */ }}", "comment ends before closing delimiter"),
    ],
)
def test_postfix_template_comments(template: str, expect: str) -> None:
    spec = minimal_spec()
    spec.fragment.path_postfix_template = template
    if expect:
        assert expect in fails(v.validate_journal_spec, spec)
    else:
        v.validate_journal_spec(spec)


def good_spec() -> pb.JournalSpec:
    return pb.JournalSpec(
        name="a/journal",
        replication=3,
        labels=ls("aaa", "bbb"),
        fragment=pb.JournalSpec.Fragment(
            length=1 << 18,
            compression_codec=pb.GZIP,
            stores=["s3://bucket/path/", "gs://other-bucket/path/"],
            refresh_interval=Duration(seconds=300),
            retention=Duration(seconds=365 * 24 * 3600),
            path_postfix_template='date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}'
            '/hour={{ .Spool.FirstAppendTime.Format "15" }}',
        ),
        flags=pb.JournalSpec.O_RDWR,
        max_append_rate=12345,
    )


def test_journal_spec_cases() -> None:
    spec = good_spec()
    v.validate_journal_spec(spec)

    spec.name = "/bad/name"
    assert fails(v.validate_journal_spec, spec) == "Name: cannot begin with '/' (/bad/name)"
    spec.name = "a/journal;disallowed/meta"
    assert fails(v.validate_journal_spec, spec) == (
        "Name cannot have a metadata path segment (;disallowed/meta; expected no segment)"
    )
    spec.name = "a/journal"

    spec.replication = 0
    assert fails(v.validate_journal_spec, spec) == (
        "invalid Replication (0; expected 1 <= Replication <= 5)"
    )
    spec.replication = 1024
    assert fails(v.validate_journal_spec, spec).startswith("invalid Replication (1024;")
    spec.replication = 3

    spec.labels.labels[0].name = "xxx xxx"
    assert fails(v.validate_journal_spec, spec) == (
        "Labels.Labels[0].Name: not a valid token (xxx xxx)"
    )
    spec.labels.labels[0].name = "name"
    assert fails(v.validate_journal_spec, spec) == 'Labels cannot include label "name"'
    spec.labels.labels[0].value = ""
    assert fails(v.validate_journal_spec, spec) == 'Labels cannot include label "name"'
    spec.labels.labels[0].name = "prefix"
    assert fails(v.validate_journal_spec, spec) == 'Labels cannot include label "prefix"'

    mt, mst, ct = v.MESSAGE_TYPE_LABEL, v.MESSAGE_SUB_TYPE_LABEL, v.CONTENT_TYPE_LABEL
    cases = [
        (ls(mt, "a", mt, "b"), "Labels: expected single-value Label has multiple values"),
        (
            ls(ct, "invalid/content/type"),
            f"Labels: parsing {ct}: mime: unexpected content after media subtype",
        ),
        (ls(ct, ""), f"Labels: parsing {ct}: mime: no media type"),
        (ls(mst, "subtype"), f"Labels: expected {mt} label alongside {mst}"),
        (ls(mst, "subtype", mt, "type"), f"Labels: expected {ct} label alongside {mt}"),
        (ls(mt, "type", ct, "application/x-ndjson"), ""),
        (ls(mst, "subtype", mt, "type", ct, "application/x-ndjson"), ""),
        (ls(ct, "text/"), f"Labels: parsing {ct}: mime: expected token after slash"),
        (ls(ct, "text"), ""),
        (ls(ct, "text/csv"), ""),
    ]
    for labels, expect in cases:
        spec.labels.CopyFrom(labels)
        if expect:
            assert fails(v.validate_journal_spec, spec).startswith(expect), labels
        else:
            v.validate_journal_spec(spec)

    spec.fragment.length = 0
    assert fails(v.validate_journal_spec, spec) == (
        "Fragment: invalid Length (0; expected 1024 <= length <= 17179869184)"
    )
    spec.fragment.length = 4096

    for flags in (4 | 1, 4 | 2, 1 | 2):
        spec.flags = flags
        assert fails(v.validate_journal_spec, spec) == f"Flags: invalid combination ({flags})"
    for flags in (0, 1, 2, 4):
        spec.flags = flags
        v.validate_journal_spec(spec)

    spec.max_append_rate = -1
    assert fails(v.validate_journal_spec, spec) == "invalid MaxAppendRate (-1; expected >= 0)"
    spec.max_append_rate = 0

    f = spec.fragment
    f.length = (1 << 34) + 1
    assert fails(v.validate_journal_spec, spec).startswith("Fragment: invalid Length (17179869185;")
    f.length = 1024
    f.compression_codec = 9999  # type: ignore[assignment]
    assert fails(v.validate_journal_spec, spec) == (
        "Fragment.CompressionCodec: invalid value (9999)"
    )
    f.compression_codec = pb.GZIP_OFFLOAD_DECOMPRESSION
    f.stores[0] = "file:///a/root/"
    assert fails(v.validate_journal_spec, spec) == (
        "Fragment: GZIP_OFFLOAD_DECOMPRESSION is incompatible with file:// stores (file:///a/root/)"
    )
    f.compression_codec = pb.SNAPPY
    f.refresh_interval.CopyFrom(Duration(nanos=1_000_000))
    assert fails(v.validate_journal_spec, spec) == (
        "Fragment: invalid RefreshInterval (1ms; expected 1s <= interval <= 24h0m0s)"
    )
    f.refresh_interval.CopyFrom(Duration(seconds=25 * 3600))
    assert fails(v.validate_journal_spec, spec) == (
        "Fragment: invalid RefreshInterval (25h0m0s; expected 1s <= interval <= 24h0m0s)"
    )
    f.refresh_interval.CopyFrom(Duration(seconds=3600))
    f.flush_interval.CopyFrom(Duration(seconds=1))
    assert fails(v.validate_journal_spec, spec) == (
        "Fragment: invalid FlushInterval (1s; expected >= 1m0s)"
    )
    f.flush_interval.CopyFrom(Duration(seconds=7200))
    f.path_postfix_template = "{{ bad template"
    assert fails(v.validate_journal_spec, spec).startswith(
        "Fragment.PathPostfixTemplate: template: postfix:1: "
    )
    f.path_postfix_template = ""
    v.validate_journal_spec(spec)
    f.stores.append("invalid")
    assert fails(v.validate_journal_spec, spec) == "Fragment.Stores[2]: not absolute (invalid)"
    del f.stores[1:]

    spec.suspend.offset = -1
    assert (
        fails(v.validate_journal_spec, spec) == "Suspend.Offset: invalid Offset (-1; expected >= 0)"
    )
    spec.suspend.offset = 1234
    spec.suspend.level = 12345  # type: ignore[assignment]
    assert fails(v.validate_journal_spec, spec) == "Suspend.Level: invalid Level variant (12345)"
    spec.suspend.level = pb.JournalSpec.Suspend.FULL
    v.validate_journal_spec(spec)


def test_flags() -> None:
    for flags, read, write in [
        (0, True, True),
        (1, True, False),
        (2, False, True),
        (4, True, True),
        (3, False, False),
    ]:
        spec = pb.JournalSpec(flags=flags)
        assert v.journal_spec_flags_allow_read(spec) is read
        assert v.journal_spec_flags_allow_write(spec) is write


def bad_header() -> pb.Header:
    return pb.Header(
        process_id=pb.ProcessSpec.ID(zone="zone", suffix="name"),
        route=pb.Route(primary=0, members=[pb.ProcessSpec.ID(zone="zone", suffix="name")]),
        etcd=pb.Header.Etcd(cluster_id=0, member_id=34, revision=56, raft_term=78),
    )


def test_header_cases() -> None:
    h = pb.Header(
        route=pb.Route(primary=-1),
        etcd=pb.Header.Etcd(cluster_id=0, member_id=0, revision=-42, raft_term=0),
    )
    assert fails(v.validate_header, h) == "Etcd: invalid ClusterId (expected != 0)"
    h.etcd.cluster_id = 12
    assert fails(v.validate_header, h) == "Etcd: invalid MemberId (expected != 0)"
    h.etcd.member_id = 34
    assert fails(v.validate_header, h) == "Etcd: invalid Revision (-42; expected 0 < revision)"
    h.etcd.revision = 56
    assert fails(v.validate_header, h) == "Etcd: invalid RaftTerm (expected != 0)"
    h.etcd.raft_term = 78
    v.validate_header(h)
    h.process_id.zone = "zone"
    assert fails(v.validate_header, h).startswith("ProcessId.Suffix: invalid length")
    h.process_id.suffix = "name"
    h.route.primary = 2
    assert fails(v.validate_header, h).startswith("Route: invalid Primary")


def test_route_cases() -> None:
    rt = pb.Route(
        primary=-1,
        members=[
            pb.ProcessSpec.ID(zone="zone-a", suffix="member-1"),
            pb.ProcessSpec.ID(zone="zone-a", suffix="member-3"),
            pb.ProcessSpec.ID(zone="zone-b", suffix="member-2"),
        ],
        endpoints=["http://foo", "http://bar", "http://baz"],
    )
    v.validate_route(rt)
    rt.members[0].zone = "invalid zone"
    assert fails(v.validate_route, rt) == "Members[0].Zone: not a valid token (invalid zone)"
    rt.members[0].zone = "zone-a"
    rt.members[1].zone, rt.members[2].zone = "zone-b", "zone-a"
    rt.members[1].suffix, rt.members[2].suffix = "member-2", "member-3"
    assert fails(v.validate_route, rt) == (
        "Members not in unique, sorted order (index 2; {Zone:zone-b Suffix:member-2} <= "
        "{Zone:zone-a Suffix:member-3})"
    )
    rt.members[1].zone, rt.members[2].zone = "zone-a", "zone-b"
    rt.members[1].suffix, rt.members[2].suffix = "member-3", "member-2"
    rt.primary = -2
    assert fails(v.validate_route, rt) == "invalid Primary (-2; expected -1 <= Primary < 3)"
    rt.primary = 3
    assert fails(v.validate_route, rt) == "invalid Primary (3; expected -1 <= Primary < 3)"
    rt.primary = 2
    rt.endpoints.append("http://bing")
    assert fails(v.validate_route, rt) == "len(Endpoints) != 0, and != len(Members) (4 vs 3)"
    del rt.endpoints[3:]
    rt.endpoints[2] = "invalid"
    assert fails(v.validate_route, rt) == "Endpoints[2]: not absolute: invalid"
    rt.endpoints[2] = ""
    v.validate_route(rt)


def test_broker_spec() -> None:
    spec = pb.BrokerSpec(
        process_spec=pb.ProcessSpec(
            id=pb.ProcessSpec.ID(zone="us-east-1", suffix="broker-1"), endpoint="http://host:8080"
        ),
        journal_limit=10,
    )
    v.validate_broker_spec(spec)
    spec.journal_limit = (1 << 17) + 1
    assert fails(v.validate_broker_spec, spec).startswith("invalid JournalLimit (131073;")
    spec.process_spec.endpoint = "http://"
    assert fails(v.validate_broker_spec, spec) == "Endpoint: missing host: http://"


def test_fragment_cases() -> None:
    f = pb.Fragment(
        journal="a/journal/name",
        begin=1234567890,
        end=(1 << 63) - 1,
        sum=pb.SHA1Sum(part1=0x0102030405060708, part2=0x090A0B0C0D0E0F10, part3=0x11121314),
        compression_codec=pb.GZIP,
    )
    v.validate_fragment(f)
    f.begin, f.end = f.end, f.begin
    assert fails(v.validate_fragment, f).startswith("expected Begin <= End (have ")
    f.begin, f.end = f.end, f.begin
    f.journal = "a"
    assert fails(v.validate_fragment, f).startswith("Journal: invalid length ")
    f.journal = "foo/bar/baz"
    f.compression_codec = 1 << 20  # type: ignore[assignment]
    assert fails(v.validate_fragment, f).startswith("CompressionCodec: invalid value ")
    f.compression_codec = pb.INVALID
    assert fails(v.validate_fragment, f) == "CompressionCodec: invalid value (INVALID)"
    f.compression_codec = pb.GZIP
    f.path_postfix = "a=b/c=2"
    v.validate_fragment(f)
    f.path_postfix = "/a=b"
    assert fails(v.validate_fragment, f) == "PathPostfix: cannot begin with '/' (/a=b)"


def test_read_request_cases() -> None:
    req = pb.ReadRequest(header=bad_header(), journal="/bad", offset=-2, end_offset=-1)
    assert fails(v.validate_read_request, req).startswith("Header.Etcd: invalid ClusterId")
    req.header.etcd.cluster_id = 12
    assert fails(v.validate_read_request, req) == "Journal: cannot begin with '/' (/bad)"
    req.journal = "good"
    assert fails(v.validate_read_request, req) == (
        "invalid Offset (-2; expected -1 <= Offset <= MaxInt64)"
    )
    req.offset = -1
    assert fails(v.validate_read_request, req) == (
        "invalid EndOffset (-1; expected 0 or Offset <= EndOffset)"
    )
    req.end_offset = 100
    v.validate_read_request(req)
    req.offset = 101
    assert fails(v.validate_read_request, req) == (
        "invalid EndOffset (100; expected 0 or Offset <= EndOffset)"
    )
    req.end_offset = 101
    v.validate_read_request(req)
    req.end_offset = 0
    v.validate_read_request(req)


def test_read_response_cases() -> None:
    frag = pb.Fragment(
        journal="/bad/name", begin=1234567890, end=2345678901, compression_codec=pb.SNAPPY
    )
    resp = pb.ReadResponse(
        status=9101,  # type: ignore[arg-type]
        header=bad_header(),
        offset=1234,
        write_head=5678,
        fragment=frag,
        fragment_url=":/bad/url",
    )
    assert fails(v.validate_read_response, resp).startswith("Status: invalid status")
    resp.status = pb.OK
    assert fails(v.validate_read_response, resp).startswith("Header.Etcd: invalid ClusterId")
    resp.header.etcd.cluster_id = 12
    assert fails(v.validate_read_response, resp) == (
        "Fragment.Journal: cannot begin with '/' (/bad/name)"
    )
    resp.fragment.journal = "a/journal"
    assert fails(v.validate_read_response, resp) == (
        "invalid Offset (1234; expected 1234567890 <= offset < 2345678901)"
    )
    resp.offset = 1234567891
    assert fails(v.validate_read_response, resp) == (
        "invalid WriteHead (5678; expected >= 2345678901)"
    )
    resp.write_head = 2345678901
    assert fails(v.validate_read_response, resp) == (
        'FragmentUrl: parse ":/bad/url": missing protocol scheme'
    )
    resp.fragment_url = "http://foo"
    v.validate_read_response(resp)

    resp.ClearField("fragment")
    resp.write_head = -1
    assert fails(v.validate_read_response, resp) == "invalid WriteHead (-1; expected >= 0)"
    resp.write_head = 1234
    assert fails(v.validate_read_response, resp) == (
        "unexpected Offset without Fragment or Content (1234567891)"
    )
    resp.offset = 0
    assert fails(v.validate_read_response, resp) == (
        "unexpected FragmentUrl without Fragment (http://foo)"
    )
    resp.fragment_url = ""
    v.validate_read_response(resp)

    chunk = pb.ReadResponse(status=pb.WRONG_ROUTE, content=b"foo", write_head=1)
    assert fails(v.validate_read_response, chunk) == "unexpected Status with Content (WRONG_ROUTE)"
    chunk.status = pb.OK
    assert fails(v.validate_read_response, chunk) == "unexpected WriteHead with Content"
    chunk.write_head = 0
    v.validate_read_response(chunk)


def test_append_request_cases() -> None:
    bad = pb.LabelSet(labels=[pb.Label(name="inv alid")])
    req = pb.AppendRequest(
        header=bad_header(),
        journal="/bad",
        offset=-1,
        content=b"foo",
        check_registers=pb.LabelSelector(include=bad),
        union_registers=bad,
        subtract_registers=bad,
        suspend=12345,  # type: ignore[arg-type]
    )
    steps: list[tuple[str, Callable[[], None]]] = [
        (
            "Header.Etcd: invalid ClusterId (expected != 0)",
            lambda: setattr(req.header.etcd, "cluster_id", 12),
        ),
        ("Journal: cannot begin with '/' (/bad)", lambda: setattr(req, "journal", "good")),
        ("invalid Offset (-1; expected >= 0)", lambda: setattr(req, "offset", 100)),
        ("unexpected Content", lambda: setattr(req, "content", b"")),
        (
            "CheckRegisters.Include.Labels[0].Name: not a valid token (inv alid)",
            lambda: req.ClearField("check_registers"),
        ),
        (
            "UnionRegisters.Labels[0].Name: not a valid token (inv alid)",
            lambda: req.ClearField("union_registers"),
        ),
        (
            "SubtractRegisters.Labels[0].Name: not a valid token (inv alid)",
            lambda: req.ClearField("subtract_registers"),
        ),
        (
            "Suspend: invalid Suspend variant (12345)",
            lambda: setattr(req, "suspend", pb.AppendRequest.SUSPEND_NOW),
        ),
    ]
    for message, fix in steps:
        assert fails(v.validate_append_request, req) == message
        fix()
    v.validate_append_request(req)

    chunk = pb.AppendRequest(
        header=pb.Header(),
        do_not_proxy=True,
        offset=1,
        check_registers=pb.LabelSelector(),
        union_registers=pb.LabelSet(),
        subtract_registers=pb.LabelSet(),
        suspend=pb.AppendRequest.SUSPEND_NOW,
        content=b"data",
    )
    for message, field in [
        ("unexpected Header", "header"),
        ("unexpected DoNotProxy", "do_not_proxy"),
        ("unexpected Offset", "offset"),
        ("unexpected CheckRegisters", "check_registers"),
        ("unexpected UnionRegisters", "union_registers"),
        ("unexpected SubtractRegisters", "subtract_registers"),
        ("unexpected Suspend (SUSPEND_NOW; expected SUSPEND_RESUMED)", "suspend"),
    ]:
        assert fails(v.validate_append_request, chunk, first=False) == message
        chunk.ClearField(field)
    v.validate_append_request(chunk, first=False)
    v.validate_append_request(pb.AppendRequest(), first=False)  # The commit chunk.
    assert fails(v.validate_append_request, pb.AppendRequest()).startswith(
        "Journal: invalid length"
    )


def test_append_response_cases() -> None:
    resp = pb.AppendResponse(status=9101, header=bad_header())  # type: ignore[arg-type]
    assert fails(v.validate_append_response, resp).startswith("Status: invalid status")
    resp.status = pb.OK
    assert fails(v.validate_append_response, resp).startswith("Header.Etcd: invalid ClusterId")
    resp.header.etcd.cluster_id = 12
    assert fails(v.validate_append_response, resp) == "expected Commit"
    resp.commit.CopyFrom(pb.Fragment(journal="/bad/name", compression_codec=pb.NONE))
    assert fails(v.validate_append_response, resp) == "expected Registers"
    resp.registers.CopyFrom(pb.LabelSet(labels=[pb.Label(name="in valid")]))
    assert (
        fails(v.validate_append_response, resp)
        == "Commit.Journal: cannot begin with '/' (/bad/name)"
    )
    resp.commit.journal = "good/name"
    assert fails(v.validate_append_response, resp) == (
        "Registers.Labels[0].Name: not a valid token (in valid)"
    )
    resp.registers.labels[0].name = "valid"
    v.validate_append_response(resp)


def test_replicate_cases() -> None:
    req = pb.ReplicateRequest(
        deprecated_journal="bad",
        proposal=pb.Fragment(journal="/bad/name", compression_codec=pb.NONE),
        content=b"foo",
        content_delta=100,
        header=bad_header(),
    )
    assert fails(v.validate_replicate_request, req).startswith("Header.Etcd: invalid ClusterId")
    req.header.etcd.cluster_id = 12
    assert fails(v.validate_replicate_request, req) == "expected Acknowledge with Header"
    req.acknowledge = True
    assert fails(v.validate_replicate_request, req) == (
        "Proposal.Journal: cannot begin with '/' (/bad/name)"
    )
    req.proposal.journal = "journal"
    req.registers.CopyFrom(pb.LabelSet(labels=[pb.Label(name="in valid")]))
    assert fails(v.validate_replicate_request, req) == (
        "Registers.Labels[0].Name: not a valid token (in valid)"
    )
    req.registers.labels[0].name = "valid"
    assert fails(v.validate_replicate_request, req) == "unexpected Content with Proposal (len 3)"
    req.content = b""
    assert fails(v.validate_replicate_request, req) == "unexpected ContentDelta with Proposal (100)"
    req.content_delta = 0
    assert fails(v.validate_replicate_request, req) == (
        "DeprecatedJournal and Proposal.Journal mismatch (bad vs journal)"
    )
    req.deprecated_journal = "journal"
    v.validate_replicate_request(req)

    req.ClearField("proposal")
    req.content_delta = -1
    assert fails(v.validate_replicate_request, req) == "expected Content or Proposal"
    req.content = b"foo"
    assert fails(v.validate_replicate_request, req) == "invalid ContentDelta (-1; expected >= 0)"
    req.content_delta = 100
    assert fails(v.validate_replicate_request, req) == "unexpected Header with Content"
    req.ClearField("header")
    assert fails(v.validate_replicate_request, req) == "unexpected Registers with Content"
    req.ClearField("registers")
    assert fails(v.validate_replicate_request, req) == "unexpected Acknowledge with Content"
    req.acknowledge = False
    assert fails(v.validate_replicate_request, req) == "unexpected DeprecatedJournal with Content"
    req.deprecated_journal = ""
    v.validate_replicate_request(req)

    resp = pb.ReplicateResponse(status=pb.WRONG_ROUTE)
    assert fails(v.validate_replicate_response, resp) == "expected Header"
    resp.header.CopyFrom(bad_header())
    assert fails(v.validate_replicate_response, resp).startswith("Header.Etcd: invalid ClusterId")
    resp.header.etcd.cluster_id = 1
    v.validate_replicate_response(resp)
    resp = pb.ReplicateResponse(status=pb.PROPOSAL_MISMATCH)
    assert fails(v.validate_replicate_response, resp) == "expected Fragment"
    resp.fragment.CopyFrom(pb.Fragment(journal="a/journal", compression_codec=pb.NONE))
    assert fails(v.validate_replicate_response, resp) == "expected Registers"
    resp.registers.SetInParent()
    v.validate_replicate_response(resp)
    resp.status = pb.OK
    assert fails(v.validate_replicate_response, resp) == "unexpected Fragment"


def test_whole_replicate_response() -> None:
    ok = pb.ReplicateResponse(status=pb.OK)
    mismatch = pb.ReplicateResponse(
        status=pb.PROPOSAL_MISMATCH,
        fragment=pb.Fragment(journal="a/journal", compression_codec=pb.NONE),
        registers=pb.LabelSet(),
    )
    v.validate_whole_replicate_response(ppb.WholeReplicateResponse(responses=[ok, ok]))
    v.validate_whole_replicate_response(ppb.WholeReplicateResponse(responses=[ok, mismatch]))
    v.validate_whole_replicate_response(ppb.WholeReplicateResponse(responses=[ok], refused="x"))
    resp = ppb.WholeReplicateResponse(responses=[mismatch, ok])
    assert fails(v.validate_whole_replicate_response, resp) == (
        "Responses[0]: not OK, yet followed by more"
    )
    resp = ppb.WholeReplicateResponse(responses=[mismatch], refused="why")
    assert fails(v.validate_whole_replicate_response, resp) == (
        "unexpected Refused after a response that is not OK"
    )
    resp = ppb.WholeReplicateResponse(responses=[ok, pb.ReplicateResponse(status=pb.WRONG_ROUTE)])
    assert fails(v.validate_whole_replicate_response, resp) == "Responses[1]: expected Header"


def test_list_request_and_response() -> None:
    req = pb.ListRequest(
        selector=pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="a b")]))
    )
    assert (
        fails(v.validate_list_request, req)
        == "Selector.Include.Labels[0].Name: not a valid token (a b)"
    )
    req.selector.include.CopyFrom(ls("prefix", "foo/bar"))
    assert fails(v.validate_list_request, req) == (
        "Selector.Include.Labels[\"prefix\"]: expected trailing '/' (foo/bar)"
    )
    req.selector.include.CopyFrom(ls("prefix", "foo/"))
    req.selector.exclude.CopyFrom(ls("prefix", "foo/baz"))
    assert fails(v.validate_list_request, req) == (
        "Selector.Exclude.Labels[\"prefix\"]: expected trailing '/' (foo/baz)"
    )
    req.selector.exclude.CopyFrom(ls("prefix", "foo/baz/"))
    v.validate_list_request(req)

    header = bad_header()
    header.etcd.cluster_id = 1
    resp = pb.ListResponse(
        status=9101,  # type: ignore[arg-type]
        header=bad_header(),
        journals=[pb.ListResponse.Journal(spec=good_spec(), route=pb.Route(primary=0))],
    )
    resp.journals[0].spec.name = "bad name"
    assert fails(v.validate_list_response, resp) == "Status: invalid status (9101)"
    resp.status = pb.OK
    assert fails(v.validate_list_response, resp).startswith("Header.Etcd: invalid ClusterId")
    resp.header.CopyFrom(header)
    assert fails(v.validate_list_response, resp) == (
        "Journals[0].Spec.Name: not a valid token (bad name)"
    )
    resp.journals[0].spec.name = "a/journal"
    assert fails(v.validate_list_response, resp) == (
        "Journals[0]: invalid ModRevision (0; expected > 0)"
    )
    resp.journals[0].mod_revision = 1
    assert fails(v.validate_list_response, resp).startswith("Journals[0].Route: invalid Primary")
    resp.journals[0].route.primary = -1
    v.validate_list_response(resp)


def minimal_spec(name: str = "a/journal") -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=1024,
            compression_codec=pb.NONE,
            refresh_interval=Duration(seconds=60),
            retention=Duration(seconds=3600),
        ),
    )


def test_apply_request_cases() -> None:
    req = pb.ApplyRequest(
        changes=[
            pb.ApplyRequest.Change(
                expect_mod_revision=-2, upsert=pb.JournalSpec(name="a/journal"), delete="a/journal"
            ),
            pb.ApplyRequest.Change(expect_mod_revision=0, delete="a/journal invalid name"),
            pb.ApplyRequest.Change(expect_mod_revision=1),
        ]
    )
    assert fails(v.validate_apply_request, req) == (
        "Changes[0]: both Upsert and Delete are set (expected exactly one)"
    )
    req.changes[0].delete = ""
    assert fails(v.validate_apply_request, req).startswith("Changes[0].Upsert: invalid Replication")
    req.changes[0].upsert.CopyFrom(minimal_spec())
    assert fails(v.validate_apply_request, req) == (
        "Changes[0]: invalid ExpectModRevision (-2; expected >= 0 or -1)"
    )
    req.changes[0].expect_mod_revision = 0
    assert fails(v.validate_apply_request, req) == (
        "Changes[1].Delete: not a valid token (a/journal invalid name)"
    )
    req.changes[1].delete = "a/journal"
    assert fails(v.validate_apply_request, req) == (
        "Changes[1]: invalid ExpectModRevision (0; expected > 0 or -1)"
    )
    req.changes[1].expect_mod_revision = 1
    assert fails(v.validate_apply_request, req) == (
        "Changes[2]: neither Upsert nor Delete are set (expected exactly one)"
    )
    req.changes[2].delete = "other/journal"
    v.validate_apply_request(req)
    req.changes[1].expect_mod_revision = -1
    req.changes[0].expect_mod_revision = -1
    v.validate_apply_request(req)


@pytest.mark.parametrize(
    ("field", "seconds", "nanos", "expect"),
    [
        # Gazette's spec fields are Go time.Durations (gogoproto stdduration): one it can't
        # convert fails the decode of the whole message (checked with go.gazette.dev/core
        # v0.103.0). Stored by pygazette, such a spec was dropped by Gazette brokers and
        # failed gazctl's whole List.
        ("refresh_interval", 0, 2_000_000_000, "nanos out of range"),
        ("refresh_interval", 61, -5, "seconds and nanos have different signs"),
        ("flush_interval", 3600, 1_000_000_000, "nanos out of range"),
        ("retention", 10**10, 0, "out of range for a Go time.Duration"),
        ("retention", 9223372036, 854775808, "out of range for a Go time.Duration"),
        ("retention", -9223372036, -854775809, "out of range for a Go time.Duration"),
        ("retention", 9223372036, 854775807, ""),
        ("retention", -9223372036, -854775808, ""),
    ],
)
def test_apply_request_durations_gazette_can_decode(
    field: str, seconds: int, nanos: int, expect: str
) -> None:
    spec = minimal_spec()
    getattr(spec.fragment, field).CopyFrom(Duration(seconds=seconds, nanos=nanos))
    req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=-1)])
    if not expect:
        v.validate_apply_request(req)
        return
    name = "".join(part.capitalize() for part in field.split("_"))
    err = fails(v.validate_apply_request, req)
    assert err.startswith(f"Changes[0].Upsert.Fragment.{name}: ") and expect in err, err


def test_fragments_request_and_response() -> None:
    req = pb.FragmentsRequest(
        header=bad_header(),
        journal="/bad",
        signatureTTL=Duration(),
        begin_mod_time=10,
        end_mod_time=5,
        next_page_token=-1,
        page_limit=-1,
    )
    assert fails(v.validate_fragments_request, req).startswith("Header.Etcd: invalid ClusterId")
    req.header.etcd.cluster_id = 12
    assert fails(v.validate_fragments_request, req) == "Journal: cannot begin with '/' (/bad)"
    req.journal = "good"
    assert fails(v.validate_fragments_request, req) == "invalid EndModTime (5 must be after 10)"
    req.end_mod_time = 0
    assert fails(v.validate_fragments_request, req) == "invalid NextPageToken (-1; must be >= 0)"
    req.next_page_token = 10
    assert fails(v.validate_fragments_request, req) == (
        "invalid PageLimit (-1; must be >= 0 and <= 10000)"
    )
    req.page_limit = 10
    assert fails(v.validate_fragments_request, req) == "invalid SignatureTTL (0s; must be > 0s)"
    req.signatureTTL.seconds = 1
    v.validate_fragments_request(req)
    req.ClearField("signatureTTL")
    v.validate_fragments_request(req)

    header = bad_header()
    resp = pb.FragmentsResponse(
        status=9101,  # type: ignore[arg-type]
        header=header,
        fragments=[
            pb.FragmentsResponse._Fragment(
                spec=pb.Fragment(journal="in valid", compression_codec=pb.NONE),
                signed_url=":gar: :bage:",
            )
        ],
    )
    assert fails(v.validate_fragments_response, resp) == "Status: invalid status (9101)"
    resp.status = pb.OK
    assert fails(v.validate_fragments_response, resp).startswith("Header.Etcd: invalid ClusterId")
    resp.header.etcd.cluster_id = 1234
    assert fails(v.validate_fragments_response, resp) == (
        "Fragments[0].Spec.Journal: not a valid token (in valid)"
    )
    resp.fragments[0].spec.journal = "valid/name"
    assert fails(v.validate_fragments_response, resp) == (
        'Fragments[0].SignedUrl: parse ":gar: :bage:": missing protocol scheme'
    )
    resp.fragments[0].signed_url = "http://host/path"
    v.validate_fragments_response(resp)
    resp.fragments[0].signed_url = ""
    v.validate_fragments_response(resp)


def test_fragment_store_health() -> None:
    assert (
        fails(
            v.validate_fragment_store_health_request,
            pb.FragmentStoreHealthRequest(fragment_store="s3://b"),
        )
        == "FragmentStore: path component doesn't end in '/' ()"
    )
    v.validate_fragment_store_health_request(
        pb.FragmentStoreHealthRequest(fragment_store="s3://b/")
    )
    header = bad_header()
    header.etcd.cluster_id = 1
    v.validate_fragment_store_health_response(
        pb.FragmentStoreHealthResponse(status=pb.FRAGMENT_STORE_UNHEALTHY, header=header)
    )
