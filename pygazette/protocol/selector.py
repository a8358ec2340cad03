"""Label selectors: Gazette's text grammar, its canonical form, and matching.

Grammar (a comma-separated list of expressions; single optional spaces are
allowed around tokens and operators):

    name = value     name == value     include a label with this value
    name != value                      exclude it
    name                               include: label present, any value
    !name                              exclude: label absent
    name in (v1, v2, ...)              include: any of the values
    name notin (v1, ...)  /  name not in (...)   exclude all of the values

A name may carry the suffix ":prefix" (``name:prefix=foo/``), making its
values prefix matches; it is encoded as `pb.Label.prefix` = True. Names are
tokens of at least two letters, digits or ``-_+/.``; values may also use
``=%`` and may be empty.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.labels import (
    META_LABEL_NAME,
    META_LABEL_PREFIX,
    PREFIX_SUFFIX,
    add_value,
    label_values,
    remove_label,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import PATH_SYMBOLS, TOKEN_SYMBOLS, validate_label_selector

__all__ = [
    "format_selector",
    "journal_matcher",
    "journal_selected",
    "parse_selector",
    "rewrite_prefix_meta_label",
    "selector_matches",
]

# Letters and digits of any script ([^\W_]), plus the allowed symbols.
_TOKEN = r" ?((?:[^\W_]|[" + re.escape(TOKEN_SYMBOLS) + r"]){2,}(?::prefix)?)"
_PATH = r" ?((?:[^\W_]|[" + re.escape(PATH_SYMBOLS) + r"])*)"
_COMMA_OR_END = r" ?(?:,|\Z)"
_PARENS = r" ?\(([^)]+)\)"

_EQUAL = re.compile(_TOKEN + r" ?=?=" + _PATH + _COMMA_OR_END)
_NOT_EQUAL = re.compile(_TOKEN + r" ?!=" + _PATH + _COMMA_OR_END)
_SET_IN = re.compile(_TOKEN + r" in" + _PARENS + _COMMA_OR_END)
_SET_NOT_IN = re.compile(_TOKEN + r" not ?in" + _PARENS + _COMMA_OR_END)
_EXISTS = re.compile(_TOKEN + _COMMA_OR_END)
_NOT_EXISTS = re.compile(r" ?!" + _TOKEN + _COMMA_OR_END)
_SET_VALUE = re.compile(_PATH + _COMMA_OR_END)


def _go_quote(text: str) -> str:
    """Quote like Go's %q, closely enough for error messages."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif not ch.isprintable():
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _parse_set_values(target: pb.LabelSet, name: str, text: str) -> None:
    while text:
        m = _SET_VALUE.match(text)
        if m is None or not m.group(0):
            raise ValidationError(
                f"could not match {_go_quote(text)} to a label selector set expression"
            )
        add_value(target, name, m.group(1))
        text = text[m.end() :]


def parse_selector(text: str) -> pb.LabelSelector:
    """Parse a selector string (Gazette's ParseLabelSelector) and validate it.

    Raises ValidationError, naming the unparsed remainder, on any input that
    is not a well-formed selector.
    """
    if not isinstance(text, str):
        raise ValidationError(f"expected a selector string (got {type(text).__name__})")
    out = pb.LabelSelector()
    # Both parts are always present, as in Gazette (where they are non-nullable).
    out.include.SetInParent()
    out.exclude.SetInParent()
    rest = text
    while rest:
        if m := _EQUAL.match(rest):
            add_value(out.include, m.group(1), m.group(2))
        elif m := _NOT_EQUAL.match(rest):
            add_value(out.exclude, m.group(1), m.group(2))
        elif m := _SET_IN.match(rest):
            try:
                _parse_set_values(out.include, m.group(1), m.group(2))
            except ValidationError as err:
                raise err.extend(f"parsing {_go_quote(rest)}") from None
        elif m := _SET_NOT_IN.match(rest):
            try:
                _parse_set_values(out.exclude, m.group(1), m.group(2))
            except ValidationError as err:
                raise err.extend(f"parsing {_go_quote(rest)}") from None
        elif m := _EXISTS.match(rest):
            add_value(out.include, m.group(1), "")
        elif m := _NOT_EXISTS.match(rest):
            add_value(out.exclude, m.group(1), "")
        else:
            raise ValidationError(
                f"could not match {_go_quote(rest)} to a label selector expression"
            )
        rest = rest[m.end() :]
    validate_label_selector(out)
    return out


def _format_labels(labels: Sequence[pb.Label], exclude: bool) -> list[str]:
    # Prefix labels are written (and grouped) under "name:prefix", which may
    # sort differently from "name"; group on the decorated name.
    decorated = sorted(
        ((x.name + PREFIX_SUFFIX if x.prefix else x.name, x.value) for x in labels),
    )
    parts: list[str] = []
    i = 0
    while i < len(decorated):
        name = decorated[i][0]
        j = i + 1
        while j < len(decorated) and decorated[j][0] == name:
            j += 1
        values = [v for _, v in decorated[i:j]]
        if len(values) == 1 and values[0] == "":
            parts.append(("!" if exclude else "") + name)
        elif len(values) == 1:
            # A value starting with "=" needs "==" ("a===" reads back as a=("=")).
            op = "!=" if exclude else ("==" if values[0].startswith("=") else "=")
            parts.append(name + op + values[0])
        else:
            op = " notin (" if exclude else " in ("
            parts.append(name + op + ",".join(values) + ")")
        i = j
    return parts


