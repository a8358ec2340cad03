"""Wire facts of the consumer and recovery-log protocols, checked against Gazette.

Two kinds of check:

- When Gazette's module source is in the Go module cache, its .proto files are parsed
  and every message, field (name, number, label, type), enum value and RPC is compared
  with our generated descriptors, both ways (nothing missing, nothing extra).
- Always: key field numbers are hard-coded, and golden encodings (built by hand, tag by
  tag) are compared with what our stubs serialize.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from google.protobuf import descriptor
from google.protobuf.duration_pb2 import Duration

from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb

GAZETTE_VERSION = "v0.103.0"


def gazette_root() -> Path | None:
    candidates = []
    if os.environ.get("GOMODCACHE"):
        candidates.append(Path(os.environ["GOMODCACHE"]))
    if os.environ.get("GOPATH"):
        candidates.append(Path(os.environ["GOPATH"]) / "pkg/mod")
    candidates += [Path.home() / "go/pkg/mod", Path("/root/go/pkg/mod")]
    for base in candidates:
        root = base / f"go.gazette.dev/core@{GAZETTE_VERSION}"
        if (root / "consumer/protocol/protocol.proto").is_file():
            return root
    return None


# ---------------------------------------------------------------------------------------
# A small .proto parser: enough of proto3 for Gazette's files (messages, nested messages
# and enums, maps, repeated fields, services; options are skipped).


@dataclass
class ProtoFile:
    package: str = ""
    # full message name (without package, e.g. "ShardSpec.Source") ->
    #   field name -> (number, label, type as written)
    messages: dict[str, dict[str, tuple[int, str, str]]] = field(default_factory=dict)
    enums: dict[str, dict[str, int]] = field(default_factory=dict)
    # service -> rpc -> (input, output, client streaming, server streaming)
    services: dict[str, dict[str, tuple[str, str, bool, bool]]] = field(default_factory=dict)


_TOKEN = re.compile(r'map\s*<[^>]*>|"(?:[^"\\]|\\.)*"|[\w.]+|[{};=()<>,-]')


def _tokens(text: str) -> Iterator[str]:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    # Field options: `[ (gogoproto.x) = "..." , ... ]`. Their strings hold no ']'.
    text = re.sub(r'\[(?:[^\]"]|"(?:[^"\\]|\\.)*")*\]', " ", text)
    for m in _TOKEN.finditer(text):
        yield re.sub(r"\s+", "", m.group(0))


def parse_proto(text: str) -> ProtoFile:
    out = ProtoFile()
    toks = list(_tokens(text))
    stack: list[tuple[str, str]] = []  # (kind, full name)
    i = 0

    def skip_statement() -> None:
        nonlocal i
        while toks[i] != ";":
            i += 1
        i += 1

    while i < len(toks):
        t = toks[i]
        kind, scope = stack[-1] if stack else ("file", "")
        if t in ("syntax", "import", "option", "reserved"):
            skip_statement()
        elif t == "package":
            out.package = toks[i + 1]
            skip_statement()
        elif t == ";":
            i += 1
        elif t == "}":
            stack.pop()
            i += 1
        elif t in ("message", "enum", "service") and toks[i + 2] == "{":
            name = f"{scope}.{toks[i + 1]}" if scope else toks[i + 1]
            stack.append((t, name))
            if t == "message":
                out.messages[name] = {}
            elif t == "enum":
                out.enums[name] = {}
            else:
                out.services[name] = {}
            i += 3
        elif kind == "enum":
            assert toks[i + 1] == "=", toks[i : i + 4]
            number = -int(toks[i + 3]) if toks[i + 2] == "-" else int(toks[i + 2])
            out.enums[scope][t] = number
            skip_statement()
        elif kind == "service":
            assert t == "rpc", toks[i : i + 10]
            # rpc Name ( [stream] In ) returns ( [stream] Out ) ; | { }
            j = i + 3
            cstream = toks[j] == "stream"
            j += cstream
            req = toks[j]
            j += 4  # In ) returns (
            sstream = toks[j] == "stream"
            j += sstream
            out.services[scope][toks[i + 1]] = (req, toks[j], cstream, sstream)
            i = j + 2
            if toks[i] == "{":
                while toks[i] != "}":
                    i += 1
                i += 1
        elif kind == "message":
            label = ""
            if t in ("repeated", "optional"):
                label, i = t, i + 1
            ftype, fname = toks[i], toks[i + 1]
            assert toks[i + 2] == "=", toks[i : i + 4]
            out.messages[scope][fname] = (int(toks[i + 3]), label, ftype)
            skip_statement()
        else:
            raise AssertionError(f"unexpected token {t!r} in {kind} {scope!r}")
    assert not stack, stack
    return out


# ---------------------------------------------------------------------------------------
# Rendering our descriptors in the same terms.

_SCALARS = {
    descriptor.FieldDescriptor.TYPE_DOUBLE: "double",
    descriptor.FieldDescriptor.TYPE_FLOAT: "float",
    descriptor.FieldDescriptor.TYPE_INT64: "int64",
    descriptor.FieldDescriptor.TYPE_UINT64: "uint64",
    descriptor.FieldDescriptor.TYPE_INT32: "int32",
    descriptor.FieldDescriptor.TYPE_FIXED64: "fixed64",
    descriptor.FieldDescriptor.TYPE_FIXED32: "fixed32",
    descriptor.FieldDescriptor.TYPE_BOOL: "bool",
    descriptor.FieldDescriptor.TYPE_STRING: "string",
    descriptor.FieldDescriptor.TYPE_BYTES: "bytes",
    descriptor.FieldDescriptor.TYPE_UINT32: "uint32",
    descriptor.FieldDescriptor.TYPE_SFIXED32: "sfixed32",
    descriptor.FieldDescriptor.TYPE_SFIXED64: "sfixed64",
    descriptor.FieldDescriptor.TYPE_SINT32: "sint32",
    descriptor.FieldDescriptor.TYPE_SINT64: "sint64",
}


def _type_full_name(f: descriptor.FieldDescriptor) -> str:
    if f.message_type is not None:
        return f.message_type.full_name
    if f.enum_type is not None:
        return f.enum_type.full_name
    return _SCALARS[f.type]


def _is_map(f: descriptor.FieldDescriptor) -> bool:
    return f.message_type is not None and f.message_type.GetOptions().map_entry


def _resolve(gazette_type: str, package: str, scope: str, ours: str) -> bool:
    """Whether Gazette's written type name, seen from message `scope`, names `ours`."""
    if gazette_type in _SCALARS.values():
        return gazette_type == ours
    if "." in gazette_type and not gazette_type.split(".")[0][0].isupper():
        return ours == gazette_type  # Package-qualified, e.g. protocol.LabelSet.
    # Relative: proto scoping looks outward from the referencing message.
    parts = scope.split(".")
    candidates = [".".join([package, *parts[:n], gazette_type]) for n in range(len(parts), -1, -1)]
    return ours in candidates


