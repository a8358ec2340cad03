"""Strict YAML loading and field parsing shared by the journalspace and shardspace formats.

Both formats are YAML documents of partial specs, read with the same rules: a document must
be a mapping; unknown fields are refused; each field is checked for its type (and range) and
a bad one is reported as one line, `<where>: <field>: <problem>`, where `where` names the
node or shard at fault. A zero value (0, "", an unset or zero duration) is "not specified".
Durations are Go durations ("5m", "1h30m", "100ms") in YAML, protobuf Durations in specs.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Sequence
from typing import Any

import yaml
from google.protobuf import message

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.go_duration import parse_duration
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb

__all__ = [
    "SpecDumper",
    "StrictLoader",
    "check_keys",
    "duration_field",
    "field_error",
    "go_yaml_quotes",
    "labels_to_yaml",
    "load_document",
    "parse_bool",
    "parse_duration_ns",
    "parse_int",
    "parse_labels",
    "parse_mapping",
    "parse_str",
    "set_duration_field",
    "type_name",
]

# Loading ---------------------------------------------------------------------------------


_MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate mapping keys, as Gazette's strict decoding does."""


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue  # Keys merged in ("<<: *base") may be overridden by the node's own.
        key = loader.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
        try:
            duplicate = key in seen
        except TypeError:
            continue  # An unhashable key: construct_mapping reports it.
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    loader.flatten_mapping(node)
    return loader.construct_mapping(node, deep=True)


StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,  # type: ignore[arg-type]
)


class YamlInt(int):
    """An integer read from YAML, with the text it was written as ("007", "0x1f"): read into a
    string field (a label value, a name), it is that text, as gazctl reads it."""

    text: str


def _construct_int(loader: StrictLoader, node: yaml.ScalarNode) -> int | str:
    try:
        out = YamlInt(loader.construct_yaml_int(node))  # type: ignore[no-untyped-call]
    except ValueError:  # PyYAML resolves "0x_" to an int it cannot read: it is text.
        return str(node.value)
    out.text = str(node.value)
    return out


StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)  # type: ignore[arg-type]


class YamlFloat(float):
    """A float read from YAML, with its text ("1.5", ".inf", "1.50"), as `YamlInt`."""

    text: str


def _construct_float(loader: StrictLoader, node: yaml.ScalarNode) -> float | str:
    try:
        out = YamlFloat(loader.construct_yaml_float(node))  # type: ignore[no-untyped-call]
    except ValueError:  # As "0x_" for ints ("._"): text.
        return str(node.value)
    out.text = str(node.value)
    return out


class YamlBool(int):
    """A boolean read from YAML, with its text ("true", "yes", "ON"), as `YamlInt`: an int
    of 0 or 1, since Python's bool cannot be subclassed. `parse_bool` takes it as a bool, and
    no integer field takes it (as gazctl, which refuses !!bool there)."""

    text: str

    def __repr__(self) -> str:
        return repr(bool(self))


def _construct_bool(loader: StrictLoader, node: yaml.ScalarNode) -> YamlBool:
    out = YamlBool(loader.construct_yaml_bool(node))  # type: ignore[no-untyped-call]
    out.text = str(node.value)
    return out


StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)  # type: ignore[arg-type]
StrictLoader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)  # type: ignore[arg-type]
# No spec field is a timestamp: one written plain (a label value 2024-01-01) is its text.
StrictLoader.add_constructor(
    "tag:yaml.org,2002:timestamp",
    lambda loader, node: loader.construct_scalar(node),  # type: ignore[arg-type]
)


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, YamlBool))


# A plain '=' resolves to YAML 1.1's 'value' tag, which SafeLoader cannot construct; it is a
# valid label value, which gazctl writes plain.
StrictLoader.add_constructor(
    "tag:yaml.org,2002:value",
    lambda loader, node: loader.construct_scalar(node),  # type: ignore[arg-type]
)


def load_document(
    text: str | bytes,
    kind: str,
    contents: str,
    loader: type[yaml.SafeLoader] = StrictLoader,
) -> dict[Any, Any]:
    """The top-level mapping of a `kind` ("shardspace") YAML document, which should hold
    `contents` ("common and shards"). Errors are one line: malformed YAML (with its line and
    column), an empty document, or one that is not a mapping."""
    try:
        doc = yaml.load(text, Loader=loader)  # A SafeLoader.
    except yaml.YAMLError as exc:
        raise ValidationError(f"invalid YAML: {_yaml_problem(exc)}") from None
    if doc is None:
        raise ValidationError(f"empty {kind}: expected a YAML mapping with {contents}")
    if not isinstance(doc, dict):
        raise ValidationError(
            f"invalid {kind}: expected a YAML mapping at the top, got {type_name(doc)}"
        )
    return doc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "malformed document"
        if mark is not None:
            return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
        return problem
    return " ".join(str(exc).split())


