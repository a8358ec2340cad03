"""Protobuf messages as JSON, byte for byte as Gazette's HTTP API writes and reads them.

Gazette's grpc-gateway marshals with gogo/protobuf's `jsonpb` (`gateway.JSONPb{EmitDefaults:
true}`) over Gazette's generated Go structs, and this module does the same over pygazette's
descriptors:

- fields in declaration order, lowerCamelCase names, compact (`{"a":1,"b":"x"}`);
- every field present (EmitDefaults): `0`, `""`, `false`, `[]`, `{}`, and `null` for an unset
  message that Go holds as a pointer (`"fragment":null`) or empty bytes (`"content":null`); a
  message Gazette declares `nullable=false` is always an object;
- 64-bit integers as strings, 32-bit as numbers, enums by name (an unknown value as its
  number), bytes in standard base64, durations as `"90.500s"`, map keys sorted;
- strings as Go's encoding/json writes them (`<`, `>`, `&` as `\\u003c`, `\\u003e`, `\\u0026`);
- the few fields pygazette's protos keep that Gazette's structs dropped are left out.

`decode` reads a request as the gateway's `json.Decoder` and `jsonpb.Unmarshaler{
AllowUnknownFields: true}` do: the first JSON value of the body (an empty body is an empty
request), both field spellings (`metadata_only` and `metadataOnly`), numbers quoted or not,
enums by name or number, unknown fields ignored; and it fails with the very messages Go
writes ("invalid character 'x' looking for beginning of value", "json: cannot unmarshal string
into Go value of type bool", "unexpected EOF"…), which the gateway returns to the client.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.go_duration import parse_duration

__all__ = ["JsonError", "decode", "go_json_string", "go_quote", "marshal", "marshal_text"]

_F = FieldDescriptor

# Message fields Gazette's Go structs hold by value (gogoproto.nullable=false): always an object,
# never null.
_NOT_NULLABLE = frozenset(
    {
        ("protocol.LabelSet", "labels"),
        ("protocol.LabelSelector", "include"),
        ("protocol.LabelSelector", "exclude"),
        ("protocol.JournalSpec", "labels"),
        ("protocol.JournalSpec", "fragment"),
        ("protocol.JournalSpec.Fragment", "refresh_interval"),
        ("protocol.JournalSpec.Fragment", "retention"),
        ("protocol.JournalSpec.Fragment", "flush_interval"),
        ("protocol.ProcessSpec", "id"),
        ("protocol.BrokerSpec", "process_spec"),
        ("protocol.Fragment", "sum"),
        ("protocol.AppendResponse", "header"),
        ("protocol.ListRequest", "selector"),
        ("protocol.ListResponse", "header"),
        ("protocol.ListResponse", "journals"),
        ("protocol.ListResponse.Journal", "spec"),
        ("protocol.ListResponse.Journal", "route"),
        ("protocol.ApplyRequest", "changes"),
        ("protocol.ApplyResponse", "header"),
        ("protocol.FragmentsResponse", "header"),
        ("protocol.FragmentsResponse", "fragments"),
        ("protocol.FragmentsResponse._Fragment", "spec"),
        ("protocol.Route", "members"),
        ("protocol.Header", "process_id"),
        ("protocol.Header", "route"),
        ("protocol.Header", "etcd"),
        ("protocol.FragmentStoreHealthResponse", "header"),
        ("consumer.ShardSpec", "sources"),
        ("consumer.ShardSpec", "max_txn_duration"),
        ("consumer.ShardSpec", "min_txn_duration"),
        ("consumer.ShardSpec", "labels"),
        ("consumer.ConsumerSpec", "process_spec"),
        ("consumer.Checkpoint", "sources"),
        ("consumer.Checkpoint.Source", "producers"),
        ("consumer.Checkpoint.Source.ProducerEntry", "state"),
        ("consumer.ListRequest", "selector"),
        ("consumer.ListResponse", "header"),
        ("consumer.ListResponse", "shards"),
        ("consumer.ListResponse.Shard", "spec"),
        ("consumer.ListResponse.Shard", "route"),
        ("consumer.ListResponse.Shard", "status"),
        ("consumer.ApplyRequest", "changes"),
        ("consumer.ApplyResponse", "header"),
        ("consumer.StatResponse", "header"),
        ("consumer.GetHintsResponse", "header"),
        ("consumer.GetHintsResponse", "primary_hints"),
        ("consumer.GetHintsResponse", "backup_hints"),
    }
)

# Fields pygazette's protos keep (deprecated) that Gazette v0.103's structs no longer have.
_NOT_IN_GO = frozenset(
    {
        ("protocol.ListRequest", "page_limit"),
        ("protocol.ListRequest", "page_token"),
        ("protocol.ListResponse", "next_page_token"),
    }
)

# Go types of fields declared with gogoproto.casttype (named in Go's decoding errors);
# `Offset` is an alias of int64 and keeps int64's name.
_GO_TYPE = {
    ("protocol.JournalSpec", "name"): "protocol.Journal",
    ("protocol.JournalSpec", "flags"): "protocol.JournalSpec_Flag",
    ("protocol.JournalSpec.Fragment", "stores"): "protocol.FragmentStore",
    ("protocol.ProcessSpec", "endpoint"): "protocol.Endpoint",
    ("protocol.Fragment", "journal"): "protocol.Journal",
    ("protocol.Fragment", "backing_store"): "protocol.FragmentStore",
    ("protocol.ReadRequest", "journal"): "protocol.Journal",
    ("protocol.AppendRequest", "journal"): "protocol.Journal",
    ("protocol.ReplicateRequest", "deprecated_journal"): "protocol.Journal",
    ("protocol.ApplyRequest.Change", "delete"): "protocol.Journal",
    ("protocol.FragmentsRequest", "journal"): "protocol.Journal",
    ("protocol.Route", "endpoints"): "protocol.Endpoint",
    ("protocol.FragmentStoreHealthRequest", "fragment_store"): "protocol.FragmentStore",
    ("consumer.ShardSpec", "id"): "protocol.ShardID",
    ("consumer.ShardSpec.Source", "journal"): "protocol.Journal",
    ("consumer.Checkpoint.ProducerState", "last_ack"): "message.Clock",
    ("consumer.ApplyRequest.Change", "delete"): "protocol.ShardID",
    ("consumer.StatRequest", "shard"): "protocol.ShardID",
    ("consumer.GetHintsRequest", "shard"): "protocol.ShardID",
    ("consumer.UnassignRequest", "shards"): "protocol.ShardID",
    ("consumer.UnassignResponse", "shards"): "protocol.ShardID",
}

_INT64 = {_F.TYPE_INT64: "int64", _F.TYPE_SINT64: "int64", _F.TYPE_SFIXED64: "int64"}
_UINT64 = {_F.TYPE_UINT64: "uint64", _F.TYPE_FIXED64: "uint64"}
_INT32 = {_F.TYPE_INT32: "int32", _F.TYPE_SINT32: "int32", _F.TYPE_SFIXED32: "int32"}
_UINT32 = {_F.TYPE_UINT32: "uint32", _F.TYPE_FIXED32: "uint32"}
_INT_KINDS = {**_INT64, **_UINT64, **_INT32, **_UINT32}
_INT_RANGE = {
    "int64": (-(1 << 63), (1 << 63) - 1),
    "uint64": (0, (1 << 64) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "uint32": (0, (1 << 32) - 1),
}
_DURATION = "google.protobuf.Duration"


def _key(field: Any) -> tuple[str, str]:
    return (field.containing_type.full_name, field.name)


def _is_map(field: Any) -> bool:
    mt = field.message_type
    return bool(field.is_repeated and mt is not None and mt.GetOptions().map_entry)


def _go_fields(desc: Any) -> list[Any]:
    return [f for f in desc.fields if _key(f) not in _NOT_IN_GO]


# Marshalling.

_HEX = "0123456789abcdef"
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
for _c in range(0x20):
    _ESCAPES.setdefault(chr(_c), "\\u00" + _HEX[_c >> 4] + _HEX[_c & 0xF])
_ESCAPE_TABLE = str.maketrans(_ESCAPES)


def go_json_string(value: str) -> str:
    """`value` quoted as Go's json.Marshal writes a string (HTML characters escaped)."""
    return '"' + value.translate(_ESCAPE_TABLE) + '"'


