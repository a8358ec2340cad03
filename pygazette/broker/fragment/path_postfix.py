"""Path postfix templates: the Go text/template forms Gazette users write, evaluated in Python.

A journal's `fragment.path_postfix_template` is rendered when a spool is persisted, and the
result becomes a directory between the journal name and the fragment file name — how Hive
partitions are laid out:

    date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}/
        hour={{ .Spool.FirstAppendTime.Format "15" }}      (one line, no spaces)

The template sees what Gazette's sees: `.Spool` (the fragment's `.Journal`, `.Begin`, `.End`,
`.CompressionCodec`, `.BackingStore`, and
`.FirstAppendTime` in UTC, with `.Format "<Go layout>"`, `.Year`, `.Month`, `.Day`, `.Hour`,
`.Minute`, `.Second`, `.YearDay`, `.Weekday`, `.Unix`, `.UTC`) and `.JournalSpec` (`.Name`,
`.Replication`, `.MaxAppendRate`, `.Fragment.Length`, `.Fragment.CompressionCodec`), whose
fields are also reachable at the top level (`.Name`). (The spool's, such as `.FirstAppendTime`,
are refused there at Apply, as Gazette's JournalSpec.Validate refuses them, though its
persister would render them.) Actions are field references, method
calls, string and number literals, `printf`/`print`, and pipelines into them
(`{{ .Spool.Begin | printf "%016x" }}`); `{{-`/`-}}` trim spaces and `{{/* */}}` comments.

Anything else — `if`, `range`, variables, other functions, fields without a path form such as
label sets — is refused when the spec is applied (`check_template`), with an error saying
what is supported, instead of failing later when a spool persists. So is a template that
renders to an invalid path (a space, a ':' from "15:04", a '..'), which Gazette would write
and then fail to list, hiding the fragment from readers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pygazette.broker.fragment.go_time_format import DAYS, MONTHS, go_time_format
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import fragment_file_name
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import (
    MAX_JOURNAL_NAME_LEN,
    go_path_clean,
    validate_path_component,
)

SUPPORTED = (
    'supported: text, field references such as .Spool.FirstAppendTime.Format "2006-01-02", '
    ".Spool.Begin or .JournalSpec.Name, string and number literals, printf/print, pipelines "
    "into printf, {{- -}} trimming and {{/* comments */}}"
)

_KEYWORDS = frozenset(
    {
        "if",
        "else",
        "end",
        "range",
        "with",
        "define",
        "template",
        "block",
        "break",
        "continue",
        "nil",
    }
)
_GO_FUNCS = frozenset(
    {
        "and",
        "call",
        "html",
        "index",
        "slice",
        "js",
        "len",
        "not",
        "or",
        "println",
        "urlquery",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
    }
)


class TemplateError(ValidationError):
    """A path postfix template that pygazette cannot (or must not) render."""


# --- values -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GoEnum:
    """A Go integer type with a String method (CompressionCodec, time.Month, Weekday)."""

    value: int
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class GoTime:
    t: datetime

    def __str__(self) -> str:  # Go's Time.String().
        return go_time_format(self.t, "2006-01-02 15:04:05.999999999 -0700 MST")


@dataclass(frozen=True, slots=True)
class Unsupported:
    """A field that exists in Go but has no sensible path form."""

    what: str


@dataclass(slots=True)
class Struct:
    type_name: str
    fields: dict[str, Any] = field(default_factory=dict)
    # Methods taking arguments: name -> (arity, implementation).
    methods: dict[str, tuple[int, Callable[..., Any]]] = field(default_factory=dict)


def _time_struct(t: datetime) -> GoTime:
    return GoTime(t.astimezone(UTC))


def _time_member(value: GoTime, name: str) -> Any:
    t = value.t
    members: dict[str, Callable[[], Any]] = {
        "Year": lambda: t.year,
        "Month": lambda: GoEnum(t.month, MONTHS[t.month - 1]),
        "Day": lambda: t.day,
        "Hour": lambda: t.hour,
        "Minute": lambda: t.minute,
        "Second": lambda: t.second,
        "Nanosecond": lambda: t.microsecond * 1000,
        "YearDay": lambda: t.timetuple().tm_yday,
        "Weekday": lambda: GoEnum((t.weekday() + 1) % 7, DAYS[t.weekday()]),
        "Unix": lambda: int(t.timestamp()),
        "UnixMilli": lambda: int(t.timestamp() * 1000),
        "UTC": lambda: value,
        "String": lambda: str(value),
    }
    if name in members:
        return members[name]()
    return None


def _codec(codec: int) -> GoEnum:
    return GoEnum(codec, pb.CompressionCodec.Name(codec))


def _flags(flags: int) -> GoEnum:
    """JournalSpec_Flag, which Go prints by its name (its String method)."""
    try:
        name = pb.JournalSpec.Flag.Name(flags)
    except ValueError:
        name = str(flags)  # Go's proto.EnumName of an unknown value.
    return GoEnum(flags, name)


def template_data(
    spec: pb.JournalSpec,
    frag: pb.Fragment,
    first_append_time: float | None,
    *,
    as_gazette: bool = True,
    validating: bool = False,
) -> Struct:
    """What a template sees for persisting fragment `frag` of journal `spec`.

    Without `as_gazette`, `.Spool.ContentName` and `.Spool.ContentLength` render too, as
    they did before Apply refused them, for journals whose specs already use them.
    With `validating`, what Gazette's JournalSpec.Validate executes it on instead (see
    below): the spool's fields are not promoted to the top.
    """
    first = datetime.fromtimestamp(first_append_time or 0.0, UTC)
    fragment_fields = {
        "Journal": frag.journal,
        "Begin": frag.begin,
        "End": frag.end,
        "Sum": Unsupported("a SHA-1 sum struct"),
        "CompressionCodec": _codec(frag.compression_codec),
        "BackingStore": frag.backing_store,
        "ModTime": frag.mod_time,
        "PathPostfix": frag.path_postfix,
    }
    spool_fields, inner_fields = dict(fragment_fields), dict(fragment_fields)
    if not as_gazette:
        legacy = {"ContentName": fragment_file_name(frag), "ContentLength": frag.end - frag.begin}
        spool_fields.update(legacy)
        inner_fields.update(legacy)
    spool = Struct(
        "Spool",
        {
            **spool_fields,
            "Fragment": Struct("Fragment", inner_fields),
            "FirstAppendTime": _time_struct(first),
            "Registers": Unsupported("a label set"),
        },
    )
    spec_fragment = Struct(
        "JournalSpec_Fragment",
        {
            "Length": spec.fragment.length,
            "CompressionCodec": _codec(spec.fragment.compression_codec),
            "Stores": Unsupported("a list of stores"),
            "RefreshInterval": Unsupported("a duration"),
            "Retention": Unsupported("a duration"),
            "FlushInterval": Unsupported("a duration"),
            "PathPostfixTemplate": spec.fragment.path_postfix_template,
        },
    )
    spec_fields = {
        "Name": spec.name,
        "Replication": spec.replication,
        "Labels": Unsupported("a label set"),
        "LabelSet": Unsupported("a label set"),
        "Fragment": spec_fragment,
        "Flags": _flags(spec.flags),
        "MaxAppendRate": spec.max_append_rate,
        "Suspend": Unsupported("a suspension struct"),
    }
    journal_spec = Struct("JournalSpec", spec_fields)
    # Gazette executes the template on struct{Spool; *JournalSpec}: the fields of both are
    # promoted to the top, where a name found twice at one depth (Fragment) is ambiguous. So
    # `.FirstAppendTime` and the spool's `.Begin`, `.End`, `.Journal`... are reachable
    # there. (The fragment's ContentName and ContentLength are not, here or under .Spool:
    # they are methods of *Fragment, which Go cannot call on the spool the template is
    # given by value, so Gazette fails to persist with them.)
    # Its JournalSpec.Validate (every Apply, and every spec its brokers decode and its clients
    # list) executes it on struct{Spool struct{Fragment; FirstAppendTime; Registers};
    # JournalSpec} instead: Spool is a named field there, so nothing of it is promoted, and
    # a spec reaching the spool's fields from the top is refused.
    root_fields: dict[str, Any] = {}
    if not validating:
        root_fields.update(fragment_fields)
        root_fields["FirstAppendTime"] = spool.fields["FirstAppendTime"]
        root_fields["Registers"] = spool.fields["Registers"]
    root_fields.update((k, v) for k, v in spec_fields.items() if k != "Fragment")
    root_fields["Fragment"] = Unsupported(
        "ambiguous at the top level (write .Spool.Fragment or .JournalSpec.Fragment)"
    )
    root_fields.update(Spool=spool, JournalSpec=journal_spec)
    return Struct("data", root_fields)


# --- parsing --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Action:
    source: str
    commands: list[list[str]]  # Pipeline of commands, each a list of operand tokens.


_Node = str | _Action

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:[^"\\]|\\.)*")
      | (?P<raw>`[^`]*`)
      | (?P<pipe>\|)
      | (?P<paren>[()])
      | (?P<num>[-+]?\d+)
      | (?P<var>\$[A-Za-z_][A-Za-z0-9_]*)
      | (?P<field>\$?(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.|\$)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<other>\S+)
    )""",
    re.VERBOSE,
)


