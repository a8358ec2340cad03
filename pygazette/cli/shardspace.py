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
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml

from pygazette.cli.spec_yaml import (
    SpecDumper,
    check_keys,
    duration_field,
    field_error,
    labels_to_yaml,
    load_document,
    parse_bool,
    parse_duration_ns,
    parse_int,
    parse_labels,
    parse_mapping,
    parse_str,
    set_duration_field,
    type_name,
)
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.go_duration import format_duration
from pygazette.protocol.pb import consumer_pb2 as cpb
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


def tidy(spec: cpb.ShardSpec) -> cpb.ShardSpec:
    """Clear zero durations and empty labels (in place), so that equal specs compare equal."""
    for name in _DURATIONS:
        if spec.HasField(name) and not duration_field(spec, name):
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


_DURATION_EXAMPLES = "1s or 100ms"


def _sources_from_yaml(value: Any, where: str) -> list[cpb.ShardSpec.Source]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise field_error(where, "sources: expected a list of {journal, min_offset} entries")
    out: list[cpb.ShardSpec.Source] = []
    for i, item in enumerate(value):
        key = f"sources[{i}]"
        item = parse_mapping(item, where, key)
        check_keys(item, _SOURCE_KEYS, where, "source")
        source = cpb.ShardSpec.Source()
        if item.get("journal") is None:
            raise field_error(where, f"{key}: a source needs a journal")
        source.journal = parse_str(item["journal"], where, f"{key}.journal")
        if item.get("min_offset") is not None:
            source.min_offset = parse_int(
                item["min_offset"], where, f"{key}.min_offset", 0, _INT64_MAX
            )
        out.append(source)
    return out


def _spec_from_yaml(obj: dict[str, Any], where: str) -> cpb.ShardSpec:
    spec = cpb.ShardSpec()
    if obj.get("id") is not None:
        spec.id = parse_str(obj["id"], where, "id")
    spec.sources.extend(_sources_from_yaml(obj.get("sources"), where))
    for name in ("recovery_log_prefix", "hint_prefix"):
        if obj.get(name) is not None:
            setattr(spec, name, parse_str(obj[name], where, name))
    if obj.get("hint_backups") is not None:
        spec.hint_backups = parse_int(obj["hint_backups"], where, "hint_backups", 0, _INT32_MAX)
    for name in _DURATIONS:
        if obj.get(name) is not None:
            set_duration_field(
                spec, name, parse_duration_ns(obj[name], where, name, _DURATION_EXAMPLES)
            )
    for name in ("disable", "disable_wait_for_ack"):
        if obj.get(name) is not None:
            setattr(spec, name, parse_bool(obj[name], where, name))
    for name in ("hot_standbys", "ring_buffer_size", "read_channel_size"):
        if obj.get(name) is not None:
            setattr(spec, name, parse_int(obj[name], where, name, 0, _UINT32_MAX))
    labels = parse_labels(obj.get("labels"), where)
    if labels.labels:
        spec.labels.CopyFrom(labels)
    return tidy(spec)


def _shard_from_yaml(obj: Any, index: int) -> ShardEntry:
    where = f"shards[{index}]"
    if not isinstance(obj, dict):
        raise field_error(where, f"expected a mapping of shard fields, got {type_name(obj)}")
    if obj.get("id") in (None, ""):
        raise field_error(where, "every shard needs an id")
    shard_id = parse_str(obj["id"], where, "id")
    where = f"shard {shard_id!r}"
    check_keys(obj, _SHARD_KEYS + _SPEC_KEYS, where, "shard")
    entry = ShardEntry(spec=_spec_from_yaml(obj, where))
    if obj.get("comment") is not None:
        entry.comment = parse_str(obj["comment"], where, "comment")
    if obj.get("delete") is not None:
        entry.delete = parse_bool(obj["delete"], where, "delete")
    if obj.get("revision") is not None:
        entry.revision = parse_int(obj["revision"], where, "revision", -1, _INT64_MAX)
    return entry


def parse_shardspace(text: str | bytes) -> ShardSet:
    """Parse and check a shardspace YAML document; errors are one line naming the shard and
    field at fault. Specs stay partial: `flatten` or `apply_request` validates them whole."""
    doc = load_document(text, "shardspace", "common and shards")
    check_keys(doc, _TOP_KEYS, "shardspace", "top-level")
    out = ShardSet()
    common = doc.get("common")
    if common is not None:
        common = parse_mapping(common, "shardspace", "common")
        check_keys(common, _SPEC_KEYS[1:], "common", "common spec")
        out.common = _spec_from_yaml(common, "common")
    shards = doc.get("shards")
    if shards is not None:
        if not isinstance(shards, list):
            raise field_error(
                "shardspace", f"shards: expected a list of shards, got {type_name(shards)}"
            )
        seen: set[str] = set()
        for i, obj in enumerate(shards):
            entry = _shard_from_yaml(obj, i)
            if entry.id in seen:
                raise field_error(f"shard {entry.id!r}", "listed more than once")
            seen.add(entry.id)
            out.shards.append(entry)
    return out


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
        ns = duration_field(spec, name)
        if ns:
            out[name] = format_duration(ns)
    if spec.disable:
        out["disable"] = True
    if spec.hot_standbys:
        out["hot_standbys"] = spec.hot_standbys
    if spec.labels.labels:
        out["labels"] = labels_to_yaml(spec.labels)
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


def dump_shardspace(shard_set: ShardSet) -> str:
    """The shardspace as YAML that `parse_shardspace` (and gazctl) reads back."""
    return yaml.dump(
        shard_set_to_yaml_obj(shard_set),
        Dumper=SpecDumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1 << 16,
    )