def _go_float(value: float) -> str:
    if math.isnan(value):
        return '"NaN"'
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    if value == int(value) and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    if "e" in text:
        mant, exp = text.split("e")
        sign = exp[0] if exp[0] in "+-" else "+"
        digits = exp.lstrip("+-").lstrip("0") or "0"
        text = f"{mant}e{sign}{digits.zfill(2)}"
    return text


def _duration(seconds: int, nanos: int) -> str:
    """A Duration as gogo's jsonpb writes it: 0, 3, 6 or 9 fractional digits, then "s"."""
    if nanos < 0:
        text = f"{'-' if seconds == 0 else ''}{seconds}.{-nanos:09d}"
    else:
        text = f"{seconds}.{nanos:09d}"
    for suffix in ("000", "000", ".000"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
    return f'"{text}s"'


def _scalar(field: Any, value: Any, in_list: bool = False) -> str:
    t = field.type
    if t == _F.TYPE_STRING:
        return go_json_string(value)
    if t == _F.TYPE_BOOL:
        return "true" if value else "false"
    if t == _F.TYPE_ENUM:
        ev = field.enum_type.values_by_number.get(value)
        return f'"{ev.name}"' if ev is not None else str(value)
    if t == _F.TYPE_BYTES:
        if not value and not in_list:
            return "null"  # A nil []byte: proto3 never sends an empty one.
        return '"' + base64.b64encode(value).decode("ascii") + '"'
    if t in _INT64 or t in _UINT64:
        return f'"{value}"'
    if t in _INT32 or t in _UINT32:
        return str(value)
    return _go_float(value)


def _message_value(field: Any, value: Message, orig_name: bool = False) -> str:
    if field.message_type.full_name == _DURATION:
        return _duration(value.seconds, value.nanos)  # type: ignore[attr-defined]
    return _object(value, orig_name)


def _object(msg: Message, orig_name: bool = False) -> str:
    parts = []
    for field in _go_fields(msg.DESCRIPTOR):
        if field.containing_oneof is not None and msg.WhichOneof(field.containing_oneof.name) != (
            field.name
        ):
            continue  # An unset oneof is left out, even with EmitDefaults.
        value = getattr(msg, field.name)
        if _is_map(field):
            vfield = field.message_type.fields_by_name["value"]
            kfield = field.message_type.fields_by_name["key"]
            entries = []
            for k in sorted(value):
                if kfield.type == _F.TYPE_STRING:
                    ktext = go_json_string(k)
                elif kfield.type == _F.TYPE_BOOL:
                    ktext = '"true"' if k else '"false"'
                else:
                    ktext = f'"{k}"'
                v = value[k]
                if vfield.type == _F.TYPE_MESSAGE:
                    vtext = _message_value(vfield, v, orig_name)
                else:
                    vtext = _scalar(vfield, v, in_list=True)
                entries.append(f"{ktext}:{vtext}")
            text = "{" + ",".join(entries) + "}"
        elif field.is_repeated:
            if field.type == _F.TYPE_MESSAGE:
                items = [_message_value(field, v, orig_name) for v in value]
            else:
                items = [_scalar(field, v, in_list=True) for v in value]
            text = "[" + ",".join(items) + "]"
        elif field.type == _F.TYPE_MESSAGE:
            if _key(field) in _NOT_NULLABLE or msg.HasField(field.name):
                text = _message_value(field, value, orig_name)
            else:
                text = "null"
        else:
            text = _scalar(field, value)
        parts.append(f'"{field.name if orig_name else field.json_name}":{text}')
    return "{" + ",".join(parts) + "}"


def marshal(msg: Message, *, orig_name: bool = False) -> bytes:
    """`msg` as Gazette's gateway writes it (gogo jsonpb with EmitDefaults, compact); with
    `orig_name`, fields by their .proto names (`OrigName: true`), as gazctl's `-o json`."""
    return _object(msg, orig_name).encode()


# Protobuf text, as gazctl prints it (`--format proto`, `apply --dry-run`).


def _text_string(data: bytes) -> str:
    """gogo's writeString: bytes outside printable ASCII as 3-digit octal escapes."""
    out = ['"']
    for c in data:
        if c == 0x0A:
            out.append("\\n")
        elif c == 0x0D:
            out.append("\\r")
        elif c == 0x09:
            out.append("\\t")
        elif c == 0x22:
            out.append('\\"')
        elif c == 0x5C:
            out.append("\\\\")
        elif 0x20 <= c < 0x7F:
            out.append(chr(c))
        else:
            out.append(f"\\{c:03o}")
    out.append('"')
    return "".join(out)


def _text_scalar(field: Any, value: Any) -> str:
    t = field.type
    if t == _F.TYPE_STRING:
        return _text_string(value.encode())
    if t == _F.TYPE_BYTES:
        return _text_string(value)
    if t == _F.TYPE_BOOL:
        return "true" if value else "false"
    if t == _F.TYPE_ENUM:
        ev = field.enum_type.values_by_number.get(value)
        return ev.name if ev is not None else str(value)
    if t in _INT_KINDS:
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)  # Not in Gazette's messages.