# Writing ---------------------------------------------------------------------------------

# What gopkg.in/yaml.v2 (gazctl's YAML, v2.4.0: resolve.go) reads from a plain scalar as
# something other than a string.
_GO_YAML_WORDS = frozenset(
    "y Y yes Yes YES true True TRUE on On ON n N no No NO false False FALSE off Off OFF "
    "~ null Null NULL .nan .NaN .NAN .inf .Inf .INF +.inf +.Inf +.INF -.inf -.Inf -.INF <<".split()
) | {""}
_GO_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_GO_YAML_BASE60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_GO_INT = re.compile(
    r"([-+]?)(0[xX]([0-9a-fA-F]+)|0[oO]([0-7]+)|0[bB]([01]+)|0([0-7]*)|([1-9][0-9]*))"
)
_GO_TIMESTAMP = re.compile(
    r"(\d{4})-(\d{1,2})-(\d{1,2})"
    r"(?:(?:[Tt](\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.\d+)?(?:Z|[-+]\d{2}:\d{2}))"
    r"|(?: (\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.\d+)?))?"
)


def _go_int(text: str) -> bool:
    """Whether Go's strconv.ParseInt(text, 0, 64), or ParseUint, takes `text`."""
    m = _GO_INT.fullmatch(text)
    if m is None:
        return False
    sign, _, hexa, octal, binary, zero_octal, decimal = m.groups()
    digits, base = next(
        (d, b)
        for d, b in ((hexa, 16), (octal, 8), (binary, 2), (zero_octal, 8), (decimal, 10))
        if d is not None
    )
    value = int(digits or "0", base)
    return value <= (1 << 63) - (sign != "-") if sign else value < 1 << 64


def _go_float(text: str) -> bool:
    """Whether Go's strconv.ParseFloat(text, 64) takes `text` (of `_GO_YAML_FLOAT`'s form)."""
    return math.isfinite(float(text))


def _go_timestamp(text: str) -> bool:
    """Whether yaml.v2's parseTimestamp takes `text` (a date, or a date and time)."""
    m = _GO_TIMESTAMP.fullmatch(text)
    if m is None:
        return False
    year, month, day = (int(x) for x in m.group(1, 2, 3))
    clock = [int(x) for x in (m.group(4, 5, 6) if m.group(4) else m.group(7, 8, 9)) if x]
    try:
        datetime.date(year, month, day)
    except ValueError:
        return False
    return not clock or (clock[0] < 24 and clock[1] < 60 and clock[2] < 60)


def go_yaml_quotes(text: str) -> bool:
    """Whether gazctl's YAML (gopkg.in/yaml.v2) writes the string `text` double-quoted: a
    plain scalar of it would read back as a boolean, number, null or timestamp (encode.go's
    stringv). PyYAML single-quotes what its own resolver would misread: writing these
    double-quoted makes a listing byte for byte gazctl's."""
    if text in _GO_YAML_WORDS or _GO_YAML_BASE60.fullmatch(text):
        return True
    first = text[0]
    if first == ".":
        return bool(_GO_YAML_FLOAT.fullmatch(text)) and _go_float(text)
    if first not in "+-0123456789":
        return False
    if _go_timestamp(text):
        return True
    plain = text.replace("_", "")
    if _go_int(plain) or (_GO_YAML_FLOAT.fullmatch(plain) and _go_float(plain)):
        return True
    for prefix, sign in (("0b", ""), ("-0b", "-")):
        if plain.startswith(prefix) and _go_int(f"{sign}0b{plain[len(prefix) :]}"):
            return True
    return False


class SpecDumper(yaml.SafeDumper):
    """Writes strings as gazctl's YAML does where PyYAML would not: double-quoted if a plain
    scalar of it would read as another type (`go_yaml_quotes`: "", "1", "true", "1e3"), and
    double-quoted (escaped) if it holds line breaks, so that it reads back exactly (plain and
    single-quoted styles fold or drop some line breaks)."""


_LINE_BREAKS = frozenset("\n\r\x85\u2028\u2029")