def _walk(
    desc: descriptor.Descriptor, prefix: str = ""
) -> Iterator[tuple[str, descriptor.Descriptor]]:
    name = f"{prefix}.{desc.name}" if prefix else desc.name
    if not desc.GetOptions().map_entry:
        yield name, desc
    for nested in desc.nested_types:
        yield from _walk(nested, name)


def _our_messages(fd: descriptor.FileDescriptor) -> dict[str, descriptor.Descriptor]:
    return {n: d for top in fd.message_types_by_name.values() for n, d in _walk(top)}


def _our_enums(fd: descriptor.FileDescriptor) -> dict[str, dict[str, int]]:
    enums = {e.name: {v.name: v.number for v in e.values} for e in fd.enum_types_by_name.values()}
    for name, msg in _our_messages(fd).items():
        for e in msg.enum_types:
            enums[f"{name}.{e.name}"] = {v.name: v.number for v in e.values}
    return enums


def compare(gazette: ProtoFile, fd: descriptor.FileDescriptor) -> list[str]:
    problems: list[str] = []
    if gazette.package != fd.package:
        problems.append(f"package {fd.package!r} != Gazette's {gazette.package!r}")
    ours = _our_messages(fd)
    if set(ours) != set(gazette.messages):
        problems.append(f"messages differ: {sorted(set(ours) ^ set(gazette.messages))}")
    for name, gfields in gazette.messages.items():
        if name not in ours:
            continue
        ofields = {f.name: f for f in ours[name].fields}
        if set(ofields) != set(gfields):
            problems.append(f"{name}: fields differ: {sorted(set(ofields) ^ set(gfields))}")
        for fname, (number, label, gtype) in gfields.items():
            f = ofields.get(fname)
            if f is None:
                continue
            where = f"{name}.{fname}"
            if f.number != number:
                problems.append(f"{where}: number {f.number} != Gazette's {number}")
            if gtype.startswith("map<"):
                if not _is_map(f):
                    problems.append(f"{where}: not a map (Gazette: {gtype})")
                    continue
                gkey, gval = gtype[4:-1].split(",")
                assert f.message_type is not None
                entry = f.message_type.fields_by_name
                if not (
                    _resolve(gkey, fd.package, name, _type_full_name(entry["key"]))
                    and _resolve(gval, fd.package, name, _type_full_name(entry["value"]))
                ):
                    problems.append(f"{where}: map types differ from Gazette's {gtype}")
                continue
            repeated = bool(f.is_repeated)
            if repeated != (label == "repeated"):
                problems.append(f"{where}: repeated={repeated}, Gazette's label {label!r}")
            if not _resolve(gtype, fd.package, name, _type_full_name(f)):
                problems.append(f"{where}: type {_type_full_name(f)} != Gazette's {gtype}")
    if _our_enums(fd) != gazette.enums:
        problems.append(f"enums differ: ours {_our_enums(fd)}, Gazette's {gazette.enums}")
    services = {
        s.name: {
            m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
            for m in s.methods
        }
        for s in fd.services_by_name.values()
    }
    if services != gazette.services:
        problems.append(f"services differ: ours {services}, Gazette's {gazette.services}")
    return problems