def _text_message(msg: Message, indent: str, out: list[str]) -> None:
    for field in _go_fields(msg.DESCRIPTOR):
        if field.containing_oneof is not None and msg.WhichOneof(field.containing_oneof.name) != (
            field.name
        ):
            continue
        value = getattr(msg, field.name)
        head = f"{indent}{field.name}: "
        if _is_map(field):
            kfield = field.message_type.fields_by_name["key"]
            vfield = field.message_type.fields_by_name["value"]
            for k in sorted(value):
                out.append(f"{head}<\n{indent}  key: {_text_scalar(kfield, k)}\n")
                v = value[k]
                if vfield.type == _F.TYPE_MESSAGE:
                    out.append(f"{indent}  value: <\n")
                    _text_message(v, indent + "    ", out)
                    out.append(f"{indent}  >\n")
                else:
                    out.append(f"{indent}  value: {_text_scalar(vfield, v)}\n")
                out.append(f"{indent}>\n")
        elif field.is_repeated:
            for v in value:
                if field.type == _F.TYPE_MESSAGE:
                    out.append(f"{head}<\n")
                    _text_message(v, indent + "  ", out)
                    out.append(f"{indent}>\n")
                else:
                    out.append(f"{head}{_text_scalar(field, v)}\n")
        elif field.type == _F.TYPE_MESSAGE:
            by_value = _key(field) in _NOT_NULLABLE
            if field.message_type.full_name == _DURATION and by_value:
                # A time.Duration (stdduration): an int64 in Go, left out when zero.
                if not (value.seconds or value.nanos):  # type: ignore[attr-defined]
                    continue
            elif not by_value and not msg.HasField(field.name):
                continue
            out.append(f"{head}<\n")
            _text_message(value, indent + "  ", out)
            out.append(f"{indent}>\n")
        elif field.containing_oneof is not None or value:
            out.append(f"{head}{_text_scalar(field, value)}\n")


