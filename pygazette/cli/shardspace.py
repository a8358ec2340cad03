"""Gazette's "shardspace": the compact, editable YAML form of many ShardSpecs.

A shardspace holds a `common` ShardSpec and a list of `shards`. Each shard names its `id`
and the fields in which it differs; a field a shard leaves zero takes the common value
(labels merge name by name, the shard's values of a name replacing the common ones). A shard
may carry a `comment`, `delete: true` (delete the shard) and the `revision` an apply expects
(0: create it, -1: apply regardless). It is `consumer/shardspace.Set` of Gazette, and reads
and writes the same YAML as `gazctl shards list --format yaml` / `gazctl shards apply`:

    common:
      recovery_log_prefix: recovery/logs
      hint_prefix: /hints
      hint_backups: 2
      max_txn_duration: 1s
      hot_standbys: 1
      labels:
      - name: app
        value: counter
    shards:
    - id: shard-A
      sources:
      - journal: journal/A
      revision: 123
    - id: shard-B
      sources:
      - journal: journal/B
        min_offset: 1024
      disable: true

`parse_shardspace` reads and checks such a document (errors name the shard and field at
fault), `flatten` / `apply_request` push the common spec down into complete, validated
ShardSpecs, `from_list` hoists the values every listed shard shares into `common` as gazctl
does, and `dump_shardspace` writes the YAML back. Durations are Go durations ("1s", "100ms").
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from pygazette.cli.journalspace import duration_from_ns, duration_ns
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.go_duration import format_duration, parse_duration
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.shard_validation import (
    intersect_shard_specs,
    subtract_shard_specs,
    union_shard_specs,
    validate_shard_spec,
)

__all__ = [
    "ShardEntry",
    "ShardSet",
    "apply_request",
    "dump_shardspace",
    "flatten",
    "from_list",
    "parse_shardspace",
]

_INT32_MAX = (1 << 31) - 1
_UINT32_MAX = (1 << 32) - 1
_INT64_MAX = (1 << 63) - 1

# Spec algebra ----------------------------------------------------------------------------
#
# Gazette's union / intersect / subtract of ShardSpecs live in protocol.shard_validation; a
# zero field (0, "", false, empty list, zero duration) is "not specified" there and here.

_DURATIONS = ("max_txn_duration", "min_txn_duration")


def _copy(spec: cpb.ShardSpec) -> cpb.ShardSpec:
    out = cpb.ShardSpec()
    out.CopyFrom(spec)
    return out


def _dur(spec: cpb.ShardSpec, name: str) -> int:
    return duration_ns(getattr(spec, name)) if spec.HasField(name) else 0


def _set_dur(spec: cpb.ShardSpec, name: str, ns: int) -> None:
    if ns:
        getattr(spec, name).CopyFrom(duration_from_ns(ns))
    else:
        spec.ClearField(name)


def tidy(spec: cpb.ShardSpec) -> cpb.ShardSpec:
    """Clear zero durations and empty labels (in place), so that equal specs compare equal."""
    for name in _DURATIONS:
        if spec.HasField(name) and not _dur(spec, name):
            spec.ClearField(name)
    if spec.HasField("labels") and not spec.labels.labels:
        spec.ClearField("labels")
    return spec


# The set ---------------------------------------------------------------------------------


@dataclass
class ShardEntry:
    """One shard of a shardspace: a (possibly partial) spec and its apply metadata."""

    spec: cpb.ShardSpec = field(default_factory=cpb.ShardSpec)
    comment: str = ""
    delete: bool | None = None
    revision: int = 0

    @property
    def id(self) -> str:
        return self.spec.id


@dataclass
class ShardSet:
    """A shardspace: `common` configuration and the shards inheriting it."""

    common: cpb.ShardSpec = field(default_factory=cpb.ShardSpec)
    shards: list[ShardEntry] = field(default_factory=list)

    def hoist(self) -> None:
        """Move the values that every shard shares into `common`, zeroing them at each shard
        (Gazette's `Set.Hoist`)."""
        for i, entry in enumerate(self.shards):
            if i == 0:
                self.common = _copy(entry.spec)
                self.common.id = ""
            else:
                self.common = intersect_shard_specs(self.common, entry.spec)
        tidy(self.common)
        for entry in self.shards:
            entry.spec = subtract_shard_specs(entry.spec, self.common)

    def push_down(self) -> None:
        """Fill each shard's zero fields from `common`, then clear `common` (Gazette's
        `Set.PushDown`)."""
        for entry in self.shards:
            entry.spec = union_shard_specs(entry.spec, self.common)
        self.common = cpb.ShardSpec()


def from_list(shards: Iterable[cpb.ListResponse.Shard]) -> ShardSet:
    """The hoisted shardspace of listed shards (mod revisions become revisions), as
    `gazctl shards list --format yaml` prints it."""
    out = ShardSet(
        shards=[
            ShardEntry(spec=tidy(_copy(s.spec)), revision=s.mod_revision)
            for s in sorted(shards, key=lambda s: s.spec.id)
        ]
    )
    out.hoist()
    return out


def flatten(shard_set: ShardSet) -> list[ShardEntry]:
    """Every shard with the common spec pushed down into it; the specs of shards not being
    deleted are complete and validated (errors name the shard)."""
    flat = copy.deepcopy(shard_set)
    flat.push_down()
    for entry in flat.shards:
        if entry.delete:
            continue
        try:
            validate_shard_spec(entry.spec)
        except ValidationError as exc:
            raise ValidationError(f"shard {entry.id!r}: {exc}") from None
    return flat.shards


def apply_request(shard_set: ShardSet) -> cpb.ApplyRequest:
    """The ApplyRequest of a shardspace: per shard an upsert guarded by its revision (0 for
    a new shard, -1 for "regardless"), or a delete."""
    request = cpb.ApplyRequest()
    for entry in flatten(shard_set):
        change = request.changes.add()
        change.expect_mod_revision = entry.revision
        if entry.delete:
            if entry.revision == 0:
                raise ValidationError(
                    f"shard {entry.id!r}: a delete needs the shard's current revision "
                    "(or revision: -1 to delete it regardless)"
                )
            change.delete = entry.id
        else:
            change.upsert.CopyFrom(entry.spec)
    return request


# YAML: reading ---------------------------------------------------------------------------

_SHARD_KEYS = ("comment", "delete", "revision")
_SPEC_KEYS = (
    "id",
    "sources",
    "recovery_log_prefix",
    "hint_prefix",
    "hint_backups",
    "max_txn_duration",
    "min_txn_duration",
    "disable",
    "hot_standbys",
    "labels",
    "disable_wait_for_ack",
    "ring_buffer_size",
    "read_channel_size",
)
_SOURCE_KEYS = ("journal", "min_offset")
_TOP_KEYS = ("common", "shards")


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate mapping keys, as Gazette's strict decoding does."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
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
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,  # type: ignore[arg-type]
)


