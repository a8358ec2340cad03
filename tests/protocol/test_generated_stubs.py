"""The committed stubs match their .proto sources, and key wire facts match Gazette."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from pygazette.protocol.pb import protocol_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
PB_DIR = REPO / "pygazette/protocol/pb"
PROTOS = sorted(p.name for p in PB_DIR.glob("*.proto"))


@pytest.mark.parametrize("proto", PROTOS)
def test_committed_stubs_are_fresh(tmp_path: Path, proto: str) -> None:
    """Every .proto's committed stubs are what `make proto` generates from it."""
    source = f"pygazette/protocol/pb/{proto}"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            ".",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            source,
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    stem = proto.removesuffix(".proto")
    for name in (f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"):
        fresh = (tmp_path / "pygazette/protocol/pb" / name).read_bytes()
        committed = (PB_DIR / name).read_bytes()
        assert fresh == committed, f"{name} is stale: regenerate with `make proto`"


FD = pb.DESCRIPTOR
F = descriptor_pb2.FieldDescriptorProto


def field(message: str, name: str) -> tuple[int, int]:
    desc = FD.message_types_by_name[message.split(".")[0]]
    for nested in message.split(".")[1:]:
        desc = desc.nested_types_by_name[nested]
    f = desc.fields_by_name[name]
    return f.number, f.type


@pytest.mark.parametrize(
    ("message", "name", "number", "kind"),
    [
        ("Label", "name", 1, F.TYPE_STRING),
        ("Label", "value", 2, F.TYPE_STRING),
        ("Label", "prefix", 3, F.TYPE_BOOL),
        ("LabelSet", "labels", 1, F.TYPE_MESSAGE),
        ("JournalSpec", "flags", 6, F.TYPE_UINT32),
        ("JournalSpec", "max_append_rate", 7, F.TYPE_INT64),
        ("JournalSpec", "suspend", 8, F.TYPE_MESSAGE),
        ("JournalSpec.Suspend", "level", 1, F.TYPE_ENUM),
        ("JournalSpec.Suspend", "offset", 2, F.TYPE_INT64),
        ("JournalSpec.Fragment", "path_postfix_template", 7, F.TYPE_STRING),
        ("BrokerSpec", "exiting", 3, F.TYPE_BOOL),
        ("Fragment", "sum", 4, F.TYPE_MESSAGE),
        ("Fragment", "path_postfix", 8, F.TYPE_STRING),
        ("SHA1Sum", "part1", 1, F.TYPE_FIXED64),
        ("SHA1Sum", "part2", 2, F.TYPE_FIXED64),
        ("SHA1Sum", "part3", 3, F.TYPE_FIXED32),
        ("ReadRequest", "end_offset", 7, F.TYPE_INT64),
        ("ReadRequest", "begin_mod_time", 8, F.TYPE_INT64),
        ("AppendRequest", "content", 4, F.TYPE_BYTES),
        ("AppendRequest", "offset", 5, F.TYPE_INT64),
        ("AppendRequest", "suspend", 9, F.TYPE_ENUM),
        ("AppendResponse", "store_health_error", 7, F.TYPE_STRING),
        ("ReplicateRequest", "registers", 7, F.TYPE_MESSAGE),
        ("ListRequest", "watch", 4, F.TYPE_BOOL),
        ("ListRequest", "watch_resume", 5, F.TYPE_MESSAGE),
        ("ListResponse.Journal", "create_revision", 4, F.TYPE_INT64),
        ("FragmentsRequest", "signatureTTL", 7, F.TYPE_MESSAGE),
        ("FragmentsResponse._Fragment", "signed_url", 2, F.TYPE_STRING),
        ("FragmentStoreHealthRequest", "fragment_store", 1, F.TYPE_STRING),
        ("FragmentStoreHealthResponse", "status", 1, F.TYPE_ENUM),
        ("FragmentStoreHealthResponse", "header", 2, F.TYPE_MESSAGE),
        ("FragmentStoreHealthResponse", "store_health_error", 3, F.TYPE_STRING),
        ("Header.Etcd", "revision", 3, F.TYPE_INT64),
    ],
)
def test_field_numbers(message: str, name: str, number: int, kind: int) -> None:
    assert field(message, name) == (number, kind)


def test_enum_values() -> None:
    assert dict(pb.Status.items()) == {
        "OK": 0,
        "JOURNAL_NOT_FOUND": 1,
        "NO_JOURNAL_PRIMARY_BROKER": 2,
        "NOT_JOURNAL_PRIMARY_BROKER": 3,
        "INSUFFICIENT_JOURNAL_BROKERS": 4,
        "NOT_JOURNAL_BROKER": 5,
        "OFFSET_NOT_YET_AVAILABLE": 6,
        "WRONG_ROUTE": 7,
        "PROPOSAL_MISMATCH": 8,
        "ETCD_TRANSACTION_FAILED": 9,
        "NOT_ALLOWED": 10,
        "WRONG_APPEND_OFFSET": 11,
        "INDEX_HAS_GREATER_OFFSET": 12,
        "REGISTER_MISMATCH": 13,
        "SUSPENDED": 14,
        "FRAGMENT_STORE_UNHEALTHY": 15,
    }
    assert dict(pb.CompressionCodec.items()) == {
        "INVALID": 0,
        "NONE": 1,
        "GZIP": 2,
        "ZSTANDARD": 3,
        "SNAPPY": 4,
        "GZIP_OFFLOAD_DECOMPRESSION": 5,
    }
    assert dict(pb.JournalSpec.Flag.items()) == {
        "NOT_SPECIFIED": 0,
        "O_RDONLY": 1,
        "O_WRONLY": 2,
        "O_RDWR": 4,
    }
    assert dict(pb.JournalSpec.Suspend.Level.items()) == {"NONE": 0, "PARTIAL": 1, "FULL": 2}
    assert dict(pb.AppendRequest.Suspend.items()) == {
        "SUSPEND_RESUME": 0,
        "SUSPEND_NO_RESUME": 1,
        "SUSPEND_IF_FLUSHED": 2,
        "SUSPEND_NOW": 3,
    }


def test_journal_service() -> None:
    service = FD.services_by_name["Journal"]
    assert FD.package == "protocol" and service.full_name == "protocol.Journal"
    methods = {
        m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
        for m in service.methods
    }
    assert methods == {
        "List": ("ListRequest", "ListResponse", False, True),
        "Apply": ("ApplyRequest", "ApplyResponse", False, False),
        "Read": ("ReadRequest", "ReadResponse", False, True),
        "Append": ("AppendRequest", "AppendResponse", True, False),
        "Replicate": ("ReplicateRequest", "ReplicateResponse", True, True),
        "ListFragments": ("FragmentsRequest", "FragmentsResponse", False, False),
        "FragmentStoreHealth": (
            "FragmentStoreHealthRequest",
            "FragmentStoreHealthResponse",
            False,
            False,
        ),
    }


def test_golden_wire_bytes() -> None:
    # SHA1Sum: three fixed-width fields, little-endian on the wire.
    s = pb.SHA1Sum(part1=0x0102030405060708, part2=1, part3=0x11121314)
    assert s.SerializeToString() == (
        b"\x09" + bytes.fromhex("0807060504030201")
        + b"\x11" + bytes.fromhex("0100000000000000")
        + b"\x1d" + bytes.fromhex("14131211")
    )  # fmt: skip
    # AppendRequest.offset is field 5, varint; suspend is field 9.
    req = pb.AppendRequest(journal="ab", offset=300, suspend=pb.AppendRequest.SUSPEND_NOW)
    assert req.SerializeToString() == b"\x12\x02ab" + b"\x28\xac\x02" + b"\x48\x03"
    # A prefix label: field 3, varint true.
    assert pb.Label(name="n", prefix=True).SerializeToString() == b"\x0a\x01n\x18\x01"