def marshal_text(msg: Message) -> str:
    """`msg` in protobuf text format as gazctl prints it (gogo's proto.MarshalText over
    Gazette's structs): `name: <` … `>` for messages, zero scalars left out, messages Go holds
    by value always written (a zero duration, an int64 there, left out), strings escaped
    byte by byte."""
    out: list[str] = []
    _text_message(msg, "", out)
    return "".join(out)


# Reading JSON as Go's encoding/json scans it.


class JsonError(ValueError):
    """A request body Go's decoder refuses; str() is Go's message."""


class _Node:
    __slots__ = ("kind", "raw", "value")

    def __init__(self, kind: str, raw: bytes, value: Any) -> None:
        self.kind = kind  # object, array, string, number, bool, null
        self.raw = raw
        self.value = value


_WS = b" \t\r\n"
_DIGITS = b"0123456789"
_HEXDIGITS = b"0123456789abcdefABCDEF"
_SIMPLE_ESCAPES = {
    ord("b"): "\b",
    ord("f"): "\f",
    ord("n"): "\n",
    ord("r"): "\r",
    ord("t"): "\t",
    ord("\\"): "\\",
    ord("/"): "/",
    ord('"'): '"',
}


_GO_CHAR_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


def go_quote(data: bytes) -> str:
    """strconv.Quote of `data` (what Go's %q writes of a byte slice)."""
    out = ['"']
    text = data.decode("utf-8", "surrogateescape")
    for ch in text:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:  # An invalid UTF-8 byte.
            out.append(f"\\x{o - 0xDC00:02x}")
        elif ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\a\b\f\n\r\t\v":
            out.append(_GO_CHAR_ESCAPES[ch])
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02x}")
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