def _fail(message: str) -> TemplateError:
    return TemplateError(f"{message} ({SUPPORTED})")


def _find_close(template: str, start: int) -> int:
    """Index of the '}}' closing the action opened before `start`, skipping string literals."""
    i = start
    quote = ""
    while i < len(template):
        c = template[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in '"`':
            quote = c
        elif template.startswith("}}", i):
            return i
        i += 1
    raise TemplateError("template: postfix: unclosed action")


def parse_template(template: str) -> list[_Node]:
    nodes: list[_Node] = []
    pos = 0
    while True:
        start = template.find("{{", pos)
        if start == -1:
            if template[pos:]:
                nodes.append(template[pos:])
            return nodes
        text = template[pos:start]
        inner_start = comment_start = start + 2
        if template[inner_start : inner_start + 1] == "-" and template[
            inner_start + 1 : inner_start + 2
        ] in (" ", "\t", "\n", "\r"):
            text = text.rstrip(" \t\r\n")
            inner_start += 1
            comment_start += 2  # After the marker and its space.
        if text:
            nodes.append(text)
        if template.startswith("/*", comment_start):
            # A comment, as Go's lexer reads one: it runs to "*/" (whatever it holds, "}}"
            # included), which the closing delimiter must follow at once (or " -}}").
            close = template.find("*/", comment_start + 2)
            if close == -1:
                raise TemplateError(f"template: postfix: unclosed comment in {template[start:]}")
            pos = close + 2
            trim = template[pos : pos + 1] in (" ", "\t", "\n", "\r") and template.startswith(
                "-}}", pos + 1
            )
            if trim:
                pos += 2
            if not template.startswith("}}", pos):
                raise TemplateError(
                    "template: postfix: comment ends before closing delimiter in "
                    f"{template[start : pos + 2]}"
                )
            pos += 2
            if trim:
                rest = template[pos:]
                pos += len(rest) - len(rest.lstrip(" \t\r\n"))
            continue
        end = _find_close(template, inner_start)
        inner = template[inner_start:end]
        pos = end + 2
        if inner.endswith("-") and inner[-2:-1] in (" ", "\t", "\n", "\r"):
            inner = inner[:-1]
            rest = template[pos:]
            pos += len(rest) - len(rest.lstrip(" \t\r\n"))
        source = "{{" + template[start + 2 : end] + "}}"
        body = inner.strip()
        if body.startswith("/*"):  # Not at once after the delimiter: not a comment, in Go.
            raise TemplateError(f'template: postfix: unexpected "/" in command in {source}')
        nodes.append(_Action(source, _parse_pipeline(body, source)))


def _parse_pipeline(body: str, source: str) -> list[list[str]]:
    if not body:
        raise TemplateError(f"template: postfix: missing value for command in {source}")
    commands: list[list[str]] = [[]]
    pos = 0
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if m is None or m.end() == pos:
            break
        pos = m.end()
        kind = m.lastgroup
        tok = m.group(kind or "other")
        if kind == "pipe":
            commands.append([])
            continue
        if kind == "paren":
            raise _fail(f"unsupported parenthesized pipeline in {source}")
        if kind == "var" or (kind == "other" and ":=" in tok) or tok in ("=", ":="):
            raise _fail(f"unsupported variable in {source}")
        if kind == "ident" and tok in _KEYWORDS:
            raise _fail(f"unsupported action {tok!r} in {source}")
        if kind == "ident" and tok in ("true", "false"):
            pass
        elif kind == "ident" and tok not in ("printf", "print"):
            if tok in _GO_FUNCS:
                raise _fail(f"unsupported function {tok!r} in {source}")
            raise TemplateError(f'template: postfix: function "{tok}" not defined in {source}')
        elif kind == "other":
            raise _fail(f"unsupported syntax {tok!r} in {source}")
        commands[-1].append(tok)
    if any(not c for c in commands):
        raise TemplateError(f"template: postfix: missing command in pipeline {source}")
    return commands


# --- evaluation ----------------------------------------------------------------------------


def _literal(tok: str) -> Any:
    if tok.startswith('"'):
        return _unquote(tok)
    if tok.startswith("`"):
        return tok[1:-1]
    if tok in ("true", "false"):
        return tok == "true"
    return int(tok)


def _unquote(tok: str) -> str:
    escapes = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'"}
    out: list[str] = []
    i = 1
    while i < len(tok) - 1:
        c = tok[i]
        if c == "\\":
            nxt = tok[i + 1]
            if nxt not in escapes:
                raise _fail(f"unsupported escape \\{nxt} in string {tok}")
            out.append(escapes[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _resolve(data: Struct, chain: str, args: list[Any], source: str) -> Any:
    names = [n for n in chain.lstrip("$").split(".") if n]
    value: Any = data
    path = ""
    for i, name in enumerate(names):
        last = i == len(names) - 1
        path += "." + name
        if isinstance(value, GoTime):
            if name == "Format":
                if not last or len(args) != 1 or not isinstance(args[0], str):
                    raise _fail(f"{path} takes one layout string, in {source}")
                return go_time_format(value.t, args[0])
            member = _time_member(value, name)
            if member is None:
                raise _fail(f"{path}: time.Time has no method {name} usable here, in {source}")
            value = member
        elif isinstance(value, Struct):
            if name not in value.fields:
                raise TemplateError(
                    f"template: postfix: can't evaluate field {name} in type {value.type_name}"
                    f" (at {path} in {source}; fields: {', '.join(sorted(value.fields))})"
                )
            value = value.fields[name]
        else:
            raise TemplateError(
                f"template: postfix: can't evaluate field {name} of {path[: -len(name) - 1]}"
                f" in {source}"
            )
        if isinstance(value, Unsupported):
            raise _fail(f"{path} is {value.what}, which has no path form, in {source}")
    if args:
        raise TemplateError(
            f"template: postfix: {chain} is not a method but has arguments in {source}"
        )
    return value


def _evaluate(action: _Action, data: Struct) -> Any:
    result: Any = None
    for n, command in enumerate(action.commands):
        head, rest = command[0], command[1:]
        args = [_operand(t, data, action.source) for t in rest]
        if n:
            args.append(result)
        if head in ("printf", "print"):
            if head == "printf":
                if not args or not isinstance(args[0], str):
                    raise _fail(f"printf needs a format string, in {action.source}")
                result = go_sprintf(args[0], args[1:], action.source)
            else:
                result = "".join(_go_print(a) for a in args)
        elif head.startswith((".", "$")):
            result = _resolve(data, head, args, action.source)
        else:
            if args:
                raise TemplateError(
                    f"template: postfix: can't give argument to non-function {head}"
                )
            result = _literal(head)
    return result


def _operand(tok: str, data: Struct, source: str) -> Any:
    if tok.startswith((".", "$")):
        return _resolve(data, tok, [], source)
    if tok in ("printf", "print"):
        raise _fail(f"nested function calls need parentheses, which are unsupported, in {source}")
    return _literal(tok)


def _go_print(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Struct):
        raise _fail(f"{value.type_name} is a struct, which has no path form")
    return str(value)


_VERB = re.compile(r"%([-+# 0]*)(\d*)(?:\.(\d+))?([a-zA-Z%])")


def go_sprintf(fmt: str, args: list[Any], source: str = "") -> str:
    """Go's fmt.Sprintf for the verbs paths need: %d %s %v %x %X %o %q %%."""
    out: list[str] = []
    pos = 0
    argi = 0
    for m in _VERB.finditer(fmt):
        out.append(fmt[pos : m.start()])
        pos = m.end()
        flags, width, prec, verb = m.groups()
        if verb == "%":
            out.append("%")
            continue
        if argi >= len(args):
            raise _fail(f"printf format {fmt!r} needs more arguments, in {source}")
        arg = args[argi]
        argi += 1
        out.append(_format_one(arg, flags, width, prec, verb, fmt, source))
    out.append(fmt[pos:])
    if argi != len(args):
        raise _fail(f"printf format {fmt!r} has {len(args) - argi} extra argument(s), in {source}")
    return "".join(out)


def _format_one(
    arg: Any, flags: str, width: str, prec: str | None, verb: str, fmt: str, source: str
) -> str:
    if verb in "dxXo":
        number = arg.value if isinstance(arg, GoEnum) else arg
        if isinstance(number, bool) or not isinstance(number, int):
            raise _fail(
                f"printf %{verb} of a non-integer ({_go_print(arg)!r}) in {fmt!r}, in {source}"
            )
        spec = {"d": "d", "x": "x", "X": "X", "o": "o"}[verb]
    elif verb in "sv":
        arg = _go_print(arg)
        spec = "s"
        if prec is not None:
            arg = arg[: int(prec)]
    elif verb == "q":
        arg = '"' + _go_print(arg).replace("\\", "\\\\").replace('"', '\\"') + '"'
        spec = "s"
    else:
        raise _fail(f"unsupported printf verb %{verb} in {fmt!r}, in {source}")
    align = "<" if "-" in flags else ">"
    fill = "0" if "0" in flags and "-" not in flags and spec != "s" else " "
    sign = "+" if "+" in flags and spec == "d" else ""
    alt = "#" if "#" in flags and spec in "xXo" else ""
    if spec != "s":
        arg = number
    if fill == "0":
        return format(arg, f"{sign}{alt}0{width}{spec}")
    return format(arg, f"{fill}{align}{width}" + ("" if spec == "s" else f"{sign}{alt}{spec}"))


# --- the public face ------------------------------------------------------------------------


def render(template: str, data: Struct) -> str:
    """Render `template` over `data`; TemplateError on anything unsupported."""
    out: list[str] = []
    for node in parse_template(template):
        if isinstance(node, str):
            out.append(node)
        else:
            out.append(_go_print(_evaluate(node, data)))
    return "".join(out)


def clean_postfix(rendered: str, template: str) -> str:
    """The rendered postfix as a clean relative path, or TemplateError saying why it is not."""
    text = rendered.strip("/")
    if not text:
        return ""
    cleaned = go_path_clean(text)
    if cleaned == "." or cleaned == ".." or cleaned.startswith("../"):
        raise TemplateError(
            f"path_postfix_template {template!r} renders to {rendered!r}, which leaves the "
            "journal's directory"
        )
    try:
        validate_path_component(cleaned, "PathPostfix", 0, MAX_JOURNAL_NAME_LEN)
    except ValidationError as exc:
        raise TemplateError(
            f"path_postfix_template {template!r} renders to {rendered!r}, which is not a valid "
            f"path postfix: {exc} (allowed: letters, digits and -_+/.=%)"
        ) from None
    return cleaned


def evaluate_path_postfix(
    spec: pb.JournalSpec, frag: pb.Fragment, first_append_time: float | None
) -> str:
    """The path postfix for persisting `frag` under `spec` ("" without a template)."""
    template = spec.fragment.path_postfix_template
    if not template:
        return ""
    # Rendered as it was when applied: specs applied before .Spool.ContentName was refused
    # keep persisting.
    rendered = render(template, template_data(spec, frag, first_append_time, as_gazette=False))
    return clean_postfix(rendered, template)


# Sample spools for checking templates at Apply: a time whose every field differs, so that
# any layout exercises its digits; and one whose fields are single digits, where space-padded
# layouts ("_2", "__2") render spaces.
_SAMPLE_TIME = datetime(2024, 11, 23, 14, 35, 56, 789000, UTC).timestamp()
_SAMPLE_TIMES = (_SAMPLE_TIME, datetime(2024, 1, 2, 3, 4, 5, 6, UTC).timestamp())


def check_template(spec: pb.JournalSpec) -> None:
    """Refuse a spec whose template Gazette cannot render, or renders to an invalid path."""
    frag = pb.Fragment(
        journal=spec.name,
        begin=0x1000,
        end=0x2000,
        compression_codec=spec.fragment.compression_codec or pb.NONE,
        backing_store=spec.fragment.stores[0] if spec.fragment.stores else "",
    )
    try:
        for sample in _SAMPLE_TIMES:
            rendered = render(
                spec.fragment.path_postfix_template,
                template_data(spec, frag, sample, validating=True),
            )
            clean_postfix(rendered, spec.fragment.path_postfix_template)
    except TemplateError as exc:
        raise TemplateError(f"Fragment.PathPostfixTemplate: {exc}") from None


def check_apply_request(req: pb.ApplyRequest) -> None:
    """check_template for every upserted spec of an Apply (TemplateError names the journal)."""
    for change in req.changes:
        if change.HasField("upsert"):
            try:
                check_template(change.upsert)
            except TemplateError as exc:
                raise TemplateError(f"journal {change.upsert.name}: {exc}") from None