def _fail(where: str, message: str) -> ValidationError:
    return ValidationError(f"{where}: {message}")


def _int(value: Any, where: str, key: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"{key}: expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise _fail(where, f"{key}: {value} is out of range [{lo}, {hi}]")
    return value


def _str(value: Any, where: str, key: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise _fail(where, f"{key}: expected a string, got {value!r}")


def _bool(value: Any, where: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, f"{key}: expected true or false, got {value!r}")
    return value


def _duration(value: Any, where: str, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        return 0
    if not isinstance(value, str):
        raise _fail(where, f"{key}: expected a duration such as 1s or 100ms, got {value!r}")
    try:
        ns = parse_duration(value)
    except ValidationError as exc:
        raise _fail(where, f"{key}: {exc}") from None
    if ns < 0:
        raise _fail(where, f"{key}: negative duration {value!r}")
    return ns


def _mapping(value: Any, where: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, f"{key}: expected a mapping, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _check_keys(obj: dict[Any, Any], allowed: Sequence[str], where: str, what: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _fail(
                where, f"unknown {what} field {key!r} (expected one of: {', '.join(allowed)})"
            )


def _labels_from_yaml(value: Any, where: str) -> pb.LabelSet:
    if value is None:
        return pb.LabelSet()
    if not isinstance(value, list):
        raise _fail(where, "labels: expected a list of {name, value} entries")
    pairs: list[tuple[str, str]] = []
    for item in value:
        item = _mapping(item, where, "labels")
        _check_keys(item, ("name", "value"), where, "label")
        if not item.get("name"):
            raise _fail(where, "labels: every label needs a name")
        raw_value = item.get("value")
        pairs.append(
            (
                _str(item["name"], where, "labels.name"),
                "" if raw_value is None else _str(raw_value, where, "labels.value"),
            )
        )
    return label_set(pairs)


def _sources_from_yaml(value: Any, where: str) -> list[cpb.ShardSpec.Source]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(where, "sources: expected a list of {journal, min_offset} entries")
    out: list[cpb.ShardSpec.Source] = []
    for i, item in enumerate(value):
        key = f"sources[{i}]"
        item = _mapping(item, where, key)
        _check_keys(item, _SOURCE_KEYS, where, "source")
        source = cpb.ShardSpec.Source()
        if item.get("journal") is None:
            raise _fail(where, f"{key}: a source needs a journal")
        source.journal = _str(item["journal"], where, f"{key}.journal")
        if item.get("min_offset") is not None:
            source.min_offset = _int(item["min_offset"], where, f"{key}.min_offset", 0, _INT64_MAX)
        out.append(source)
    return out


def _spec_from_yaml(obj: dict[str, Any], where: str) -> cpb.ShardSpec:
    spec = cpb.ShardSpec()
    if obj.get("id") is not None:
        spec.id = _str(obj["id"], where, "id")
    spec.sources.extend(_sources_from_yaml(obj.get("sources"), where))
    for name in ("recovery_log_prefix", "hint_prefix"):
        if obj.get(name) is not None:
            setattr(spec, name, _str(obj[name], where, name))
    if obj.get("hint_backups") is not None:
        spec.hint_backups = _int(obj["hint_backups"], where, "hint_backups", 0, _INT32_MAX)
    for name in _DURATIONS:
        if obj.get(name) is not None:
            _set_dur(spec, name, _duration(obj[name], where, name))
    for name in ("disable", "disable_wait_for_ack"):
        if obj.get(name) is not None:
            setattr(spec, name, _bool(obj[name], where, name))
    for name in ("hot_standbys", "ring_buffer_size", "read_channel_size"):
        if obj.get(name) is not None:
            setattr(spec, name, _int(obj[name], where, name, 0, _UINT32_MAX))
    labels = _labels_from_yaml(obj.get("labels"), where)
    if labels.labels:
        spec.labels.CopyFrom(labels)
    return tidy(spec)


def _shard_from_yaml(obj: Any, index: int) -> ShardEntry:
    where = f"shards[{index}]"
    if not isinstance(obj, dict):
        raise _fail(where, f"expected a mapping of shard fields, got {_kind(obj)}")
    if obj.get("id") in (None, ""):
        raise _fail(where, "every shard needs an id")
    shard_id = _str(obj["id"], where, "id")
    where = f"shard {shard_id!r}"
    _check_keys(obj, _SHARD_KEYS + _SPEC_KEYS, where, "shard")
    entry = ShardEntry(spec=_spec_from_yaml(obj, where))
    if obj.get("comment") is not None:
        entry.comment = _str(obj["comment"], where, "comment")
    if obj.get("delete") is not None:
        entry.delete = _bool(obj["delete"], where, "delete")
    if obj.get("revision") is not None:
        entry.revision = _int(obj["revision"], where, "revision", -1, _INT64_MAX)
    return entry


def parse_shardspace(text: str | bytes) -> ShardSet:
    """Parse and check a shardspace YAML document; errors are one line naming the shard and
    field at fault. Specs stay partial: `flatten` or `apply_request` validates them whole."""
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # A SafeLoader.
    except yaml.YAMLError as exc:
        raise ValidationError(f"invalid YAML: {_yaml_problem(exc)}") from None
    if doc is None:
        raise ValidationError("empty shardspace: expected a YAML mapping with common and shards")
    if not isinstance(doc, dict):
        raise ValidationError(
            f"invalid shardspace: expected a YAML mapping at the top, got {_kind(doc)}"
        )
    _check_keys(doc, _TOP_KEYS, "shardspace", "top-level")
    out = ShardSet()
    common = doc.get("common")
    if common is not None:
        common = _mapping(common, "shardspace", "common")
        _check_keys(common, _SPEC_KEYS[1:], "common", "common spec")
        out.common = _spec_from_yaml(common, "common")
    shards = doc.get("shards")
    if shards is not None:
        if not isinstance(shards, list):
            raise _fail("shardspace", f"shards: expected a list of shards, got {_kind(shards)}")
        seen: set[str] = set()
        for i, obj in enumerate(shards):
            entry = _shard_from_yaml(obj, i)
            if entry.id in seen:
                raise _fail(f"shard {entry.id!r}", "listed more than once")
            seen.add(entry.id)
            out.shards.append(entry)
    return out


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "malformed document"
        if mark is not None:
            return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
        return problem
    return " ".join(str(exc).split())


# YAML: writing ---------------------------------------------------------------------------


def spec_to_yaml_obj(spec: cpb.ShardSpec) -> dict[str, Any]:
    """A (partial) spec as plain data: Gazette's field names and order, zero values omitted."""
    out: dict[str, Any] = {}
    if spec.id:
        out["id"] = spec.id
    if spec.sources:
        sources: list[dict[str, Any]] = []
        for s in spec.sources:
            item: dict[str, Any] = {"journal": s.journal}
            if s.min_offset:
                item["min_offset"] = s.min_offset
            sources.append(item)
        out["sources"] = sources
    if spec.recovery_log_prefix:
        out["recovery_log_prefix"] = spec.recovery_log_prefix
    if spec.hint_prefix:
        out["hint_prefix"] = spec.hint_prefix
    if spec.hint_backups:
        out["hint_backups"] = spec.hint_backups
    for name in _DURATIONS:
        ns = _dur(spec, name)
        if ns:
            out[name] = format_duration(ns)
    if spec.disable:
        out["disable"] = True
    if spec.hot_standbys:
        out["hot_standbys"] = spec.hot_standbys
    if spec.labels.labels:
        out["labels"] = [{"name": lb.name, "value": lb.value} for lb in spec.labels.labels]
    if spec.disable_wait_for_ack:
        out["disable_wait_for_ack"] = True
    if spec.ring_buffer_size:
        out["ring_buffer_size"] = spec.ring_buffer_size
    if spec.read_channel_size:
        out["read_channel_size"] = spec.read_channel_size
    return out


def shard_set_to_yaml_obj(shard_set: ShardSet) -> dict[str, Any]:
    shards: list[dict[str, Any]] = []
    for entry in shard_set.shards:
        obj: dict[str, Any] = {}
        if entry.comment:
            obj["comment"] = entry.comment
        if entry.delete is not None:
            obj["delete"] = entry.delete
        obj.update(spec_to_yaml_obj(entry.spec))
        if entry.revision:
            obj["revision"] = entry.revision
        shards.append(obj)
    common = spec_to_yaml_obj(shard_set.common)
    common.pop("id", None)
    return {"common": common, "shards": shards}


class _Dumper(yaml.SafeDumper):
    """Writes strings holding line breaks double-quoted (escaped), so that every string
    reads back exactly: plain and single-quoted styles fold or drop some line breaks."""


_LINE_BREAKS = frozenset("\n\r\x85\u2028\u2029")


def _represent_str(dumper: _Dumper, value: str) -> yaml.ScalarNode:
    if _LINE_BREAKS.intersection(value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    return dumper.represent_str(value)


_Dumper.add_representer(str, _represent_str)


def dump_shardspace(shard_set: ShardSet) -> str:
    """The shardspace as YAML that `parse_shardspace` (and gazctl) reads back."""
    return yaml.dump(
        shard_set_to_yaml_obj(shard_set),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1 << 16,
    )