def _quote_char(c: int) -> str:
    """How Go's JSON scanner names a character in its errors."""
    if c == ord("'"):
        return "'\\''"
    if c == ord('"'):
        return "'\"'"
    return "'" + go_quote(chr(c).encode())[1:-1] + "'"


class _Scanner:
    """A JSON value parsed as Go's scanner steps through it, with its error messages.

    `stream` is json.Decoder's reading of the first value of a body (running out of input
    mid-value is "unexpected EOF"); otherwise json.Unmarshal's of a whole document ("unexpected
    end of JSON input", and "… after top-level value" for anything after it).
    """

    def __init__(self, data: bytes, stream: bool) -> None:
        self.data = data
        self.stream = stream
        self.pos = 0

    def error(self, context: str, at_eof_space: bool = False) -> JsonError:
        if self.pos >= len(self.data):
            if self.stream:
                return JsonError("unexpected EOF")
            if not at_eof_space:
                return JsonError("unexpected end of JSON input")
            return JsonError(f"invalid character ' ' {context}")
        return JsonError(f"invalid character {_quote_char(self.data[self.pos])} {context}")

    def peek(self) -> int | None:
        return self.data[self.pos] if self.pos < len(self.data) else None

    def skip_ws(self) -> None:
        while self.pos < len(self.data) and self.data[self.pos] in _WS:
            self.pos += 1

    def top(self) -> _Node | None:
        """The value (None: a stream of nothing but whitespace, Go's io.EOF)."""
        self.skip_ws()
        if self.stream and self.pos >= len(self.data):
            return None
        node = self.value()
        if self.stream:
            return node  # What follows is the next value's: Decode reads no further.
        self.skip_ws()
        if self.pos < len(self.data):
            raise self.error("after top-level value")
        return node

    def value(self) -> _Node:
        self.skip_ws()
        start = self.pos
        c = self.peek()
        if c == ord("{"):
            return self.obj(start)
        if c == ord("["):
            return self.array(start)
        if c == ord('"'):
            text = self.string()
            return _Node("string", self.data[start : self.pos], text)
        if c is not None and (c == ord("-") or c in _DIGITS):
            self.number()
            raw = self.data[start : self.pos]
            return _Node("number", raw, raw.decode())
        for word, val in ((b"true", True), (b"false", False), (b"null", None)):
            if c == word[0]:
                self.pos += 1
                for expect in word[1:]:
                    if self.peek() != expect:
                        lit = word.decode()
                        raise self.error(
                            f"in literal {lit} (expecting {_quote_char(expect)})",
                            at_eof_space=True,
                        )
                    self.pos += 1
                kind = "null" if val is None else "bool"
                return _Node(kind, word, val)
        raise self.error("looking for beginning of value")

    def obj(self, start: int) -> _Node:
        self.pos += 1
        fields: dict[str, _Node] = {}
        self.skip_ws()
        if self.peek() == ord("}"):
            self.pos += 1
            return _Node("object", self.data[start : self.pos], fields)
        while True:
            self.skip_ws()
            if self.peek() != ord('"'):
                raise self.error("looking for beginning of object key string")
            key = self.string()
            self.skip_ws()
            if self.peek() != ord(":"):
                raise self.error("after object key")
            self.pos += 1
            fields[key] = self.value()  # A repeated key: the last wins, as in a Go map.
            self.skip_ws()
            c = self.peek()
            if c == ord(","):
                self.pos += 1
                continue
            if c == ord("}"):
                self.pos += 1
                return _Node("object", self.data[start : self.pos], fields)
            raise self.error("after object key:value pair")

    def array(self, start: int) -> _Node:
        self.pos += 1
        items: list[_Node] = []
        self.skip_ws()
        if self.peek() == ord("]"):
            self.pos += 1
            return _Node("array", self.data[start : self.pos], items)
        while True:
            items.append(self.value())
            self.skip_ws()
            c = self.peek()
            if c == ord(","):
                self.pos += 1
                continue
            if c == ord("]"):
                self.pos += 1
                return _Node("array", self.data[start : self.pos], items)
            raise self.error("after array element")

    def string(self) -> str:
        self.pos += 1
        units: list[str] = []
        run = self.pos
        data = self.data
        while True:
            c = self.peek()
            if c is None:
                raise self.error("")
            if c == ord('"'):
                units.append(data[run : self.pos].decode("utf-8", "replace"))
                self.pos += 1
                return _join_surrogates("".join(units))
            if c < 0x20:
                raise self.error("in string literal")
            if c != ord("\\"):
                self.pos += 1
                continue
            units.append(data[run : self.pos].decode("utf-8", "replace"))
            self.pos += 1
            e = self.peek()
            if e is None:
                raise self.error("")
            if e in _SIMPLE_ESCAPES:
                units.append(_SIMPLE_ESCAPES[e])
                self.pos += 1
            elif e == ord("u"):
                self.pos += 1
                hexs = self.pos
                for _ in range(4):
                    h = self.peek()
                    if h is None or h not in _HEXDIGITS:
                        raise self.error("in \\u hexadecimal character escape")
                    self.pos += 1
                units.append(chr(int(data[hexs : self.pos], 16)))
            else:
                raise self.error("in string escape code")
            run = self.pos

    def number(self) -> None:
        if self.peek() == ord("-"):
            self.pos += 1
            c = self.peek()
            if c is None or c not in _DIGITS:
                raise self.error("in numeric literal", at_eof_space=True)
        if self.peek() == ord("0"):
            self.pos += 1
        else:
            while (c := self.peek()) is not None and c in _DIGITS:
                self.pos += 1
        if self.peek() == ord("."):
            self.pos += 1
            c = self.peek()
            if c is None or c not in _DIGITS:
                raise self.error("after decimal point in numeric literal", at_eof_space=True)
            while (c := self.peek()) is not None and c in _DIGITS:
                self.pos += 1
        if self.peek() in (ord("e"), ord("E")):
            self.pos += 1
            if self.peek() in (ord("+"), ord("-")):
                self.pos += 1
            c = self.peek()
            if c is None or c not in _DIGITS:
                raise self.error("in exponent of numeric literal", at_eof_space=True)
            while (c := self.peek()) is not None and c in _DIGITS:
                self.pos += 1


