"""gazctl's hierarchical YAML "journalspace": a compact, editable form of many JournalSpecs.

A journalspace is a tree of nodes. A node whose name is empty or ends in '/' is a directory:
it holds a partial spec that its children inherit, and one or more children whose names it
prefixes. Any other node is a journal (a leaf), named in full. A field left zero on a node
takes its parent's value; labels merge name by name (a child's values of a label name replace
the parent's). `delete: true` on a node deletes every journal listed beneath it; `revision` on
a journal is the mod revision the apply expects (0: create, -1: apply unconditionally).

    name: examples/
    replication: 1
    labels:
    - name: app
      value: examples
    fragment:
      length: 268435456
      compression_codec: SNAPPY
      stores: [file:///]
      refresh_interval: 1m0s
    children:
    - name: examples/clicks
    - name: examples/views
      revision: 12

`parse_journalspace` reads and validates such a tree (errors name the node at fault),
`apply_request` flattens it into an ApplyRequest, and `from_list` builds the tree back from a
listing, hoisting the values shared by siblings into their common parent directories, as
`gazctl journals list --format yaml` does. Durations are Go durations ("5m", "1h0m0s").
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
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
from pygazette.protocol.labels import (
    intersect_label_sets,
    subtract_label_sets,
    union_label_sets,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import (
    validate_journal_name,
    validate_journal_spec,
    validate_journal_spec_durations,
)

# Spec algebra ----------------------------------------------------------------------------
#
# Partial specs: a zero field (0, "", empty list, unset or zero duration) is "not specified".

_FRAGMENT_SCALARS = ("length", "compression_codec", "path_postfix_template")
_FRAGMENT_DURATIONS = ("refresh_interval", "retention", "flush_interval")
_SPEC_SCALARS = ("replication", "flags", "max_append_rate")


def _copy_spec(spec: pb.JournalSpec) -> pb.JournalSpec:
    out = pb.JournalSpec()
    out.CopyFrom(spec)
    return out


def _set_labels(spec: pb.JournalSpec, labels: pb.LabelSet) -> None:
    if labels.labels:
        spec.labels.CopyFrom(labels)
    else:
        spec.ClearField("labels")


def _tidy(spec: pb.JournalSpec) -> pb.JournalSpec:
    """Drop empty sub-messages, so that equal partial specs compare equal. An empty suspend
    stays: Go's spec holds it by pointer, and gazctl writes a present one ('suspend: {}',
    as a journal resumed after a suspension has) and applies it as written."""
    if spec.HasField("fragment") and not spec.fragment.ListFields():
        spec.ClearField("fragment")
    if spec.HasField("labels") and not spec.labels.labels:
        spec.ClearField("labels")
    return spec


def union_specs(a: pb.JournalSpec, b: pb.JournalSpec) -> pb.JournalSpec:
    """`a`, with each field `a` leaves unspecified taken from `b` (labels merged, `a` first)."""
    out = _copy_spec(a)
    for name in _SPEC_SCALARS:
        if not getattr(out, name):
            setattr(out, name, getattr(b, name))
    _set_labels(out, union_label_sets(a.labels, b.labels))
    fa, fb = out.fragment, b.fragment
    for name in _FRAGMENT_SCALARS:
        if not getattr(fa, name):
            setattr(fa, name, getattr(fb, name))
    if not fa.stores:
        fa.stores.extend(fb.stores)
    for name in _FRAGMENT_DURATIONS:
        if not duration_field(fa, name):
            set_duration_field(fa, name, duration_field(fb, name))
    return _tidy(out)


def intersect_specs(a: pb.JournalSpec, b: pb.JournalSpec) -> pb.JournalSpec:
    """The fields on which `a` and `b` agree (others unspecified). Suspension is not shared."""
    out = _copy_spec(a)
    for name in _SPEC_SCALARS:
        if getattr(out, name) != getattr(b, name):
            out.ClearField(name)
    _set_labels(out, intersect_label_sets(a.labels, b.labels))
    fa, fb = out.fragment, b.fragment
    for name in _FRAGMENT_SCALARS:
        if getattr(fa, name) != getattr(fb, name):
            fa.ClearField(name)
    if list(fa.stores) != list(fb.stores):
        fa.ClearField("stores")
    for name in _FRAGMENT_DURATIONS:
        if duration_field(fa, name) != duration_field(fb, name):
            fa.ClearField(name)
    out.ClearField("suspend")
    return _tidy(out)


def subtract_specs(a: pb.JournalSpec, b: pb.JournalSpec) -> pb.JournalSpec:
    """`a`, with every field that `b` specifies identically made unspecified."""
    out = _copy_spec(a)
    for name in _SPEC_SCALARS:
        if getattr(out, name) == getattr(b, name):
            out.ClearField(name)
    _set_labels(out, subtract_label_sets(a.labels, b.labels))
    fa, fb = out.fragment, b.fragment
    for name in _FRAGMENT_SCALARS:
        if getattr(fa, name) == getattr(fb, name):
            fa.ClearField(name)
    if list(fa.stores) == list(fb.stores):
        fa.ClearField("stores")
    for name in _FRAGMENT_DURATIONS:
        if duration_field(fa, name) == duration_field(fb, name):
            fa.ClearField(name)
    return _tidy(out)


# The tree --------------------------------------------------------------------------------


@dataclass
class Node:
    """One node of a journalspace: a directory (name "" or ending in '/') or a journal."""

    spec: pb.JournalSpec = field(default_factory=pb.JournalSpec)
    comment: str = ""
    delete: bool | None = None
    revision: int = 0
    children: list[Node] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_dir(self) -> bool:
        return self.spec.name == "" or self.spec.name.endswith("/")

    def validate(self) -> None:
        """Check the tree's shape (not its specs, which may be partial), naming the node."""
        where = _where(self)
        if self.is_dir:
            if self.revision != 0:
                raise ValidationError(
                    f"{where}: unexpected revision ({self.revision}) on a directory node"
                )
            if not self.children:
                raise ValidationError(f"{where}: a directory node needs one or more children")
            for i, child in enumerate(self.children):
                if not child.name.startswith(self.name):
                    raise ValidationError(
                        f"{where}: child {child.name!r} is not prefixed by its parent's name"
                    )
                if i and self.children[i - 1].name >= child.name:
                    raise ValidationError(
                        f"{where}: children must be ordered by name and unique "
                        f"({self.children[i - 1].name!r} then {child.name!r})"
                    )
                child.validate()
            return
        try:
            validate_journal_name(self.name, allow_meta=False)
        except ValidationError as exc:
            raise ValidationError(f"{where}: invalid journal name: {exc}") from None
        if self.children:
            raise ValidationError(
                f"{where}: a journal node (its name does not end in '/') cannot have children"
            )

    def walk_journals(self) -> Iterator[Node]:
        """The journal (leaf) nodes of the tree, in order."""
        if not self.is_dir:
            yield self
            return
        for child in self.children:
            yield from child.walk_journals()

    def push_down(self) -> None:
        """Copy inherited values down to every journal, leaving directories bare."""
        for child in self.children:
            if child.delete is None:
                child.delete = self.delete
            child.spec = union_specs(child.spec, self.spec)
            child.push_down()
        if self.is_dir:
            self.delete = None
            self.spec = pb.JournalSpec(name=self.spec.name)

    def hoist(self) -> None:
        """Move values every child shares into their directory (bottom-up), removing them from
        the children."""
        if not self.is_dir:
            return
        for child in self.children:
            child.hoist()
        name = self.spec.name
        shared: pb.JournalSpec | None = None
        delete: bool | None = None
        for i, child in enumerate(self.children):
            if i == 0:
                shared, delete = _copy_spec(child.spec), child.delete
            else:
                assert shared is not None
                shared = intersect_specs(shared, child.spec)
                if delete != child.delete:
                    delete = None
        if shared is None:
            return
        shared.name = name
        shared.ClearField("suspend")  # Suspension belongs to each journal.
        self.spec = _tidy(shared)
        self.delete = delete
        for child in self.children:
            if delete is not None:
                child.delete = None
            child.spec = subtract_specs(child.spec, self.spec)
            child.spec.name = child.name


