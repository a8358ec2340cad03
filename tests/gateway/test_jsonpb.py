"""`gateway.jsonpb` against answers recorded from Gazette v0.103's broker (grpc-gateway over
gogo jsonpb): the messages Go's decoder gives for malformed requests, what it accepts, and
bodies it writes. The same comparisons run live against Gazette's binary in
tests/interop/test_json_api_vs_gazette.py; these need no Go."""

from __future__ import annotations

import pytest

from pygazette.gateway.jsonpb import JsonError, decode, marshal
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb

# A ReadRequest body and what Gazette's gateway answered: its 400 message, or None where it
# accepted the body (the request then went to the broker).
RECORDED: list[tuple[bytes, str | None]] = [
    (b"x", "invalid character 'x' looking for beginning of value"),
    (b"{", "unexpected EOF"),
    (b"[]", "json: cannot unmarshal array into Go value of type map[string]json.RawMessage"),
    (b'"str"x', "json: cannot unmarshal string into Go value of type map[string]json.RawMessage"),
    (b"12x", "json: cannot unmarshal number into Go value of type map[string]json.RawMessage"),
    (b"null", None),
    (b"", None),
    (b"  \n", None),
    (b'{"journal":5}', "json: cannot unmarshal number into Go value of type protocol.Journal"),
    (b'{"offset":"abc"}', "invalid character 'a' looking for beginning of value"),
    (b'{"offset":1.5}', "json: cannot unmarshal number 1.5 into Go value of type int64"),
    (
        b'{"offset":99999999999999999999}',
        "json: cannot unmarshal number 99999999999999999999 into Go value of type int64",
    ),
    (b'{"offset":"-"}', "invalid character ' ' in numeric literal"),
    (b'{"offset":"1e"}', "invalid character ' ' in exponent of numeric literal"),
    (b'{"offset":"1 2"}', "invalid character '2' after top-level value"),
    (b'{"offset":""}', "unexpected end of JSON input"),
    (b'{"offset":"tr"}', "invalid character ' ' in literal true (expecting 'u')"),
    (b'{"offset":"\\u0031"}', "invalid character '\\\\' looking for beginning of value"),
    (b'{"offset":" 5 "}', None),
    (b'{"offset":-0}', None),
    (b'{"offset":"-0"}', None),
    (b'{"offset":1e3}', "json: cannot unmarshal number 1e3 into Go value of type int64"),
    (b'{"offset":true}', "json: cannot unmarshal bool into Go value of type int64"),
    (b'{"offset":{}}', "json: cannot unmarshal object into Go value of type int64"),
    (b'{"block":"yes"}', "json: cannot unmarshal string into Go value of type bool"),
    (b'{"block":1}', "json: cannot unmarshal number into Go value of type bool"),
    (b'{"block":null}', None),
    (
        b'{"header":5}',
        "json: cannot unmarshal number into Go value of type map[string]json.RawMessage",
    ),
    (b'{"header":null}', None),
    (
        b'{"header":[]}',
        "json: cannot unmarshal array into Go value of type map[string]json.RawMessage",
    ),
    (b'{"a":}', "invalid character '}' looking for beginning of value"),
    (b'{"a" 1}', "invalid character '1' after object key"),
    (b'{"a":1 "b":2}', "invalid character '\"' after object key:value pair"),
    (b"{1:2}", "invalid character '1' looking for beginning of object key string"),
    (b"[1 2]", "invalid character '2' after array element"),
    (b'{"a":"\\x"}', "invalid character 'x' in string escape code"),
    (b'{"a":"\\u12g4"}', "invalid character 'g' in \\u hexadecimal character escape"),
    (b'{"a":-x}', "invalid character 'x' in numeric literal"),
    (b'{"a":1.x}', "invalid character 'x' after decimal point in numeric literal"),
    (b'{"a":tru}', "invalid character '}' in literal true (expecting 'e')"),
    (b'{"a":nul}', "invalid character '}' in literal null (expecting 'l')"),
    (b"{\"a\":'x'}", "invalid character '\\'' looking for beginning of value"),
    (b"\xc3\xa9", "invalid character 'Ã' looking for beginning of value"),
    (b'{"a":"\x01"}', "invalid character '\\x01' in string literal"),
    (b'{"a":\xff}', "invalid character 'ÿ' looking for beginning of value"),
    (b"\x7f", "invalid character '\\x7f' looking for beginning of value"),
    (b'{"a":[1,]}', "invalid character ']' looking for beginning of value"),
    (b'{"a":{"b":1,}}', "invalid character '}' looking for beginning of object key string"),
    (b'{"a"', "unexpected EOF"),
    (b'{"a":', "unexpected EOF"),
    (b'{"a":"b', "unexpected EOF"),
    (b'{"a":"\\', "unexpected EOF"),
    (b'{"a":"\\u12', "unexpected EOF"),
    (b'{"a":-', "unexpected EOF"),
    (b'{"a":1.', "unexpected EOF"),
    (b'{"a":1e+', "unexpected EOF"),
    (b'{"a":t', "unexpected EOF"),
    (
        b'{"header":{"etcd":{"revision":"x"}}}',
        "invalid character 'x' looking for beginning of value",
    ),
    (
        b'{"header":{"processId":"x"}}',
        "json: cannot unmarshal string into Go value of type map[string]json.RawMessage",
    ),
    (
        b'{"header":{"route":{"members":5}}}',
        "json: cannot unmarshal number into Go value of type []json.RawMessage",
    ),
    (
        b'{"header":{"route":{"members":[5]}}}',
        "json: cannot unmarshal number into Go value of type map[string]json.RawMessage",
    ),
    (b'{"header":{"route":{"primary":"7x"}}}', "invalid character 'x' after top-level value"),
    (
        b'{"header":{"route":{"primary":4294967296}}}',
        "json: cannot unmarshal number 4294967296 into Go value of type int32",
    ),
    (
        b'{"header":{"route":{"primary":2147483648}}}',
        "json: cannot unmarshal number 2147483648 into Go value of type int32",
    ),
    (
        b'{"header":{"etcd":{"clusterId":-1}}}',
        "json: cannot unmarshal number -1 into Go value of type uint64",
    ),
    (
        b'{"header":{"etcd":{"clusterId":"18446744073709551616"}}}',
        "json: cannot unmarshal number 18446744073709551616 into Go value of type uint64",
    ),
    (b'{"header":{"etcd":{"clusterId":"18446744073709551615"}},"journal":"a/b/c"}', None),
    (
        b'{"header":{"route":{"endpoints":[5]}}}',
        "json: cannot unmarshal number into Go value of type protocol.Endpoint",
    ),
    (
        b'{"header":{"route":{"endpoints":"x"}}}',
        "json: cannot unmarshal string into Go value of type []json.RawMessage",
    ),
    (
        b'{"journal":"a/b/c","metadata_only":"true"}',
        "json: cannot unmarshal string into Go value of type bool",
    ),
    (b'{"journal":"\\ud800"}', None),
    (
        b'{"beginModTime":"9223372036854775808"}',
        "json: cannot unmarshal number 9223372036854775808 into Go value of type int64",
    ),
    (b'{"beginModTime":"-9223372036854775808","journal":"a/b/c"}', None),
]