def format_selector(sel: pb.LabelSelector) -> str:
    """The canonical text of a selector, as Gazette's LabelSelector.String() writes it.

    Include expressions come first, then exclude expressions, each ordered by
    label name; several values of a name use the ``in``/``notin`` form.
    `parse_selector` of the result gives back an equal selector.
    """
    return ",".join(
        _format_labels(sel.include.labels, False) + _format_labels(sel.exclude.labels, True)
    )


def _match_labels(sel: Sequence[pb.Label], labels: Sequence[pb.Label], require_all: bool) -> bool:
    """Gazette's matchSelector: does every (require_all) / any selector name match?"""
    by_name: dict[str, list[pb.Label]] = {}
    for label in labels:
        by_name.setdefault(label.name, []).append(label)

    i = 0
    while i < len(sel):
        j = i + 1
        while j < len(sel) and sel[j].name == sel[i].name:
            j += 1
        wanted = sel[i:j]
        present = by_name.get(sel[i].name, [])
        matched = any(
            want.value == ""
            or (want.value == have.value if not want.prefix else have.value.startswith(want.value))
            for want in wanted
            for have in present
        )
        if matched and not require_all:
            return True
        if not matched and require_all:
            return False
        i = j
    return require_all


def selector_matches(sel: pb.LabelSelector, ls: pb.LabelSet) -> bool:
    """Whether `ls` is selected: no exclude label matches, and every include name matches.

    An include (or exclude) name matches when the set has that name with a
    value equal to one of the selector's values, or prefixed by one of its
    ":prefix" values; an empty selector value matches any value.
    """
    if _match_labels(sel.exclude.labels, ls.labels, False):
        return False
    return _match_labels(sel.include.labels, ls.labels, True)


def rewrite_prefix_meta_label(sel: pb.LabelSelector) -> pb.LabelSelector:
    """Turn ``prefix`` meta-label values into ``name:prefix`` matches, as Gazette's List does."""
    out = pb.LabelSelector()
    out.CopyFrom(sel)
    for labels in (out.include, out.exclude):
        values = label_values(labels, META_LABEL_PREFIX)
        if values:
            for value in values:
                add_value(labels, META_LABEL_NAME + PREFIX_SUFFIX, value)
            remove_label(labels, META_LABEL_PREFIX)
    return out


def journal_selected(sel: pb.LabelSelector, spec: pb.JournalSpec) -> bool:
    """Whether a List selector selects the journal `spec`.

    Matches against the spec's labels plus the meta-label ``name``, after
    turning ``prefix=<p>`` selector labels into ``name:prefix=<p>``: the
    exact procedure of Gazette's broker.
    """
    return journal_matcher(sel)(spec)


# A selector's labels of one name: (name, exact values, prefix values, an empty value).
_Group = tuple[str, frozenset[str], tuple[str, ...], bool]


def _groups(sel: Sequence[pb.Label]) -> list[_Group]:
    groups: dict[str, tuple[set[str], list[str], list[bool]]] = {}
    for want in sel:
        exact, prefixes, empty = groups.setdefault(want.name, (set(), [], [False]))
        if want.value == "":
            empty[0] = True
        elif want.prefix:
            prefixes.append(want.value)
        else:
            exact.add(want.value)
    return [(n, frozenset(e), tuple(p), m[0]) for n, (e, p, m) in groups.items()]


def _group_matches(group: _Group, by_name: dict[str, list[str]]) -> bool:
    name, exact, prefixes, empty = group
    present = by_name.get(name)
    if not present:
        return False
    return empty or any(v in exact or (prefixes and v.startswith(prefixes)) for v in present)


def _every_journal(spec: pb.JournalSpec) -> bool:
    return True


def journal_matcher(sel: pb.LabelSelector) -> Callable[[pb.JournalSpec], bool]:
    """`journal_selected` for many journals: the selector rewritten and indexed once (a List
    selecting `name in (...)` of hundreds of journals costs one set look-up per journal, not
    a pass over every value)."""
    rewritten = rewrite_prefix_meta_label(sel)
    include, exclude = _groups(rewritten.include.labels), _groups(rewritten.exclude.labels)
    if not include and not exclude:
        return _every_journal  # The empty selector (a List of everything).

    def matches(spec: pb.JournalSpec) -> bool:
        by_name: dict[str, list[str]] = {META_LABEL_NAME: [spec.name]}
        for label in spec.labels.labels:
            by_name.setdefault(label.name, []).append(label.value)
        if any(_group_matches(g, by_name) for g in exclude):
            return False
        return all(_group_matches(g, by_name) for g in include)

    return matches