def _join_surrogates(text: str) -> str:
    """UTF-16 surrogate pairs from \\u escapes joined; a lone surrogate is U+FFFD, as in Go."""
    if not any(0xD800 <= ord(ch) <= 0xDFFF for ch in text):
        return text
    out = []
    i = 0
    while i < len(text):
        o = ord(text[i])
        if 0xD800 <= o < 0xDC00 and i + 1 < len(text) and 0xDC00 <= ord(text[i + 1]) <= 0xDFFF:
            out.append(chr(0x10000 + ((o - 0xD800) << 10) + (ord(text[i + 1]) - 0xDC00)))
            i += 2
            continue
        out.append("\ufffd" if 0xD800 <= o <= 0xDFFF else text[i])
        i += 1
    return "".join(out)


def _parse_document(data: bytes) -> _Node:
    """json.Unmarshal's reading of `data` as one whole JSON document."""
    return _Scanner(data, stream=False).top()  # type: ignore[return-value]


# Decoding into messages, as gogo's jsonpb.Unmarshaler does.


def _type_error(node: _Node, go_type: str) -> JsonError:
    what = "number" if node.kind == "number" else node.kind
    return JsonError(f"json: cannot unmarshal {what} into Go value of type {go_type}")


def _number_error(node: _Node, go_type: str) -> JsonError:
    return JsonError(f"json: cannot unmarshal number {node.value} into Go value of type {go_type}")