@pytest.mark.parametrize(("body", "message"), RECORDED)
def test_decoding_fails_as_gazettes(body: bytes, message: str | None) -> None:
    try:
        decode(body, pb.ReadRequest())
        got = None
    except JsonError as exc:
        got = str(exc)
    assert got == message


def test_decoded_values() -> None:
    req = pb.ReadRequest()
    body = (
        b'{"journal":"a/b","journal":"a/c","offset":" 5 ","end_offset":"9","endOffset":10,'
        b'"metadataOnly":true,"block":null,"header":{"etcd":{"clusterId":"18446744073709551615"}},'
        b'"unknown":[1,{"x":2}]} and more'
    )
    decode(body, req)
    assert req == pb.ReadRequest(
        journal="a/c",  # The last of a repeated key, as Go's map.
        offset=5,
        end_offset=10,  # camelCase wins over orig_name.
        metadata_only=True,
        header=pb.Header(etcd=pb.Header.Etcd(cluster_id=(1 << 64) - 1)),
    )
    stat = cpb.StatRequest()
    decode(b'{"shard":"s","readThrough":{"a/b":"7","c/d":8},"extension":"AAE="}', stat)
    assert dict(stat.read_through) == {"a/b": 7, "c/d": 8} and stat.extension == b"\x00\x01"
    listing = pb.ListRequest()
    decode(
        b'{"selector":{"include":{"labels":[{"name":"x","prefix":true}]}},"pageLimit":5}', listing
    )
    assert listing.selector.include.labels[0].prefix and listing.page_limit == 0
    with pytest.raises(JsonError, match=r'unknown value "NOPE" for enum consumer\.Status'):
        decode(b'{"status":"NOPE"}', cpb.StatResponse())