def _represent_str(dumper: SpecDumper, value: str) -> yaml.ScalarNode:
    if _LINE_BREAKS.intersection(value) or go_yaml_quotes(value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    return dumper.represent_str(value)


SpecDumper.add_representer(str, _represent_str)


# Fields ----------------------------------------------------------------------------------


def field_error(where: str, message: str) -> ValidationError:
    return ValidationError(f"{where}: {message}")


def type_name(value: Any) -> str:
    """What a YAML value is, for an error message ("nothing" for a missing value)."""
    return "nothing" if value is None else type(value).__name__


def parse_int(
    value: Any, where: str, key: str, lo: int | None = None, hi: int | None = None
) -> int:
    """An integer, within `[lo, hi]` if those are given.

    A float that is a whole number (`2.0`, `1e3`) is that integer, as gazctl reads it. One
    that is not (`2.5`) is refused: gazctl would silently truncate it to 2."""
    if isinstance(value, float) and math.isfinite(value):
        if not value.is_integer():
            raise field_error(where, f"{key}: expected an integer, got {value!r}")
        value = int(value)
    if _is_bool(value) or not isinstance(value, int):
        raise field_error(where, f"{key}: expected an integer, got {value!r}")
    if lo is not None and hi is not None and not lo <= value <= hi:
        raise field_error(where, f"{key}: {value} is out of range [{lo}, {hi}]")
    return int(value)


def parse_str(value: Any, where: str, key: str) -> str:
    """A string; a number or boolean read from YAML is taken as written, as gazctl (YAML v2)
    reads a plain scalar into a string field (an integer not read from YAML: its digits)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (YamlInt, YamlFloat, YamlBool)):
        return value.text
    if isinstance(value, int) and not _is_bool(value):
        return str(value)
    raise field_error(where, f"{key}: expected a string, got {value!r}")


def parse_bool(value: Any, where: str, key: str) -> bool:
    if not _is_bool(value):
        raise field_error(where, f"{key}: expected true or false, got {value!r}")
    return bool(value)


def parse_duration_ns(
    value: Any, where: str, key: str, examples: str, *, allow_negative: bool = False
) -> int:
    """Nanoseconds of a non-negative Go duration (or 0; a negative one too with
    `allow_negative`); `examples` ("1s or 100ms") are named when the value is not a string."""
    if isinstance(value, int) and not _is_bool(value) and value == 0:
        return 0
    if not isinstance(value, str):
        raise field_error(where, f"{key}: expected a duration such as {examples}, got {value!r}")
    try:
        ns = parse_duration(value)
    except ValidationError as exc:
        raise field_error(where, f"{key}: {exc}") from None
    if ns < 0 and not allow_negative:
        raise field_error(where, f"{key}: negative duration {value!r}")
    return ns


def parse_mapping(value: Any, where: str, key: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise field_error(where, f"{key}: expected a mapping, got {type_name(value)}")
    return value


def check_keys(obj: dict[Any, Any], allowed: Sequence[str], where: str, what: str) -> None:
    """Refuse any key of `obj` that is not `allowed` (a `what` field)."""
    for key in obj:
        if key not in allowed:
            raise field_error(
                where, f"unknown {what} field {key!r} (expected one of: {', '.join(allowed)})"
            )


def parse_labels(value: Any, where: str) -> pb.LabelSet:
    """A list of `{name, value}` entries (a missing value is "")."""
    if value is None:
        return pb.LabelSet()
    if not isinstance(value, list):
        raise field_error(where, "labels: expected a list of {name, value} entries")
    pairs: list[tuple[str, str]] = []
    for item in value:
        item = parse_mapping(item, where, "labels")
        check_keys(item, ("name", "value"), where, "label")
        if not item.get("name"):
            raise field_error(where, "labels: every label needs a name")
        raw_value = item.get("value")
        pairs.append(
            (
                parse_str(item["name"], where, "labels.name"),
                "" if raw_value is None else parse_str(raw_value, where, "labels.value"),
            )
        )
    return label_set(pairs)


def labels_to_yaml(labels: pb.LabelSet) -> list[dict[str, str]]:
    """The inverse of `parse_labels`."""
    return [{"name": lb.name, "value": lb.value} for lb in labels.labels]


# Duration fields of specs ----------------------------------------------------------------


def duration_field(msg: message.Message, name: str) -> int:
    """Nanoseconds of the Duration field `name` of `msg` (0 if unset)."""
    return int(getattr(msg, name).ToNanoseconds()) if msg.HasField(name) else 0


def set_duration_field(msg: message.Message, name: str, ns: int) -> None:
    """Set the Duration field `name` of `msg` to `ns` nanoseconds, clearing it for 0."""
    if ns:
        getattr(msg, name).FromNanoseconds(ns)
    else:
        msg.ClearField(name)
