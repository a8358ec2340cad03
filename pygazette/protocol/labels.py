"""Label sets: construction, lookup, and Gazette's set algebra over `pb.LabelSet`.

A well-formed LabelSet is sorted on (name, value) with no duplicates. The
set operations here work name by name, as Gazette's do: all values of one
label name are treated as a unit. Also here: the meta-labels ("name",
"prefix") that journal selection adds to a spec's own labels.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping, Sequence

from pygazette.protocol.pb import protocol_pb2 as pb

__all__ = [
    "META_LABEL_NAME",
    "META_LABEL_PREFIX",
    "PREFIX_SUFFIX",
    "add_value",
    "intersect_label_sets",
    "journal_label_set_ext",
    "label_set",
    "label_value",
    "label_values",
    "remove_label",
    "set_value",
    "subtract_label_sets",
    "union_label_sets",
    "update_registers",
    "with_meta_labels",
]

# Meta-label carrying a journal's full name.
META_LABEL_NAME = "name"
# Meta-label carrying each '/'-terminated prefix of a journal's name.
META_LABEL_PREFIX = "prefix"
# Suffix of a label name (in selectors) asking for a value-prefix match.
PREFIX_SUFFIX = ":prefix"


def _key(label: pb.Label) -> tuple[str, str]:
    return (label.name, label.value)


def _split_prefix(name: str) -> tuple[str, bool]:
    if name.endswith(PREFIX_SUFFIX):
        return name[: -len(PREFIX_SUFFIX)], True
    return name, False


def label_set(pairs: Iterable[tuple[str, str]] | Mapping[str, str]) -> pb.LabelSet:
    """Build a LabelSet from (name, value) pairs, sorted on (name, value) and de-duplicated.

    A name ending in ":prefix" yields a prefix-matching label (meaningful only
    inside a LabelSelector), as Gazette's LabelSet.AddValue does.
    """
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    seen: dict[tuple[str, str, bool], None] = {}
    for raw_name, value in items:
        name, prefix = _split_prefix(raw_name)
        seen[(name, value, prefix)] = None
    ordered = sorted(seen, key=lambda k: (k[0], k[1], k[2]))
    return pb.LabelSet(labels=[pb.Label(name=n, value=v, prefix=p) for n, v, p in ordered])


def _name_bounds(labels: Sequence[pb.Label], name: str) -> tuple[int, int]:
    names = [label.name for label in labels]
    begin = bisect.bisect_left(names, name)
    end = bisect.bisect_right(names, name, lo=begin)
    return begin, end


# Label sets up to this size are scanned rather than bisected (no list of names to build).
_SCAN_LABELS = 16


def label_values(ls: pb.LabelSet, name: str) -> list[str]:
    """All values of label `name`, in order (empty when absent)."""
    labels = ls.labels
    if len(labels) <= _SCAN_LABELS:
        return [label.value for label in labels if label.name == name]
    begin, end = _name_bounds(labels, name)
    return [labels[i].value for i in range(begin, end)]


def label_value(ls: pb.LabelSet, name: str, default: str = "") -> str:
    """The first value of label `name`, or `default` when absent."""
    begin, end = _name_bounds(ls.labels, name)
    return ls.labels[begin].value if begin != end else default


def add_value(ls: pb.LabelSet, name: str, value: str) -> None:
    """Insert (name, value) in order, keeping other values of `name`. In place.

    A ":prefix" suffix on `name` marks a prefix-matching selector label.
    """
    name, prefix = _split_prefix(name)
    label = pb.Label(name=name, value=value, prefix=prefix)
    keys = [_key(x) for x in ls.labels]
    index = bisect.bisect_left(keys, (name, value))
    if index < len(ls.labels) and ls.labels[index] == label:
        return
    ls.labels.insert(index, label)


def set_value(ls: pb.LabelSet, name: str, value: str) -> None:
    """Make `value` the only value of label `name`. In place."""
    name, prefix = _split_prefix(name)
    remove_label(ls, name)
    keys = [x.name for x in ls.labels]
    index = bisect.bisect_left(keys, name)
    ls.labels.insert(index, pb.Label(name=name, value=value, prefix=prefix))


def remove_label(ls: pb.LabelSet, name: str) -> None:
    """Remove every value of label `name`. In place."""
    begin, end = _name_bounds(ls.labels, name)
    del ls.labels[begin:end]


def _groups(labels: Sequence[pb.Label]) -> Iterator[tuple[str, list[pb.Label]]]:
    """Consecutive runs of labels sharing one name."""
    i = 0
    while i < len(labels):
        j = i + 1
        while j < len(labels) and labels[j].name == labels[i].name:
            j += 1
        yield labels[i].name, list(labels[i:j])
        i = j


def _outer_join(
    lhs: Sequence[pb.Label], rhs: Sequence[pb.Label]
) -> Iterator[tuple[list[pb.Label], list[pb.Label]]]:
    """Full outer join of two sorted label lists on name: (lhs run, rhs run) per name."""
    left = list(_groups(lhs))
    right = list(_groups(rhs))
    i = j = 0
    while i < len(left) or j < len(right):
        if j == len(right) or (i < len(left) and left[i][0] < right[j][0]):
            yield left[i][1], []
            i += 1
        elif i == len(left) or right[j][0] < left[i][0]:
            yield [], right[j][1]
            j += 1
        else:
            yield left[i][1], right[j][1]
            i += 1
            j += 1


def _same_values(a: list[pb.Label], b: list[pb.Label]) -> bool:
    return [x.value for x in a] == [x.value for x in b]


def _copy(labels: Iterable[pb.Label]) -> list[pb.Label]:
    return [pb.Label(name=x.name, value=x.value, prefix=x.prefix) for x in labels]


def union_label_sets(lhs: pb.LabelSet, rhs: pb.LabelSet) -> pb.LabelSet:
    """Labels of either set. For a name present in both, only `lhs`'s values are kept.

    So the values of a name in `lhs` replace all of that name's values in
    `rhs`. Gazette's Append applies ``union_label_sets(union_registers,
    registers)``: the request's values win (see `update_registers`).
    """
    out: list[pb.Label] = []
    for left, right in _outer_join(lhs.labels, rhs.labels):
        out.extend(_copy(left if left else right))
    return pb.LabelSet(labels=out)


def intersect_label_sets(lhs: pb.LabelSet, rhs: pb.LabelSet) -> pb.LabelSet:
    """Labels of names present in both sets with exactly the same values."""
    out: list[pb.Label] = []
    for left, right in _outer_join(lhs.labels, rhs.labels):
        if left and right and _same_values(left, right):
            out.extend(_copy(left))
    return pb.LabelSet(labels=out)


def subtract_label_sets(lhs: pb.LabelSet, rhs: pb.LabelSet) -> pb.LabelSet:
    """Labels of `lhs`, minus each name whose values in `rhs` are exactly the same.

    Removal is all-or-nothing per name: rhs {a: x} removes lhs {a: x} but
    leaves lhs {a: x, a: y} whole. An empty value is not a wildcard: rhs
    {a: ""} removes only an lhs {a: ""}.
    """
    out: list[pb.Label] = []
    for left, right in _outer_join(lhs.labels, rhs.labels):
        if left and not _same_values(left, right):
            out.extend(_copy(left))
    return pb.LabelSet(labels=out)


def update_registers(
    registers: pb.LabelSet,
    union: pb.LabelSet | None = None,
    subtract: pb.LabelSet | None = None,
) -> pb.LabelSet:
    """Journal registers after an append that committed at least one byte.

    As Gazette's append pipeline: first subtract `subtract`, then union in
    `union`, whose values replace any existing values of the same names.
    """
    out = registers
    if subtract is not None:
        out = subtract_label_sets(out, subtract)
    if union is not None:
        out = union_label_sets(union, out)
    else:
        out = pb.LabelSet(labels=_copy(out.labels))
    return out


def journal_label_set_ext(journal_name: str, ls: pb.LabelSet) -> pb.LabelSet:
    """A spec's labels plus the meta-label ``name`` (Gazette's JournalSpec.LabelSetExt).

    This is what Gazette (v0.100+) matches List selectors against, after
    rewriting any ``prefix`` selector labels into ``name:prefix``.
    """
    meta = pb.LabelSet(labels=[pb.Label(name=META_LABEL_NAME, value=journal_name)])
    return union_label_sets(meta, ls)


def _name_prefixes(journal_name: str) -> list[str]:
    out: list[str] = []
    index = journal_name.find("/")
    while index != -1:
        out.append(journal_name[: index + 1])
        index = journal_name.find("/", index + 1)
    return out


def with_meta_labels(journal_name: str, ls: pb.LabelSet) -> pb.LabelSet:
    """A spec's labels plus the meta-labels ``name`` and ``prefix``.

    ``name`` is the journal name; ``prefix`` has one value for each prefix of
    the name ending in '/' (for "a/b/c": "a/", "a/b/"). Meta-labels replace
    any same-named labels of `ls` (specs may not carry them anyway).

    Selecting with ``prefix=a/`` against this set gives the same answer as
    Gazette's current ``name:prefix=a/`` rewrite for '/'-terminated values,
    which is all a ListRequest may carry; `selector.journal_selected` uses the
    rewrite itself.
    """
    meta = [pb.Label(name=META_LABEL_NAME, value=journal_name)]
    meta.extend(pb.Label(name=META_LABEL_PREFIX, value=p) for p in _name_prefixes(journal_name))
    meta.sort(key=_key)
    return union_label_sets(pb.LabelSet(labels=meta), ls)