def _where(node: Node) -> str:
    return f"node {node.name!r}" if node.name else "root node"


def shared_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` ending at a '/'."""
    if len(a) > len(b):
        a, b = b, a
    length = 0
    while True:
        idx = a.find("/", length)
        if idx == -1 or a[: idx + 1] != b[: idx + 1]:
            return length
        length = idx + 1


def extract_tree(nodes: Sequence[Node]) -> Node:
    """Arrange name-ordered journal nodes under directory nodes of their shared prefixes.

    Directories are only introduced where they group journals: for "a/b/c/x" and "a/b/c/y"
    alone, the tree is one directory "a/b/c/" rather than "a/" > "a/b/" > "a/b/c/".
    """
    work = list(nodes)
    if not work:
        return Node()
    while len(work) > 1:
        # Find the longest run of adjacent nodes sharing the longest prefix, and group it.
        begin, end, best = 0, 0, -1
        for i in range(1, len(work)):
            n = shared_prefix(work[i].name, work[i - 1].name)
            if n > best:
                begin, end, best = i - 1, i + 1, n
            elif n == best and i == end:
                end = i + 1
        parent = Node(spec=pb.JournalSpec(name=work[begin].name[:best]), children=work[begin:end])
        work[begin:end] = [parent]
    return work[0]


def from_list(journals: Iterable[pb.ListResponse.Journal]) -> Node:
    """The hoisted tree of listed journals (mod revisions become node revisions)."""
    leaves = [
        Node(spec=_tidy(_copy_spec(j.spec)), revision=j.mod_revision)
        for j in sorted(journals, key=lambda j: j.spec.name)
    ]
    tree = extract_tree(leaves)
    tree.hoist()
    return tree


# ApplyRequest ----------------------------------------------------------------------------


def apply_request(tree: Node) -> pb.ApplyRequest:
    """Flatten a validated tree into changes: an upsert (guarded by the node's revision) or a
    delete per journal. Each upserted spec must be complete and valid, and each delete must
    expect a revision (as gazctl validates the whole request before applying any of it)."""
    flat = copy.deepcopy(tree)
    flat.push_down()
    request = pb.ApplyRequest()
    for node in flat.walk_journals():
        change = request.changes.add()
        change.expect_mod_revision = node.revision
        if node.delete:
            if node.revision == 0:
                raise ValidationError(
                    f"journal {node.name!r}: a delete needs the journal's current revision "
                    "(or revision: -1 to delete it regardless)"
                )
            change.delete = node.name
            continue
        spec = node.spec
        try:
            validate_journal_spec(spec)
            validate_journal_spec_durations(spec)  # As the broker's Apply checks them.
        except ValidationError as exc:
            raise ValidationError(f"journal {node.name!r}: {exc}") from None
        change.upsert.CopyFrom(spec)
    return request


# YAML ------------------------------------------------------------------------------------

_NODE_KEYS = ("comment", "delete", "revision", "children")
_SPEC_KEYS = ("name", "replication", "labels", "fragment", "flags", "max_append_rate", "suspend")
_FRAGMENT_KEYS = (
    "length",
    "compression_codec",
    "stores",
    "refresh_interval",
    "retention",
    "flush_interval",
    "path_postfix_template",
)

_DURATION_EXAMPLES = "5m or 1h30m"


# The ranges of the spec's protobuf integer fields (beyond them, setting one raises).
_INT32 = (-(1 << 31), (1 << 31) - 1)
_UINT32 = (0, (1 << 32) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _enum(value: Any, enum: Any, where: str, key: str, bounds: tuple[int, int] = _INT32) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return parse_int(value, where, key, *bounds)
    if isinstance(value, str):
        try:
            return int(enum.Value(value))
        except ValueError:
            pass
    options = ", ".join(enum.keys())
    raise field_error(where, f"{key}: {value!r} is not one of {options}")


def _fragment_from_yaml(value: Any, where: str) -> pb.JournalSpec.Fragment:
    frag = pb.JournalSpec.Fragment()
    if value is None:
        return frag
    obj = parse_mapping(value, where, "fragment")
    check_keys(obj, _FRAGMENT_KEYS, where, "fragment")
    if obj.get("length") is not None:
        frag.length = parse_int(obj["length"], where, "fragment.length", *_INT64)
    if obj.get("compression_codec") is not None:
        frag.compression_codec = _enum(  # type: ignore[assignment]
            obj["compression_codec"], pb.CompressionCodec, where, "fragment.compression_codec"
        )
    stores = obj.get("stores")
    if stores is not None:
        if isinstance(stores, str):
            stores = [stores]
        if not isinstance(stores, list):
            raise field_error(where, "fragment.stores: expected a list of store URLs")
        frag.stores.extend(parse_str(s, where, "fragment.stores") for s in stores)
    for name in _FRAGMENT_DURATIONS:
        if obj.get(name) is not None:
            # Gazette permits every retention (<= 0 keeps fragments forever), so a listing
            # may hold a negative one; a negative interval is refused by spec validation.
            ns = parse_duration_ns(
                obj[name],
                where,
                f"fragment.{name}",
                _DURATION_EXAMPLES,
                allow_negative=name == "retention",
            )
            set_duration_field(frag, name, ns)
    if obj.get("path_postfix_template") is not None:
        frag.path_postfix_template = parse_str(
            obj["path_postfix_template"], where, "fragment.path_postfix_template"
        )
    return frag


def _node_from_yaml(obj: Any, where: str) -> Node:
    if not isinstance(obj, dict):
        raise field_error(where, f"expected a mapping of node fields, got {type_name(obj)}")
    name = obj.get("name")
    spec = pb.JournalSpec()
    if name is not None:
        spec.name = parse_str(name, where, "name")
    here = f"node {spec.name!r}" if spec.name else where
    check_keys(obj, _SPEC_KEYS + _NODE_KEYS, here, "node")

    if obj.get("replication") is not None:
        spec.replication = parse_int(obj["replication"], here, "replication", *_INT32)
    _set_labels(spec, parse_labels(obj.get("labels"), here))
    frag = _fragment_from_yaml(obj.get("fragment"), here)
    if frag.ListFields():
        spec.fragment.CopyFrom(frag)
    if obj.get("flags") is not None:
        spec.flags = _enum(obj["flags"], pb.JournalSpec.Flag, here, "flags", _UINT32)
    if obj.get("max_append_rate") is not None:
        spec.max_append_rate = parse_int(obj["max_append_rate"], here, "max_append_rate", *_INT64)
    if obj.get("suspend") is not None:
        sus = parse_mapping(obj["suspend"], here, "suspend")
        check_keys(sus, ("level", "offset"), here, "suspend")
        spec.suspend.SetInParent()  # 'suspend: {}' too, as gazctl applies it.
        if sus.get("level") is not None:
            spec.suspend.level = _enum(  # type: ignore[assignment]
                sus["level"], pb.JournalSpec.Suspend.Level, here, "suspend.level"
            )
        if sus.get("offset") is not None:
            spec.suspend.offset = parse_int(sus["offset"], here, "suspend.offset", *_INT64)

    node = Node(spec=_tidy(spec))
    if obj.get("comment") is not None:
        node.comment = parse_str(obj["comment"], here, "comment")
    if obj.get("delete") is not None:
        node.delete = parse_bool(obj["delete"], here, "delete")
    if obj.get("revision") is not None:
        node.revision = parse_int(obj["revision"], here, "revision", *_INT64)
        if node.revision < -1:
            raise field_error(here, f"revision: expected -1 or more, got {node.revision}")
    children = obj.get("children")
    if children is not None:
        if not isinstance(children, list):
            raise field_error(here, "children: expected a list of nodes")
        for i, child in enumerate(children):
            node.children.append(_node_from_yaml(child, f"child {i} of {here}"))
    return node


def parse_journalspace(text: str | bytes) -> Node:
    """Parse and validate a journalspace YAML document (one line errors naming the node)."""
    doc = load_document(text, "journalspace", "a node")  # Strict: a key given twice is refused.
    tree = _node_from_yaml(doc, "root node")
    tree.validate()
    return tree


def _spec_to_yaml(spec: pb.JournalSpec, out: dict[str, Any]) -> None:
    if spec.name:
        out["name"] = spec.name
    if spec.replication:
        out["replication"] = spec.replication
    if spec.labels.labels:
        out["labels"] = labels_to_yaml(spec.labels)
    frag: dict[str, Any] = {}
    f = spec.fragment
    if f.length:
        frag["length"] = f.length
    if f.compression_codec:
        frag["compression_codec"] = _enum_name(pb.CompressionCodec, f.compression_codec)
    if f.stores:
        frag["stores"] = list(f.stores)
    for name in _FRAGMENT_DURATIONS:
        ns = duration_field(f, name)
        if ns:
            frag[name] = format_duration(ns)
    if f.path_postfix_template:
        frag["path_postfix_template"] = f.path_postfix_template
    if frag:
        out["fragment"] = frag
    if spec.flags:
        out["flags"] = _enum_name(pb.JournalSpec.Flag, spec.flags)
    if spec.max_append_rate:
        out["max_append_rate"] = spec.max_append_rate
    if spec.HasField("suspend"):
        sus: dict[str, Any] = {}
        if spec.suspend.level:
            sus["level"] = _enum_name(pb.JournalSpec.Suspend.Level, spec.suspend.level)
        if spec.suspend.offset:
            sus["offset"] = spec.suspend.offset
        out["suspend"] = sus


def _enum_name(enum: Any, value: int) -> str | int:
    try:
        return str(enum.Name(value))
    except ValueError:
        return value


def node_to_yaml_obj(node: Node) -> dict[str, Any]:
    """The node as plain data, fields in gazctl's order and zero values omitted."""
    out: dict[str, Any] = {}
    if node.comment:
        out["comment"] = node.comment
    if node.delete is not None:
        out["delete"] = node.delete
    _spec_to_yaml(node.spec, out)
    if node.revision:
        out["revision"] = node.revision
    if node.children:
        out["children"] = [node_to_yaml_obj(c) for c in node.children]
    return out


def dump_journalspace(node: Node) -> str:
    """The node as a YAML document that `parse_journalspace` reads back."""
    return yaml.dump(
        node_to_yaml_obj(node),
        Dumper=SpecDumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
    )