def _scalar_go_type(field: Any) -> str:
    name = _GO_TYPE.get(_key(field))
    if name is not None:
        return name
    t = field.type
    if t == _F.TYPE_STRING:
        return "string"
    if t == _F.TYPE_BOOL:
        return "bool"
    if t == _F.TYPE_BYTES:
        return "[]uint8"
    if t == _F.TYPE_ENUM:
        return _enum_go_type(field.enum_type)
    if t in _INT_KINDS:
        return _INT_KINDS[t]
    return "float64" if t == _F.TYPE_DOUBLE else "float32"


def _enum_go_type(enum: Any) -> str:
    # Both of Gazette's Go packages (broker/protocol, consumer/protocol) are named `protocol`.
    local = str(enum.full_name).split(".", 1)[1]
    return "protocol." + local.replace(".", "_")


def _unmarshal_scalar(field: Any, node: _Node, go_type: str) -> Any:
    """json.Unmarshal of one scalar value (None: JSON null, which leaves the field as is)."""
    if node.kind == "null":
        return None
    t = field.type
    if t == _F.TYPE_STRING:
        if node.kind != "string":
            raise _type_error(node, go_type)
        return node.value
    if t == _F.TYPE_BOOL:
        if node.kind != "bool":
            raise _type_error(node, go_type)
        return node.value
    if t == _F.TYPE_BYTES:
        if node.kind != "string":
            raise _type_error(node, go_type)
        return _base64(node.value)
    if node.kind != "number":
        raise _type_error(node, go_type)
    text = node.value
    if t in _INT_KINDS or t == _F.TYPE_ENUM:
        kind = _INT_KINDS.get(t, "int32")
        if any(ch in text for ch in ".eE"):
            raise _number_error(node, go_type)
        number = int(text)
        lo, hi = _INT_RANGE[kind]
        if not lo <= number <= hi:
            raise _number_error(node, go_type)
        return number
    return float(text)


def _base64(text: str) -> bytes:
    """Go's base64.StdEncoding.Decode as encoding/json applies it to a []byte."""
    data = text.replace("\r", "").replace("\n", "")
    try:
        return base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        pass
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    raw = text.encode("utf-8", "replace")
    at = 0
    for i, c in enumerate(raw):
        if c in b"\r\n":
            continue
        if c not in alphabet:
            at = i
            break
        at = i + 1
    raise JsonError(f"illegal base64 data at input byte {min(at, len(raw))}")