def test_marshalled_as_gazettes() -> None:
    """A ListResponse and Read responses, against Gazette's bytes for the same values."""
    spec = pb.JournalSpec(name="examples/a=b%2C+c", replication=1, flags=4, max_append_rate=1000)
    spec.labels.labels.add(name="app.gazette.dev/message-type", value="Foo")
    spec.labels.labels.add(name="content-type", value="application/x-ndjson")
    frag = spec.fragment
    frag.length, frag.compression_codec = 1048576, pb.SNAPPY
    frag.stores.append("file:///")
    frag.refresh_interval.FromSeconds(30)
    frag.retention.FromMilliseconds(5400500)
    frag.flush_interval.FromMilliseconds(90500)
    frag.path_postfix_template = 'date={{.Spool.FirstAppendTime.Format "2006-01-02"}}'
    resp = pb.ListResponse(status=pb.OK)
    resp.header.process_id.zone, resp.header.process_id.suffix = "local", "interop-broker"
    resp.header.route.primary = -1
    resp.header.etcd.cluster_id = 15118495548433857066
    resp.header.etcd.member_id = 13668033151171901709
    resp.header.etcd.revision, resp.header.etcd.raft_term = 5, 2
    journal = resp.journals.add(spec=spec, mod_revision=3, create_revision=3)
    journal.route.members.add(zone="local", suffix="interop-broker")
    journal.route.endpoints.append("http://127.0.0.1:28080")
    assert marshal(resp) == (
        b'{"status":"OK","header":{"processId":{"zone":"local","suffix":"interop-broker"},'
        b'"route":{"members":[],"primary":-1,"endpoints":[]},"etcd":{"clusterId":'
        b'"15118495548433857066","memberId":"13668033151171901709","revision":"5","raftTerm":"2"}},'
        b'"journals":[{"spec":{"name":"examples/a=b%2C+c","replication":1,"labels":{"labels":'
        b'[{"name":"app.gazette.dev/message-type","value":"Foo","prefix":false},{"name":'
        b'"content-type","value":"application/x-ndjson","prefix":false}]},"fragment":{"length":'
        b'"1048576","compressionCodec":"SNAPPY","stores":["file:///"],"refreshInterval":"30s",'
        b'"retention":"5400.500s","flushInterval":"90.500s","pathPostfixTemplate":"date={{.Spool.'
        b'FirstAppendTime.Format \\"2006-01-02\\"}}"},"flags":4,"maxAppendRate":"1000","suspend":'
        b'null},"modRevision":"3","route":{"members":[{"zone":"local","suffix":"interop-broker"}],'
        b'"primary":0,"endpoints":["http://127.0.0.1:28080"]},"createRevision":"3"}]}'
    )
    read = pb.ReadResponse(status=pb.OK, write_head=12)
    read.fragment.journal, read.fragment.end = "examples/plain", 12
    read.fragment.sum.part1, read.fragment.sum.part2 = 6378573211252191921, 85456597740378290
    read.fragment.sum.part3 = 2077283275
    read.fragment.compression_codec = pb.NONE
    assert marshal(read) == (
        b'{"status":"OK","header":null,"offset":"0","writeHead":"12","fragment":{"journal":'
        b'"examples/plain","begin":"0","end":"12","sum":{"part1":"6378573211252191921","part2":'
        b'"85456597740378290","part3":2077283275},"compressionCodec":"NONE","backingStore":"",'
        b'"modTime":"0","pathPostfix":""},"fragmentUrl":"","content":null}'
    )
    stat = cpb.StatResponse(status=cpb.SHARD_NOT_FOUND, read_through={"b<": 2, "a": 1})
    assert marshal(stat).startswith(b'{"status":"SHARD_NOT_FOUND","header":{"processId":')
    assert b'"readThrough":{"a":"1","b\\u003c":"2"},"publishAt":{},"extension":null}' in marshal(
        stat
    )