GAZETTE = gazette_root()
needs_gazette = pytest.mark.skipif(GAZETTE is None, reason="Gazette source not in Go mod cache")


@needs_gazette
@pytest.mark.parametrize(
    ("gazette_path", "fd"),
    [
        ("consumer/protocol/protocol.proto", cpb.DESCRIPTOR),
        ("consumer/recoverylog/recorded_op.proto", rpb.DESCRIPTOR),
    ],
    ids=["consumer", "recoverylog"],
)
def test_matches_gazette_proto(gazette_path: str, fd: descriptor.FileDescriptor) -> None:
    assert GAZETTE is not None
    gazette = parse_proto((GAZETTE / gazette_path).read_text())
    assert gazette.messages
    assert compare(gazette, fd) == []


def test_parser_sees_differences() -> None:
    """The comparison is not vacuous: a renumbered, retyped or missing field is caught."""
    base = """
    syntax = "proto3"; package recoverylog;
    message Property { string path = 1 [(x.y) = "a,]b"]; string content = 2; }
    """
    fd = rpb.DESCRIPTOR
    parsed = parse_proto(base)
    assert parsed.messages["Property"] == {"path": (1, "", "string"), "content": (2, "", "string")}
    problems = compare(parsed, fd)
    # Our file has more messages than this fragment, and nothing else differs.
    assert len(problems) == 1 and problems[0].startswith("messages differ")
    for bad, want in [
        (base.replace("content = 2", "content = 3"), "Property.content: number 2 != Gazette's 3"),
        (base.replace("string content", "bytes content"), "Property.content: type string"),
        (base.replace("string content = 2;", ""), "Property: fields differ: ['content']"),
        (base.replace("string content", "repeated string content"), "Property.content: repeat"),
    ]:
        assert any(p.startswith(want) for p in compare(parse_proto(bad), fd)), want


# ---------------------------------------------------------------------------------------
# Always-on facts: method paths, key numbers, enum values and golden encodings.


def test_shard_service_paths() -> None:
    service = cpb.DESCRIPTOR.services_by_name["Shard"]
    assert service.full_name == "consumer.Shard"
    assert [m.name for m in service.methods] == ["Stat", "List", "Apply", "GetHints", "Unassign"]
    assert all(not m.client_streaming and not m.server_streaming for m in service.methods)
    assert cpb.DESCRIPTOR.package == "consumer" and rpb.DESCRIPTOR.package == "recoverylog"


def _number(msg: type, path: str) -> int:
    desc = msg.DESCRIPTOR  # type: ignore[attr-defined]
    *nested, name = path.split(".")
    for n in nested:
        desc = desc.nested_types_by_name[n]
    return int(desc.fields_by_name[name].number)


@pytest.mark.parametrize(
    ("msg", "path", "number"),
    [
        (cpb.ShardSpec, "Source.min_offset", 3),
        (cpb.ShardSpec, "hint_backups", 5),
        (cpb.ShardSpec, "max_txn_duration", 6),
        (cpb.ShardSpec, "hot_standbys", 9),
        (cpb.ShardSpec, "labels", 10),
        (cpb.ShardSpec, "read_channel_size", 13),
        (cpb.ListRequest, "extension", 100),
        (cpb.ListResponse, "Shard.create_revision", 5),
        (cpb.ApplyRequest, "Change.primary_hints", 4),
        (cpb.StatResponse, "publish_at", 4),
        (cpb.GetHintsResponse, "backup_hints", 4),
        (cpb.UnassignRequest, "dry_run", 3),
        (rpb.RecordedOp, "first_offset", 9),
        (rpb.RecordedOp, "log", 11),
        (rpb.RecordedOp, "property", 8),
        (rpb.Segment, "log", 7),
    ],
)
def test_key_field_numbers(msg: type, path: str, number: int) -> None:
    assert _number(msg, path) == number