def _field_value(field: Any, node: _Node) -> Any:
    """The value of one non-repeated, non-message field (None: leave it unset)."""
    go_type = _scalar_go_type(field)
    if field.type == _F.TYPE_ENUM and node.kind == "string":
        # Names are taken verbatim from between the quotes, not unescaped.
        name = node.raw[1:-1]
        ev = field.enum_type.values_by_name.get(name.decode("utf-8", "replace"))
        if ev is None:
            raise JsonError(f"unknown value {go_quote(name)} for enum {field.enum_type.full_name}")
        return ev.number
    if field.type in _INT_KINDS or field.type in (_F.TYPE_DOUBLE, _F.TYPE_FLOAT):
        if node.kind == "string":
            # Quoted numbers: the quotes are dropped (escapes and all) and the rest unmarshalled.
            node = _parse_document(node.raw[1:-1])
    return _unmarshal_scalar(field, node, go_type)


def _set_duration(target: Message, node: _Node) -> None:
    if node.kind != "string":
        raise _type_error(node, "string")
    try:
        ns = parse_duration(node.value)
    except ValidationError:
        text = go_quote(node.value.encode())
        raise JsonError(f"bad Duration: time: invalid duration {text}") from None
    sign = -1 if ns < 0 else 1
    target.seconds = sign * (abs(ns) // 1_000_000_000)  # type: ignore[attr-defined]
    target.nanos = sign * (abs(ns) % 1_000_000_000)  # type: ignore[attr-defined]


def _decode_into(msg: Message, node: _Node) -> None:
    """gogo jsonpb's unmarshalValue of a struct: fields in declaration order."""
    if node.kind == "null":
        return
    if node.kind != "object":
        raise _type_error(node, "map[string]json.RawMessage")
    fields: dict[str, _Node] = node.value
    for field in _go_fields(msg.DESCRIPTOR):
        camel, orig = field.json_name, field.name
        if camel in fields:
            value = fields[camel]
        elif orig in fields:
            value = fields[orig]
        else:
            continue
        _decode_field(msg, field, value)


def _decode_message_field(target: Message, field: Any, node: _Node) -> None:
    assert field.message_type is not None
    if field.message_type.full_name == _DURATION:
        _set_duration(target, node)
    else:
        _decode_into(target, node)


def _decode_field(msg: Message, field: Any, node: _Node) -> None:
    if _is_map(field):
        if node.kind == "null":
            return
        if node.kind != "object":
            raise _type_error(node, "map[string]json.RawMessage")
        container = getattr(msg, field.name)
        assert field.message_type is not None
        kfield = field.message_type.fields_by_name["key"]
        vfield = field.message_type.fields_by_name["value"]
        for text, raw in node.value.items():
            key: Any = text
            if kfield.type != _F.TYPE_STRING:
                key = _field_value(kfield, _parse_document(text.encode()))
            if vfield.type == _F.TYPE_MESSAGE:
                _decode_message_field(container[key], vfield, raw)
            else:
                value = _field_value(vfield, raw)
                container[key] = value if value is not None else container[key]
        return
    if field.is_repeated:
        if node.kind == "null":
            return
        if node.kind != "array":
            raise _type_error(node, "[]json.RawMessage")
        container = getattr(msg, field.name)
        del container[:]
        for item in node.value:
            if field.type == _F.TYPE_MESSAGE:
                _decode_message_field(container.add(), field, item)
            else:
                value = _field_value(field, item)
                container.append(value if value is not None else field.default_value)
        return
    if field.type == _F.TYPE_MESSAGE:
        pointer = _key(field) not in _NOT_NULLABLE
        if pointer and node.kind == "null":
            return
        sub = getattr(msg, field.name)
        sub.SetInParent()
        _decode_message_field(sub, field, node)
        return
    value = _field_value(field, node)
    if value is not None:
        setattr(msg, field.name, value)


def decode(body: bytes, msg: Message) -> None:
    """Fill `msg` from a request body as Gazette's gateway reads it (JsonError if it cannot)."""
    node = _Scanner(body, stream=True).top()
    if node is not None:
        _decode_into(msg, node)
