"""Hypothesis strategies for hostile gRPC requests: random bytes, and well-formed protobuf
messages (built from each method's descriptor) whose values are what a hostile client sends:
extreme and negative integers, unknown enum values, 10 MB strings, path tricks in names,
deep and wide label selectors, bogus routes and headers.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from pygazette.protocol.pb import protocol_pb2 as pb

BIG = 10 << 20  # A 10 MB label or name.
HUGE_STRING = "x" * BIG
HUGE_BYTES = b"\0" * (1 << 20)

INT32 = [0, 1, -1, 7, 2**31 - 1, -(2**31)]
INT64 = [*INT32, 2**32, 2**62, 2**63 - 1, -(2**63), 1 << 40]
UINT32 = [0, 1, 2**31, 2**32 - 1]
UINT64 = [*UINT32, 2**63, 2**64 - 1]
STRINGS = [
    "",
    "fuzz/journal",  # The journal (and shard) the fixtures create: hostile values reach it.
    "fuzz/journal/",
    "fuzz/journal;meta",
    "../../etc/passwd",
    "a/../b",
    "/",
    "//",
    "a b",
    "\x00",
    "é" * 600,
    "n" * 4096,
    "file:///../../",
    "s3://bucket/?endpoint=http://127.0.0.1:1",
    "http://127.0.0.1:1",
    "local",
    "zone#member",
    "-1",
    "1h",
    "-5s",
    HUGE_STRING,
]
BYTES = [b"", b"\n", b"x" * 100, HUGE_BYTES, bytes(range(256))]
FLOATS = [0.0, -1.0, math.inf, -math.inf, math.nan, 1e308]

_INTS = {
    FieldDescriptor.TYPE_INT32: INT32,
    FieldDescriptor.TYPE_SINT32: INT32,
    FieldDescriptor.TYPE_SFIXED32: INT32,
    FieldDescriptor.TYPE_INT64: INT64,
    FieldDescriptor.TYPE_SINT64: INT64,
    FieldDescriptor.TYPE_SFIXED64: INT64,
    FieldDescriptor.TYPE_UINT32: UINT32,
    FieldDescriptor.TYPE_FIXED32: UINT32,
    FieldDescriptor.TYPE_UINT64: UINT64,
    FieldDescriptor.TYPE_FIXED64: UINT64,
}
_MAX_DEPTH = 4


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in _INTS:
        values = _INTS[t]
        lo, hi = min(values), max(values)
        return st.one_of(st.sampled_from(values), st.integers(max(lo, -1000), min(hi, 1000)))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.sampled_from(FLOATS)
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(STRINGS), st.text(max_size=40))
    if t == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.sampled_from(BYTES), st.binary(max_size=64))
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.sampled_from([*known, 99, -1, 2**31 - 1])
    raise AssertionError(f"unhandled field type {t}")


def _deep_selector(depth: int) -> pb.LabelSelector:
    """A selector of `depth` include and exclude labels (selectors do not nest: deep is wide)."""
    sel = pb.LabelSelector()
    for i in range(depth):
        sel.include.labels.add(name=f"l{i:06d}", value=f"v{i}", prefix=bool(i % 2))
        sel.exclude.labels.add(name=f"l{i:06d}", value="")
    return sel


def _route(members: int) -> pb.Route:
    route = pb.Route(primary=members - 1 if members else -1)
    for i in range(members):
        route.members.add(zone="zone-a" if i % 2 else "local", suffix=f"broker-{i}")
        route.endpoints.append(f"http://127.0.0.1:{1 + i}")
    return route


# Ready-made hostile sub-messages, mixed into the generic ones.
SPECIAL: dict[str, list[Message]] = {
    "protocol.LabelSelector": [_deep_selector(10_000), _deep_selector(1)],
    "protocol.LabelSet": [
        pb.LabelSet(labels=[pb.Label(name="big", value=HUGE_STRING)]),
        pb.LabelSet(labels=[pb.Label(name=HUGE_STRING, value="v")]),
        pb.LabelSet(labels=[pb.Label(name=f"n{i:06d}", value="v") for i in range(20_000)]),
        pb.LabelSet(labels=[pb.Label(name="b", value="1"), pb.Label(name="a", value="2")]),
    ],
    "protocol.Route": [_route(0), _route(3), _route(500), pb.Route(primary=7)],
}


@st.composite
def message(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> Message:
    """A message of `descriptor` with some fields set to hostile values."""
    special = SPECIAL.get(descriptor.full_name)
    if special and draw(st.booleans()):
        return draw(st.sampled_from(special))
    from google.protobuf import message_factory

    msg = message_factory.GetMessageClass(descriptor)()
    if depth >= _MAX_DEPTH:
        return msg
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                continue
            values = st.deferred(lambda f=field: message(f.message_type, depth + 1))
        else:
            values = _scalar(field)
        if field.is_repeated:
            items = draw(st.lists(values, max_size=3))
            container = getattr(msg, field.name)
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                for item in items:
                    container.add().CopyFrom(item)
            else:
                container.extend(items)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(msg, field.name).CopyFrom(draw(values))
        else:
            setattr(msg, field.name, draw(values))
    return msg


def random_bytes() -> st.SearchStrategy[bytes]:
    """Request bytes: random, random with a valid-looking tag, or truncated varints."""
    return st.one_of(
        st.binary(max_size=256),
        st.binary(max_size=64).map(lambda b: b"\x0a\xff\xff\xff\xff\x0f" + b),  # Huge length.
        st.binary(max_size=64).map(lambda b: b"\x08" + b"\xff" * 10 + b),  # Overlong varint.
        st.just(b"\x0a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"),
    )