def test_enum_values() -> None:
    assert dict(cpb.Status.items()) == {
        "OK": 0,
        "SHARD_NOT_FOUND": 1,
        "NO_SHARD_PRIMARY": 2,
        "NOT_SHARD_PRIMARY": 3,
        "ETCD_TRANSACTION_FAILED": 4,
        "SHARD_STOPPED": 5,
    }
    assert dict(cpb.ReplicaStatus.Code.items()) == {
        "IDLE": 0,
        "BACKFILL": 100,
        "STANDBY": 200,
        "PRIMARY": 300,
        "FAILED": 400,
    }


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _vi(num: int, value: int) -> bytes:
    return _varint(num << 3) + _varint(value)


def _ld(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _f32(num: int, value: int) -> bytes:
    return _varint(num << 3 | 5) + value.to_bytes(4, "little")


def _f64(num: int, value: int) -> bytes:
    return _varint(num << 3 | 1) + value.to_bytes(8, "little")


def test_checkpoint_golden() -> None:
    cp = cpb.Checkpoint()
    src = cp.sources["a/j"]
    src.read_through = 10
    src.producers.add(
        id=b"\x01\x02\x03\x04\x05\x06",
        state=cpb.Checkpoint.ProducerState(last_ack=0x0102030405060708, begin=-1),
    )
    cp.ack_intents["a/j"] = b"ack"
    state = _f64(1, 0x0102030405060708) + _vi(2, -1)
    entry = _ld(1, b"\x01\x02\x03\x04\x05\x06") + _ld(2, state)
    source = _vi(1, 10) + _ld(2, entry)
    want = _ld(1, _ld(1, b"a/j") + _ld(2, source)) + _ld(2, _ld(1, b"a/j") + _ld(2, b"ack"))
    assert cp.SerializeToString(deterministic=True) == want
    assert cpb.Checkpoint.FromString(want) == cp


def test_shard_spec_golden() -> None:
    spec = cpb.ShardSpec(
        id="s",
        sources=[cpb.ShardSpec.Source(journal="j", min_offset=7)],
        recovery_log_prefix="r",
        hint_prefix="/h",
        hint_backups=2,
        max_txn_duration=Duration(seconds=1),
        min_txn_duration=Duration(nanos=5),
        disable=True,
        hot_standbys=1,
        labels=pb.LabelSet(labels=[pb.Label(name="k", value="v")]),
        disable_wait_for_ack=True,
        ring_buffer_size=3,
        read_channel_size=4,
    )
    want = (
        _ld(1, b"s")
        + _ld(2, _ld(1, b"j") + _vi(3, 7))
        + _ld(3, b"r")
        + _ld(4, b"/h")
        + _vi(5, 2)
        + _ld(6, _vi(1, 1))
        + _ld(7, _vi(2, 5))
        + _vi(8, 1)
        + _vi(9, 1)
        + _ld(10, _ld(1, _ld(1, b"k") + _ld(2, b"v")))
        + _vi(11, 1)
        + _vi(12, 3)
        + _vi(13, 4)
    )
    assert spec.SerializeToString() == want


def test_recorded_op_golden() -> None:
    op = rpb.RecordedOp(
        seq_no=1,
        checksum=0xDEADBEEF,
        author=0x01020304,
        write=rpb.RecordedOp.Write(fnode=1, offset=2, length=3),
        last_offset=40,
    )
    want = (
        _vi(1, 1)
        + _f32(2, 0xDEADBEEF)
        + _f32(3, 0x01020304)
        + _ld(7, _vi(1, 1) + _vi(2, 2) + _vi(3, 3))
        + _vi(10, 40)
    )
    assert op.SerializeToString() == want
    hints = rpb.FSMHints(
        log="l",
        live_nodes=[rpb.FnodeSegments(fnode=2, segments=[rpb.Segment(author=7, first_seq_no=1)])],
        properties=[rpb.Property(path="p", content="c")],
    )
    assert hints.SerializeToString() == (
        _ld(1, b"l")
        + _ld(2, _vi(1, 2) + _ld(2, _f32(1, 7) + _vi(2, 1)))
        + _ld(3, _ld(1, b"p") + _ld(2, b"c"))
    )


def test_hints_in_consumer_messages() -> None:
    """FSMHints travel inside GetHintsResponse and ApplyRequest.Change unchanged."""
    hints = rpb.FSMHints(log="l", properties=[rpb.Property(path="p", content="c")])
    resp = cpb.GetHintsResponse(
        primary_hints=cpb.GetHintsResponse.ResponseHints(hints=hints),
        backup_hints=[cpb.GetHintsResponse.ResponseHints()],
    )
    assert resp.SerializeToString() == _ld(3, _ld(1, hints.SerializeToString())) + _ld(4, b"")
    change = cpb.ApplyRequest.Change(delete="s", primary_hints=hints)
    assert change.SerializeToString() == _ld(3, b"s") + _ld(4, hints.SerializeToString())
