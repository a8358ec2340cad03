"""Validation of protocol messages, with Gazette's rules (broker/protocol *Validate).

Every check raises `ValidationError`; its context names the field at fault
(``"Fragment.Stores[0]: path component doesn't end in '/' (/a)"``), and its
wording follows Gazette's, so errors read the same from either system.

Rules follow Gazette v0.103 (broker/protocol validator.go and the
*_extensions.go Validate methods).
"""

from __future__ import annotations

import functools
import ipaddress
import re
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from google.protobuf import duration_pb2

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.labels import META_LABEL_NAME, META_LABEL_PREFIX, label_values
from pygazette.protocol.pb import peer_pb2 as ppb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.retention_bytes import validate_retention_bytes_label

__all__ = [
    "CONTENT_TYPE_LABEL",
    "FRAGMENT_STORE_SCHEMES",
    "MAX_BROKER_JOURNAL_LIMIT",
    "MAX_BROKER_SUFFIX_LEN",
    "MAX_FRAGMENTS_PAGE_LIMIT",
    "MAX_FRAGMENT_LEN",
    "MAX_JOURNAL_NAME_LEN",
    "MAX_JOURNAL_REPLICATION",
    "MAX_LABEL_LEN",
    "MAX_LABEL_VALUE_LEN",
    "MAX_REFRESH_INTERVAL_SECONDS",
    "MAX_ZONE_LEN",
    "MESSAGE_SUB_TYPE_LABEL",
    "MESSAGE_TYPE_LABEL",
    "MIN_BROKER_SUFFIX_LEN",
    "MIN_FLUSH_INTERVAL_SECONDS",
    "MIN_FRAGMENT_LEN",
    "MIN_JOURNAL_NAME_LEN",
    "MIN_LABEL_LEN",
    "MIN_REFRESH_INTERVAL_SECONDS",
    "MIN_ZONE_LEN",
    "PATH_SYMBOLS",
    "SINGLE_VALUE_LABELS",
    "TOKEN_SYMBOLS",
    "PathSymbols",
    "TokenSymbols",
    "go_path_clean",
    "journal_spec_flags_allow_read",
    "journal_spec_flags_allow_write",
    "split_journal_meta",
    "validate_append_request",
    "validate_append_response",
    "validate_apply_change",
    "validate_apply_request",
    "validate_apply_response",
    "validate_broker_spec",
    "validate_compression_codec",
    "validate_endpoint",
    "validate_fragment",
    "validate_fragment_store",
    "validate_fragment_store_health_request",
    "validate_fragment_store_health_response",
    "validate_fragments_request",
    "validate_fragments_response",
    "validate_go_duration",
    "validate_header",
    "validate_journal_name",
    "validate_journal_spec",
    "validate_journal_spec_durations",
    "validate_label",
    "validate_label_name",
    "validate_label_selector",
    "validate_label_set",
    "validate_label_value",
    "validate_list_journal",
    "validate_list_journals",
    "validate_list_request",
    "validate_list_response",
    "validate_path_component",
    "validate_process_id",
    "validate_process_spec",
    "validate_read_request",
    "validate_read_response",
    "validate_replicate_request",
    "validate_replicate_response",
    "validate_route",
    "validate_status",
    "validate_token",
]

# Symbols allowed in tokens (label names, zones, suffixes), beyond letters and
# digits of any script. Nothing at or below '#' (the keyspace separator).
TOKEN_SYMBOLS = "-_+/."
# Symbols allowed in path components (journal names, postfixes) and label values.
PATH_SYMBOLS = TOKEN_SYMBOLS + "=%"
# Gazette's spellings of the same constants.
TokenSymbols = TOKEN_SYMBOLS
PathSymbols = PATH_SYMBOLS

MIN_LABEL_LEN, MAX_LABEL_LEN = 2, 64
MAX_LABEL_VALUE_LEN = 1024
MIN_JOURNAL_NAME_LEN, MAX_JOURNAL_NAME_LEN = 4, 512
MAX_JOURNAL_REPLICATION = 5
MIN_REFRESH_INTERVAL_SECONDS, MAX_REFRESH_INTERVAL_SECONDS = 1, 24 * 3600
MIN_FLUSH_INTERVAL_SECONDS = 60
MIN_FRAGMENT_LEN, MAX_FRAGMENT_LEN = 1 << 10, 1 << 34
MIN_ZONE_LEN, MAX_ZONE_LEN = 1, 32
MIN_BROKER_SUFFIX_LEN, MAX_BROKER_SUFFIX_LEN = 4, 128
MAX_BROKER_JOURNAL_LIMIT = 1 << 17
MAX_FRAGMENTS_PAGE_LIMIT = 10000

FRAGMENT_STORE_SCHEMES = ("s3", "gs", "azure", "azure-ad", "file")

# Well-known labels (Gazette's `labels` package) with constraints on journals.
CONTENT_TYPE_LABEL = "content-type"
MESSAGE_TYPE_LABEL = "app.gazette.dev/message-type"
MESSAGE_SUB_TYPE_LABEL = "app.gazette.dev/message-subtype"
SINGLE_VALUE_LABELS = frozenset(
    {
        CONTENT_TYPE_LABEL,
        "app.gazette.dev/instance",
        "app.gazette.dev/managed-by",
        MESSAGE_SUB_TYPE_LABEL,
        MESSAGE_TYPE_LABEL,
        "app.gazette.dev/region",
    }
)

_NANOS = 1_000_000_000


# --- building blocks --------------------------------------------------------


def _ctx(err: ValidationError, field: str) -> ValidationError:
    return err.extend(field) if field else err


def _byte_len(value: str) -> int:
    # Gazette measures lengths in UTF-8 bytes.
    return len(value.encode("utf-8", "surrogatepass"))


def _is_letter_or_number(ch: str) -> bool:
    return unicodedata.category(ch)[0] in "LN"


@functools.lru_cache(maxsize=64)
def _ascii_token(symbols: str) -> re.Pattern[str]:
    """ASCII tokens over `symbols`: among ASCII characters, Unicode's letters and numbers
    are exactly A-Z, a-z and 0-9, so this matches what the per-character check accepts."""
    return re.compile("[A-Za-z0-9" + re.escape(symbols) + "]*")


def repeated_change(kind: str, names: Iterable[str]) -> str:
    """Why an Apply request that names one journal or shard (`kind`) in two changes fails
    ("" if none does): one etcd transaction holds one operation per key ("duplicate key
    given in txn request"), so Gazette's Apply fails whole; the embedded keyspace would
    apply both in turn."""
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if (j := first.setdefault(name, i)) != i:
            return (
                f"Changes[{i}]: {kind} {name} is in more than one change of the request "
                f"(also Changes[{j}]; at most one per {kind})"
            )
    return ""


def validate_token(value: str, field: str, symbols: str, min_len: int, max_len: int) -> None:
    """`value` is min_len..max_len UTF-8 bytes of letters, digits and `symbols`.

    `field`, when not empty, is prepended to the error's context. An ASCII value (the
    usual case, on every append) is checked by one regular expression, not per character.
    """
    if value.isascii():
        length = len(value)
        if min_len <= length <= max_len:
            if _ascii_token(symbols).fullmatch(value) is None:
                raise _ctx(ValidationError(f"not a valid token ({value})"), field)
            return
    length = _byte_len(value)
    if length < min_len or length > max_len:
        raise _ctx(
            ValidationError(
                f"invalid length ({length}; expected {min_len} <= length <= {max_len})"
            ),
            field,
        )
    for ch in value:
        if not (_is_letter_or_number(ch) or ch in symbols):
            raise _ctx(ValidationError(f"not a valid token ({value})"), field)


def go_path_clean(path: str) -> str:
    """Go's path.Clean: the shortest equivalent slash-separated path."""
    if path == "":
        return "."
    rooted = path.startswith("/")
    parts: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(segment)
    out = "/".join(parts)
    if rooted:
        return "/" + out
    return out or "."


def validate_path_component(value: str, field: str, min_len: int, max_len: int) -> None:
    """A token over PATH_SYMBOLS that is also a clean, relative path."""
    validate_token(value, field, PATH_SYMBOLS, min_len, max_len)
    if value and go_path_clean(value) != value:
        raise _ctx(ValidationError(f"must be a clean path ({value})"), field)
    if value and value[0] == "/":
        raise _ctx(ValidationError(f"cannot begin with '/' ({value})"), field)


def split_journal_meta(journal: str) -> tuple[str, str]:
    """Split "name;meta" into ("name", ";meta"); ("name", "") when there is no ';'."""
    index = journal.find(";")
    if index == -1:
        return journal, ""
    return journal[:index], journal[index:]


def validate_journal_name(name: str, *, allow_meta: bool = True) -> None:
    """A journal name: a clean relative path of 4..512 bytes.

    A ";meta" suffix (used by readers) must itself be a clean path component;
    with ``allow_meta=False`` (as for JournalSpec names) it is refused.

    Names found valid are remembered (every Append, Read and Replicate request names its
    journal; checking the path costs more than the rest of a small request's checks).
    """
    _valid_journal_name(name, allow_meta)


@functools.lru_cache(maxsize=1 << 16)
def _valid_journal_name(name: str, allow_meta: bool) -> None:
    """`validate_journal_name`, cached for valid names (an error is raised, not cached)."""
    base, meta = split_journal_meta(name)
    validate_path_component(base, "", MIN_JOURNAL_NAME_LEN, MAX_JOURNAL_NAME_LEN)
    if not meta:
        return
    if not allow_meta:
        raise ValidationError(
            f"Name cannot have a metadata path segment ({meta}; expected no segment)"
        )
    try:
        validate_path_component(meta[1:], "", 1, MAX_JOURNAL_NAME_LEN)
    except ValidationError as err:
        raise err.extend("metadata path segment") from None


def _go_duration(seconds: int, nanos: int = 0) -> str:
    """Go's time.Duration.String()."""
    total = seconds * _NANOS + nanos
    if total == 0:
        return "0s"
    sign = "-" if total < 0 else ""
    total = abs(total)
    if total < _NANOS:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if total >= size or unit == "ns":
                whole, frac = divmod(total, size)
                text = str(whole)
                if frac:
                    digits = len(str(size)) - 1
                    text += "." + f"{frac:0{digits}d}".rstrip("0")
                return sign + text + unit
    hours, rem = divmod(total, 3600 * _NANOS)
    minutes, rem = divmod(rem, 60 * _NANOS)
    secs, frac = divmod(rem, _NANOS)
    text = str(secs)
    if frac:
        text += "." + f"{frac:09d}".rstrip("0")
    text += "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    if minutes:
        return f"{sign}{minutes}m{text}"
    return sign + text


def _duration_nanos(d: duration_pb2.Duration) -> int:
    return int(d.seconds) * _NANOS + int(d.nanos)


_GO_DURATION_MIN, _GO_DURATION_MAX = -(1 << 63), (1 << 63) - 1


def validate_go_duration(d: duration_pb2.Duration) -> None:
    """A Duration that Gazette can decode: its spec durations are Go time.Durations
    (gogoproto stdduration), and one that DurationFromProto refuses fails the decode of the
    whole message carrying it (a spec, an Apply, a List response)."""
    seconds, nanos = int(d.seconds), int(d.nanos)
    what = f"duration (seconds {seconds}, nanos {nanos})"
    if not -_NANOS < nanos < _NANOS:
        raise ValidationError(f"invalid {what}: nanos out of range")
    if (seconds < 0 < nanos) or (nanos < 0 < seconds):
        raise ValidationError(f"invalid {what}: seconds and nanos have different signs")
    if not _GO_DURATION_MIN <= seconds * _NANOS + nanos <= _GO_DURATION_MAX:
        raise ValidationError(
            f"invalid {what}: out of range for a Go time.Duration (about 292 years)"
        )


def _go_durations(msg: Any, fields: tuple[str, ...], names: tuple[str, ...]) -> None:
    for field, name in zip(fields, names, strict=True):
        if msg.HasField(field):
            try:
                validate_go_duration(getattr(msg, field))
            except ValidationError as err:
                raise err.extend(name) from None


def validate_journal_spec_durations(spec: pb.JournalSpec) -> None:
    """The spec's durations are ones Gazette can decode (`validate_go_duration`)."""
    try:
        _go_durations(
            spec.fragment,
            ("refresh_interval", "retention", "flush_interval"),
            ("RefreshInterval", "Retention", "FlushInterval"),
        )
    except ValidationError as err:
        raise err.extend("Fragment") from None


# --- URLs --------------------------------------------------------------------

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _GoURL(NamedTuple):
    """The parts of a URL as Go's net/url sees them (enough for validation). Immutable:
    `_parse_url` shares one per URL text."""

    scheme: str
    host: str
    path: str


# ASCII characters Go's net/url takes in a host (its encodeHost set); others must not appear,
# and only non-ASCII bytes may be %-escaped (or %25, in an IPv6 zone).
_HOST_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!\"$&'()*+,-.:;<=>[]_~"
)
_HEX = frozenset("0123456789abcdefABCDEF")


def _host_problem(host: str) -> str:
    """Why Go's net/url refuses `host` (url.parseHost), or ""."""
    address, port = host, ""
    bracket = host.rfind("[")
    if bracket > 0:
        return "invalid IP-literal"
    if bracket == 0:
        close = host.rfind("]")
        if close < 0:
            return "missing ']' in host"
        address, port = host[1:close], host[close + 1 :]
    elif (colon := host.rfind(":")) >= 0:
        port = host[colon:]
    if port and not (port[0] == ":" and all("0" <= c <= "9" for c in port[1:])):
        return f'invalid port "{port}" after host'
    zone = address.find("%25") if bracket == 0 else -1
    checked = address if zone < 0 else address[:zone]
    i = 0
    while i < len(checked):
        c = checked[i]
        if c == "%":
            escape = checked[i : i + 3]
            if len(escape) < 3 or not _HEX.issuperset(escape[1:]):
                return f'invalid URL escape "{escape}"'
            if int(escape[1], 16) < 8 and escape != "%25":
                return f'invalid URL escape "{escape}"'
            i += 3
            continue
        if c.isascii() and c not in _HOST_CHARS:
            return f'invalid character "{c}" in host name'
        i += 1
    if bracket == 0:
        try:
            ip = ipaddress.ip_address(urllib.parse.unquote(checked))
        except ValueError:
            return f"invalid host: {checked!r} is not an IP address"
        if ip.version == 4:
            return "invalid IP-literal"
    return ""


@functools.lru_cache(maxsize=4096)
def _parse_url(text: str) -> _GoURL:
    """Parse `text` as Go's net/url does (enough for validation). Memoized: the same few
    URLs (broker endpoints, fragment stores) recur in every route and spec of a listing, and
    a failure (ValidationError) is not cached."""
    if _CONTROL.search(text):
        raise ValidationError(f'parse "{text}": net/url: invalid control character in URL')
    rest = text.split("#", 1)[0]
    scheme = ""
    colon = rest.find(":")
    if colon > 0 and _SCHEME.fullmatch(rest[:colon]):
        scheme, rest = rest[:colon].lower(), rest[colon + 1 :]
    elif colon == 0:
        raise ValidationError(f'parse "{text}": missing protocol scheme')
    rest = rest.split("?", 1)[0]
    host = ""
    if scheme and not rest.startswith("/"):
        # Opaque form ("scheme:opaque"): Go leaves Host and Path empty.
        return _GoURL(scheme, "", "")
    if rest.startswith("//"):
        authority, slash, tail = rest[2:].partition("/")
        rest = slash + tail
        host = authority.rsplit("@", 1)[-1]
        problem = _host_problem(host)
        if problem:
            raise ValidationError(f'parse "{text}": {problem}')
    if _BAD_ESCAPE.search(rest):
        raise ValidationError(f'parse "{text}": invalid URL escape')
    return _GoURL(scheme, host, urllib.parse.unquote(rest))


def validate_fragment_store(url: str) -> None:
    """A fragment store URL: absolute, a known scheme, and a path ending in '/'.

    s3://, gs:// and azure:// need a bucket (host); azure-ad:// needs a tenant
    host, then storage account and container path segments; file:// takes no
    host.
    """
    parsed = _parse_url(url)
    if not parsed.scheme:
        raise ValidationError(f"not absolute ({url})")
    if parsed.scheme in ("s3", "gs", "azure"):
        if not parsed.host:
            raise ValidationError(f"missing bucket ({url})")
    elif parsed.scheme == "azure-ad":
        segments = parsed.path[1:].split("/")
        if not parsed.host:
            raise ValidationError(f"missing tenant ID ({url})")
        if segments[0] == "":
            raise ValidationError(f"missing storage account ({url})")
        if len(segments) < 2 or segments[1] == "":
            raise ValidationError(f"missing storage container ({url})")
    elif parsed.scheme == "file":
        if parsed.host:
            raise ValidationError(f"file scheme cannot have host ({url})")
    else:
        raise ValidationError(f"invalid scheme ({parsed.scheme})")
    if not parsed.path.endswith("/"):
        raise ValidationError(f"path component doesn't end in '/' ({parsed.path})")


def validate_endpoint(endpoint: str) -> None:
    """A process endpoint: an absolute URL with a host (e.g. http://host:port)."""
    parsed = _parse_url(endpoint)
    if not parsed.scheme:
        raise ValidationError(f"not absolute: {endpoint}")
    if not parsed.host:
        raise ValidationError(f"missing host: {endpoint}")


# --- labels ------------------------------------------------------------------


def validate_label_name(name: str) -> None:
    validate_token(name, "", TOKEN_SYMBOLS, MIN_LABEL_LEN, MAX_LABEL_LEN)


def validate_label_value(value: str) -> None:
    validate_token(value, "", PATH_SYMBOLS, 0, MAX_LABEL_VALUE_LEN)


def validate_label(label: pb.Label, *, allow_prefix: bool = False) -> None:
    """Name and value are well-formed; `prefix` only where allowed (selectors)."""
    validate_token(label.name, "Name", TOKEN_SYMBOLS, MIN_LABEL_LEN, MAX_LABEL_LEN)
    validate_token(label.value, "Value", PATH_SYMBOLS, 0, MAX_LABEL_VALUE_LEN)
    if label.prefix and not allow_prefix:
        raise ValidationError("Prefix may not be set outside of a LabelSelector")


def validate_label_set(ls: pb.LabelSet, *, allow_prefix: bool = False) -> None:
    """Labels are valid, sorted on (name, value), unique, and no name mixes "" with values."""
    labels = ls.labels
    for i, label in enumerate(labels):
        try:
            validate_label(label, allow_prefix=allow_prefix)
        except ValidationError as err:
            raise err.extend(f"Labels[{i}]") from None
        if i == 0:
            continue
        prev = labels[i - 1]
        if prev.name < label.name:
            continue
        if prev.name == label.name:
            if prev.value >= label.value:
                raise ValidationError(
                    f"Labels not in unique, sorted order (index {i}; label {label.name} "
                    f"value {label.value} <= {prev.value})"
                )
            if prev.value == "":
                raise ValidationError(
                    f"Label has empty & non-empty values (index {i}; label {label.name} "
                    f"value {label.value})"
                )
        else:
            raise ValidationError(
                f"Labels not in unique, sorted order (index {i}; label name {label.name} "
                f"<= {prev.name})"
            )


def validate_single_value_labels(ls: pb.LabelSet) -> None:
    """Well-known single-value labels (content-type, message-type, ...) have one value."""
    labels = ls.labels
    for i in range(1, len(labels)):
        if labels[i - 1].name == labels[i].name and labels[i].name in SINGLE_VALUE_LABELS:
            raise ValidationError(
                f"expected single-value Label has multiple values (index {i}; label "
                f"{labels[i].name} value {labels[i].value})"
            )


def validate_label_selector(sel: pb.LabelSelector) -> None:
    """Include and exclude are valid label sets (prefix labels allowed)."""
    try:
        validate_label_set(sel.include, allow_prefix=True)
    except ValidationError as err:
        raise err.extend("Include") from None
    try:
        validate_label_set(sel.exclude, allow_prefix=True)
    except ValidationError as err:
        raise err.extend("Exclude") from None


_TSPECIALS = set('()<>@,;:\\"/[]?=')


def _is_token_char(ch: str) -> bool:
    return 0x20 < ord(ch) < 0x7F and ch not in _TSPECIALS


def _consume_token(text: str) -> tuple[str, str]:
    i = 0
    while i < len(text) and _is_token_char(text[i]):
        i += 1
    return text[:i], text[i:]


@functools.lru_cache(maxsize=1024)
def _parse_media_type(value: str) -> None:
    """Raise ValueError where Go's mime.ParseMediaType would fail. Memoized (see _parse_url):
    every journal of a listing tends to carry one of a few content types."""
    base, semicolon, params = value.partition(";")
    base = base.strip(" \t\r\n").lower()
    first, rest = _consume_token(base)
    if not first:
        raise ValueError("mime: no media type")
    if rest:
        if not rest.startswith("/"):
            raise ValueError("mime: expected slash after first token")
        sub, rest = _consume_token(rest[1:])
        if not sub:
            raise ValueError("mime: expected token after slash")
        if rest:
            raise ValueError("mime: unexpected content after media subtype")
    seen: set[str] = set()
    text = semicolon + params
    while text:
        text = text.lstrip(" \t\r\n")
        if not text:
            break
        if not text.startswith(";"):
            raise ValueError("mime: invalid media parameter")
        text = text[1:].lstrip(" \t\r\n")
        if not text:
            break  # A trailing ';' is tolerated.
        key, text = _consume_token(text)
        text = text.lstrip(" \t\r\n")
        if not key or not text.startswith("="):
            raise ValueError("mime: invalid media parameter")
        text = text[1:].lstrip(" \t\r\n")
        if text.startswith('"'):
            end = 1
            while end < len(text) and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            if end >= len(text):
                raise ValueError("mime: invalid media parameter")
            text = text[end + 1 :]
        else:
            val, text = _consume_token(text)
            if not val:
                raise ValueError("mime: invalid media parameter")
        key = key.lower()
        if key in seen:
            raise ValueError("mime: duplicate parameter name")
        seen.add(key)


def _validate_journal_label_constraints(ls: pb.LabelSet) -> None:
    validate_single_value_labels(ls)
    validate_retention_bytes_label(ls)
    content_types = label_values(ls, CONTENT_TYPE_LABEL)
    if content_types:
        try:
            _parse_media_type(content_types[0])
        except ValueError as err:
            raise ValidationError(f"parsing {CONTENT_TYPE_LABEL}: {err}") from None
    if label_values(ls, MESSAGE_TYPE_LABEL):
        if not content_types:
            raise ValidationError(
                f"expected {CONTENT_TYPE_LABEL} label alongside {MESSAGE_TYPE_LABEL}"
            )
    elif label_values(ls, MESSAGE_SUB_TYPE_LABEL):
        raise ValidationError(
            f"expected {MESSAGE_TYPE_LABEL} label alongside {MESSAGE_SUB_TYPE_LABEL}"
        )


# --- journal specs -------------------------------------------------------------


def validate_compression_codec(codec: int) -> None:
    if codec == pb.INVALID or codec not in pb.CompressionCodec.values():
        raise ValidationError(f"invalid value ({_enum_name(pb.CompressionCodec, codec)})")


def _enum_name(enum: Any, value: int) -> str:
    try:
        return str(enum.Name(value))
    except ValueError:
        return str(value)


_GO_SPACE = (" ", "\t", "\r", "\n")  # What text/template takes as a trim marker's space.


def _validate_postfix_template(template: str) -> None:
    """Approximates Go's text/template parse of a path postfix template.

    Checks that every ``{{`` action is closed and not empty. Gazette also
    executes the template over a zero-valued spool, rejecting unknown
    fields; that part is not reproduced.
    """
    rest = template
    while (start := rest.find("{{")) != -1:
        body = start + 2
        if rest[body : body + 1] == "-" and rest[body + 1 : body + 2] in _GO_SPACE:
            body += 2  # A left trim marker.
        if rest.startswith("/*", body):
            # A comment runs to "*/", then closes at once ("}}", or " -}}").
            close = rest.find("*/", body + 2)
            if close == -1:
                raise ValidationError("template: postfix:1: unclosed comment")
            after = close + 2
            if rest[after : after + 1] in _GO_SPACE and rest.startswith("-}}", after + 1):
                after += 2
            if not rest.startswith("}}", after):
                raise ValidationError("template: postfix:1: comment ends before closing delimiter")
            rest = rest[after + 2 :]
            continue
        end = rest.find("}}", start + 2)
        if end == -1:
            raise ValidationError("template: postfix:1: unclosed action")
        action = rest[start + 2 : end]
        if action.startswith("-"):
            action = action[1:]
        if action.endswith("-"):
            action = action[:-1]
        if not action.strip():
            raise ValidationError("template: postfix:1: missing value for command")
        rest = rest[end + 2 :]


def _validate_spec_fragment(frag: pb.JournalSpec.Fragment) -> None:
    if frag.length < MIN_FRAGMENT_LEN or frag.length > MAX_FRAGMENT_LEN:
        raise ValidationError(
            f"invalid Length ({frag.length}; expected {MIN_FRAGMENT_LEN} <= length <= "
            f"{MAX_FRAGMENT_LEN})"
        )
    try:
        validate_compression_codec(frag.compression_codec)
    except ValidationError as err:
        raise err.extend("CompressionCodec") from None
    for i, store in enumerate(frag.stores):
        try:
            validate_fragment_store(store)
        except ValidationError as err:
            raise err.extend(f"Stores[{i}]") from None
        if (
            i == 0
            and _parse_url(store).scheme == "file"
            and frag.compression_codec == pb.GZIP_OFFLOAD_DECOMPRESSION
        ):
            raise ValidationError(
                f"GZIP_OFFLOAD_DECOMPRESSION is incompatible with file:// stores ({store})"
            )
    refresh = _duration_nanos(frag.refresh_interval)
    lo, hi = MIN_REFRESH_INTERVAL_SECONDS * _NANOS, MAX_REFRESH_INTERVAL_SECONDS * _NANOS
    if refresh < lo or refresh > hi:
        raise ValidationError(
            f"invalid RefreshInterval ({_go_duration(0, refresh)}; expected "
            f"{_go_duration(MIN_REFRESH_INTERVAL_SECONDS)} <= interval <= "
            f"{_go_duration(MAX_REFRESH_INTERVAL_SECONDS)})"
        )
    flush = _duration_nanos(frag.flush_interval)
    if flush != 0 and flush < MIN_FLUSH_INTERVAL_SECONDS * _NANOS:
        raise ValidationError(
            f"invalid FlushInterval ({_go_duration(0, flush)}; expected >= "
            f"{_go_duration(MIN_FLUSH_INTERVAL_SECONDS)})"
        )
    try:
        _validate_postfix_template(frag.path_postfix_template)
    except ValidationError as err:
        raise err.extend("PathPostfixTemplate") from None
    # Retention: every value is allowed (<= 0 keeps fragments forever).


_FLAGS = pb.JournalSpec
_VALID_FLAGS = frozenset({_FLAGS.NOT_SPECIFIED, _FLAGS.O_RDONLY, _FLAGS.O_WRONLY, _FLAGS.O_RDWR})


def _validate_suspend(spec: pb.JournalSpec) -> None:
    if not spec.HasField("suspend"):
        return
    level = spec.suspend.level
    if level not in pb.JournalSpec.Suspend.Level.values():
        raise ValidationError(f"invalid Level variant ({level})").extend("Level")
    if spec.suspend.offset < 0:
        raise ValidationError(f"invalid Offset ({spec.suspend.offset}; expected >= 0)").extend(
            "Offset"
        )


def validate_journal_spec(spec: pb.JournalSpec) -> None:
    """A complete, valid JournalSpec (Gazette's JournalSpec.Validate)."""
    _, meta = split_journal_meta(spec.name)
    try:
        validate_journal_name(spec.name)
    except ValidationError as err:
        raise err.extend("Name") from None
    if meta:
        raise ValidationError(
            f"Name cannot have a metadata path segment ({meta}; expected no segment)"
        )
    if spec.replication < 1 or spec.replication > MAX_JOURNAL_REPLICATION:
        raise ValidationError(
            f"invalid Replication ({spec.replication}; expected 1 <= Replication <= "
            f"{MAX_JOURNAL_REPLICATION})"
        )
    try:
        validate_label_set(spec.labels)
    except ValidationError as err:
        raise err.extend("Labels") from None
    if label_values(spec.labels, META_LABEL_NAME):
        raise ValidationError('Labels cannot include label "name"')
    if label_values(spec.labels, META_LABEL_PREFIX):
        raise ValidationError('Labels cannot include label "prefix"')
    try:
        _validate_journal_label_constraints(spec.labels)
    except ValidationError as err:
        raise err.extend("Labels") from None
    try:
        _validate_spec_fragment(spec.fragment)
    except ValidationError as err:
        raise err.extend("Fragment") from None
    if spec.flags not in _VALID_FLAGS:
        raise ValidationError(
            f"invalid combination ({_enum_name(pb.JournalSpec.Flag, spec.flags)})"
        ).extend("Flags")
    if spec.max_append_rate < 0:
        raise ValidationError(f"invalid MaxAppendRate ({spec.max_append_rate}; expected >= 0)")
    try:
        _validate_suspend(spec)
    except ValidationError as err:
        raise err.extend("Suspend") from None


def journal_spec_flags_allow_read(spec: pb.JournalSpec) -> bool:
    """Reads are allowed: flags NOT_SPECIFIED, O_RDONLY or O_RDWR."""
    return spec.flags in (_FLAGS.NOT_SPECIFIED, _FLAGS.O_RDONLY, _FLAGS.O_RDWR)


def journal_spec_flags_allow_write(spec: pb.JournalSpec) -> bool:
    """Writes are allowed: flags NOT_SPECIFIED, O_WRONLY or O_RDWR."""
    return spec.flags in (_FLAGS.NOT_SPECIFIED, _FLAGS.O_WRONLY, _FLAGS.O_RDWR)


# --- processes, routes, headers --------------------------------------------------


def validate_process_id(pid: pb.ProcessSpec.ID) -> None:
    _validate_zone_and_suffix(pid.zone, pid.suffix)


@functools.lru_cache(maxsize=4096)
def _validate_zone_and_suffix(zone: str, suffix: str) -> None:
    """Memoized (a failure is not): a cluster's few process IDs recur in every route."""
    validate_token(zone, "Zone", TOKEN_SYMBOLS, MIN_ZONE_LEN, MAX_ZONE_LEN)
    validate_token(suffix, "Suffix", TOKEN_SYMBOLS, MIN_BROKER_SUFFIX_LEN, MAX_BROKER_SUFFIX_LEN)


def _pid_text(pid: pb.ProcessSpec.ID) -> str:
    return f"{{Zone:{pid.zone} Suffix:{pid.suffix}}}"


def validate_route(route: pb.Route) -> None:
    """Members valid and strictly sorted on (zone, suffix); primary in range; endpoints aligned."""
    members = route.members
    for i, member in enumerate(members):
        try:
            validate_process_id(member)
        except ValidationError as err:
            raise err.extend(f"Members[{i}]") from None
        if i and (members[i - 1].zone, members[i - 1].suffix) >= (member.zone, member.suffix):
            raise ValidationError(
                f"Members not in unique, sorted order (index {i}; {_pid_text(members[i - 1])} "
                f"<= {_pid_text(member)})"
            )
    if route.primary < -1 or route.primary >= len(members):
        raise ValidationError(
            f"invalid Primary ({route.primary}; expected -1 <= Primary < {len(members)})"
        )
    if route.endpoints and len(route.endpoints) != len(members):
        raise ValidationError(
            f"len(Endpoints) != 0, and != len(Members) ({len(route.endpoints)} vs {len(members)})"
        )
    for i, endpoint in enumerate(route.endpoints):
        if not endpoint:
            continue
        try:
            validate_endpoint(endpoint)
        except ValidationError as err:
            raise err.extend(f"Endpoints[{i}]") from None


def validate_header(h: pb.Header) -> None:
    """Process ID (when set), route, and a complete etcd header."""
    if h.process_id.zone or h.process_id.suffix:
        try:
            validate_process_id(h.process_id)
        except ValidationError as err:
            raise err.extend("ProcessId") from None
    try:
        validate_route(h.route)
    except ValidationError as err:
        raise err.extend("Route") from None
    etcd = h.etcd
    problem = ""
    if etcd.cluster_id == 0:
        problem = "invalid ClusterId (expected != 0)"
    elif etcd.member_id == 0:
        problem = "invalid MemberId (expected != 0)"
    elif etcd.revision <= 0:
        problem = f"invalid Revision ({etcd.revision}; expected 0 < revision)"
    elif etcd.raft_term == 0:
        problem = "invalid RaftTerm (expected != 0)"
    if problem:
        raise ValidationError(problem, ["Etcd"])


def validate_process_spec(spec: pb.ProcessSpec) -> None:
    """A valid process ID and endpoint (the part a BrokerSpec and a ConsumerSpec share)."""
    try:
        validate_process_id(spec.id)
    except ValidationError as err:
        raise err.extend("Id") from None
    try:
        validate_endpoint(spec.endpoint)
    except ValidationError as err:
        raise err.extend("Endpoint") from None


def validate_broker_spec(spec: pb.BrokerSpec) -> None:
    validate_process_spec(spec.process_spec)
    if spec.journal_limit > MAX_BROKER_JOURNAL_LIMIT:
        raise ValidationError(
            f"invalid JournalLimit ({spec.journal_limit}; expected 0 <= JournalLimit <= "
            f"{MAX_BROKER_JOURNAL_LIMIT})"
        )


# Known Status values (a set: `pb.Status.values()` builds a new list on every call, and a
# status is checked on every response a client receives).
_STATUSES = frozenset(pb.Status.values())


def validate_status(status: int) -> None:
    if status not in _STATUSES:
        raise ValidationError(f"invalid status ({status})")


# --- fragments -------------------------------------------------------------------


def validate_fragment(f: pb.Fragment) -> None:
    """Journal valid, begin <= end, a real codec, and a clean path postfix."""
    try:
        validate_journal_name(f.journal)
    except ValidationError as err:
        raise err.extend("Journal") from None
    if f.begin > f.end:
        raise ValidationError(f"expected Begin <= End (have {f.begin}, {f.end})")
    try:
        validate_compression_codec(f.compression_codec)
    except ValidationError as err:
        raise err.extend("CompressionCodec") from None
    validate_path_component(f.path_postfix, "PathPostfix", 0, MAX_JOURNAL_NAME_LEN)


# --- requests and responses ---------------------------------------------------------


def _maybe_header(msg: Any) -> None:
    if msg.HasField("header"):
        try:
            validate_header(msg.header)
        except ValidationError as err:
            raise err.extend("Header") from None


def _journal_field(journal: str, field: str = "Journal") -> None:
    try:
        validate_journal_name(journal)
    except ValidationError as err:
        raise err.extend(field) from None


def validate_read_request(req: pb.ReadRequest) -> None:
    _maybe_header(req)
    _journal_field(req.journal)
    if req.offset < -1:
        raise ValidationError(f"invalid Offset ({req.offset}; expected -1 <= Offset <= MaxInt64)")
    if req.end_offset < 0 or (req.end_offset != 0 and req.end_offset < req.offset):
        raise ValidationError(
            f"invalid EndOffset ({req.end_offset}; expected 0 or Offset <= EndOffset)"
        )


def validate_append_request(req: pb.AppendRequest, *, first: bool = True) -> None:
    """The first message of an Append stream (``first=True``) or a content chunk.

    The first message names the journal and carries the options, but no
    content; chunks carry only content (an empty chunk commits).
    """
    if first:
        _maybe_header(req)
        _journal_field(req.journal)
        if req.offset < 0:
            raise ValidationError(f"invalid Offset ({req.offset}; expected >= 0)")
        if req.content:
            raise ValidationError("unexpected Content")
        if req.HasField("check_registers"):
            try:
                validate_label_selector(req.check_registers)
            except ValidationError as err:
                raise err.extend("CheckRegisters") from None
        for field in ("union_registers", "subtract_registers"):
            if req.HasField(field):
                try:
                    validate_label_set(getattr(req, field))
                except ValidationError as err:
                    name = "UnionRegisters" if field == "union_registers" else "SubtractRegisters"
                    raise err.extend(name) from None
        if req.suspend not in pb.AppendRequest.Suspend.values():
            raise ValidationError(f"invalid Suspend variant ({req.suspend})").extend("Suspend")
        return
    unexpected = [
        (req.journal != "", "Journal"),
        (req.HasField("header"), "Header"),
        (req.do_not_proxy, "DoNotProxy"),
        (req.offset != 0, "Offset"),
        (req.HasField("check_registers"), "CheckRegisters"),
        (req.HasField("union_registers"), "UnionRegisters"),
        (req.HasField("subtract_registers"), "SubtractRegisters"),
    ]
    for present, name in unexpected:
        if present:
            raise ValidationError(f"unexpected {name}")
    if req.suspend != pb.AppendRequest.SUSPEND_RESUME:
        raise ValidationError(
            f"unexpected Suspend ({_enum_name(pb.AppendRequest.Suspend, req.suspend)}; "
            "expected SUSPEND_RESUMED)"
        )


def validate_append_response(resp: pb.AppendResponse) -> None:
    try:
        validate_status(resp.status)
    except ValidationError as err:
        raise err.extend("Status") from None
    try:
        validate_header(resp.header)
    except ValidationError as err:
        raise err.extend("Header") from None
    if resp.status == pb.OK and not resp.HasField("commit"):
        raise ValidationError("expected Commit")
    if resp.status in (pb.OK, pb.REGISTER_MISMATCH) and not resp.HasField("registers"):
        raise ValidationError("expected Registers")
    if resp.HasField("commit"):
        try:
            validate_fragment(resp.commit)
        except ValidationError as err:
            raise err.extend("Commit") from None
    if resp.HasField("registers"):
        try:
            validate_label_set(resp.registers)
        except ValidationError as err:
            raise err.extend("Registers") from None


def validate_replicate_request(req: pb.ReplicateRequest) -> None:
    """A proposal (first with a Header) or a content chunk."""
    if req.HasField("proposal"):
        if req.HasField("header"):
            _maybe_header(req)
            if not req.acknowledge:
                raise ValidationError("expected Acknowledge with Header")
        try:
            validate_fragment(req.proposal)
        except ValidationError as err:
            raise err.extend("Proposal") from None
        try:
            validate_label_set(req.registers)
        except ValidationError as err:
            raise err.extend("Registers") from None
        if req.content:
            raise ValidationError(f"unexpected Content with Proposal (len {len(req.content)})")
        if req.content_delta != 0:
            raise ValidationError(f"unexpected ContentDelta with Proposal ({req.content_delta})")
        if req.deprecated_journal and req.deprecated_journal != req.proposal.journal:
            raise ValidationError(
                f"DeprecatedJournal and Proposal.Journal mismatch ({req.deprecated_journal} "
                f"vs {req.proposal.journal})"
            )
        return
    if not req.content:
        raise ValidationError("expected Content or Proposal")
    if req.content_delta < 0:
        raise ValidationError(f"invalid ContentDelta ({req.content_delta}; expected >= 0)")
    if req.HasField("header"):
        raise ValidationError("unexpected Header with Content")
    if req.HasField("registers"):
        raise ValidationError("unexpected Registers with Content")
    if req.acknowledge:
        raise ValidationError("unexpected Acknowledge with Content")
    if req.deprecated_journal:
        raise ValidationError("unexpected DeprecatedJournal with Content")


def validate_replicate_response(resp: pb.ReplicateResponse) -> None:
    try:
        validate_status(resp.status)
    except ValidationError as err:
        raise err.extend("Status") from None
    if resp.status == pb.WRONG_ROUTE:
        if not resp.HasField("header"):
            raise ValidationError("expected Header")
        _maybe_header(resp)
    elif resp.HasField("header"):
        raise ValidationError("unexpected Header")
    if resp.status == pb.PROPOSAL_MISMATCH:
        if not resp.HasField("fragment"):
            raise ValidationError("expected Fragment")
        try:
            validate_fragment(resp.fragment)
        except ValidationError as err:
            raise err.extend("Fragment") from None
        if not resp.HasField("registers"):
            raise ValidationError("expected Registers")
        try:
            validate_label_set(resp.registers)
        except ValidationError as err:
            raise err.extend("Registers") from None
    elif resp.HasField("fragment"):
        raise ValidationError("unexpected Fragment")
    elif resp.HasField("registers"):
        raise ValidationError("unexpected Registers")


def validate_whole_replicate_response(resp: ppb.WholeReplicateResponse) -> None:
    """A peer's answers to a whole replication (`pygazette.PeerJournal/ReplicateWhole`): each a
    valid ReplicateResponse, and none but the last other than OK (the peer stops there)."""
    last = len(resp.responses) - 1
    for i, r in enumerate(resp.responses):
        try:
            validate_replicate_response(r)
        except ValidationError as err:
            raise err.extend(f"Responses[{i}]") from None
        if r.status != pb.OK and i != last:
            raise ValidationError(f"Responses[{i}]: not OK, yet followed by more")
    if resp.refused and last >= 0 and resp.responses[last].status != pb.OK:
        raise ValidationError("unexpected Refused after a response that is not OK")


def validate_list_request(req: pb.ListRequest) -> None:
    """A valid selector, whose "prefix" meta-label values each end in '/'."""
    try:
        validate_label_selector(req.selector)
    except ValidationError as err:
        raise err.extend("Selector") from None
    for part, labels in (("Include", req.selector.include), ("Exclude", req.selector.exclude)):
        for value in label_values(labels, META_LABEL_PREFIX):
            if not value.endswith("/"):
                raise ValidationError(
                    f"Selector.{part}.Labels[\"prefix\"]: expected trailing '/' ({value})"
                )


def validate_apply_change(
    change: Any, validate_spec: Callable[[Any], None], validate_name: Callable[[str], None]
) -> None:
    """One change of an ApplyRequest, of journals or of shards: exactly one of an upsert (a
    spec valid by `validate_spec`) or a delete (a name valid by `validate_name`), with a sane
    expect_mod_revision: >= 0 (0 creates) or -1 (any) for an upsert, > 0 or -1 for a delete."""
    rev = change.expect_mod_revision
    if change.HasField("upsert"):
        if change.delete:
            raise ValidationError("both Upsert and Delete are set (expected exactly one)")
        try:
            validate_spec(change.upsert)
        except ValidationError as err:
            raise err.extend("Upsert") from None
        if rev < 0 and rev != -1:
            raise ValidationError(f"invalid ExpectModRevision ({rev}; expected >= 0 or -1)")
    elif change.delete:
        try:
            validate_name(change.delete)
        except ValidationError as err:
            raise err.extend("Delete") from None
        if rev <= 0 and rev != -1:
            raise ValidationError(f"invalid ExpectModRevision ({rev}; expected > 0 or -1)")
    else:
        raise ValidationError("neither Upsert nor Delete are set (expected exactly one)")


def _validate_applied_spec(spec: pb.JournalSpec) -> None:
    validate_journal_spec(spec)
    # Not part of validate_journal_spec (Gazette finds such durations when it decodes, and a
    # spec stored before this check stays readable here), but none may be applied.
    validate_journal_spec_durations(spec)


def _validate_change(change: pb.ApplyRequest.Change) -> None:
    validate_apply_change(change, _validate_applied_spec, validate_journal_name)


def validate_apply_request(req: pb.ApplyRequest) -> None:
    """Each change is exactly one of upsert / delete, with a sane expect_mod_revision.

    Upsert: revision >= 0 (0 creates) or -1 (any). Delete: revision > 0 or -1.
    """
    for i, change in enumerate(req.changes):
        try:
            _validate_change(change)
        except ValidationError as err:
            raise err.extend(f"Changes[{i}]") from None


def validate_fragments_request(req: pb.FragmentsRequest) -> None:
    _maybe_header(req)
    _journal_field(req.journal)
    if req.end_mod_time != 0 and req.end_mod_time < req.begin_mod_time:
        raise ValidationError(
            f"invalid EndModTime ({req.end_mod_time} must be after {req.begin_mod_time})"
        )
    if req.next_page_token < 0:
        raise ValidationError(f"invalid NextPageToken ({req.next_page_token}; must be >= 0)")
    if req.page_limit < 0 or req.page_limit > MAX_FRAGMENTS_PAGE_LIMIT:
        raise ValidationError(
            f"invalid PageLimit ({req.page_limit}; must be >= 0 and <= {MAX_FRAGMENTS_PAGE_LIMIT})"
        )
    if req.HasField("signatureTTL") and _duration_nanos(req.signatureTTL) <= 0:
        raise ValidationError(
            f"invalid SignatureTTL ({_go_duration(0, _duration_nanos(req.signatureTTL))}; "
            "must be > 0s)"
        )


def validate_fragment_store_health_request(req: pb.FragmentStoreHealthRequest) -> None:
    try:
        validate_fragment_store(req.fragment_store)
    except ValidationError as err:
        raise err.extend("FragmentStore") from None


def _status_and_header(resp: Any, *, header_required: bool = True) -> None:
    try:
        validate_status(resp.status)
    except ValidationError as err:
        raise err.extend("Status") from None
    if header_required or resp.HasField("header"):
        try:
            validate_header(resp.header)
        except ValidationError as err:
            raise err.extend("Header") from None


def _url_field(url: str, field: str) -> None:
    try:
        _parse_url(url)
    except ValidationError as err:
        raise err.extend(field) from None


def validate_read_response(resp: pb.ReadResponse) -> None:
    """Either a content chunk (nothing else set) or metadata about a fragment."""
    try:
        validate_status(resp.status)
    except ValidationError as err:
        raise err.extend("Status") from None
    if resp.content:
        if resp.status != pb.OK:
            raise ValidationError(
                f"unexpected Status with Content ({_enum_name(pb.Status, resp.status)})"
            )
        for present, name in (
            (resp.HasField("header"), "Header"),
            (resp.write_head != 0, "WriteHead"),
            (resp.HasField("fragment"), "Fragment"),
            (resp.fragment_url != "", "FragmentUrl"),
        ):
            if present:
                raise ValidationError(f"unexpected {name} with Content")
        return
    _maybe_header(resp)
    if resp.write_head < 0:
        raise ValidationError(f"invalid WriteHead ({resp.write_head}; expected >= 0)")
    if resp.HasField("fragment"):
        frag = resp.fragment
        try:
            validate_fragment(frag)
        except ValidationError as err:
            raise err.extend("Fragment") from None
        if resp.offset < frag.begin or resp.offset >= frag.end:
            raise ValidationError(
                f"invalid Offset ({resp.offset}; expected {frag.begin} <= offset < {frag.end})"
            )
        if resp.write_head < frag.end:
            raise ValidationError(f"invalid WriteHead ({resp.write_head}; expected >= {frag.end})")
        if resp.fragment_url:
            _url_field(resp.fragment_url, "FragmentUrl")
    elif resp.status == pb.OK and resp.offset != 0:
        raise ValidationError(f"unexpected Offset without Fragment or Content ({resp.offset})")
    elif resp.fragment_url:
        raise ValidationError(f"unexpected FragmentUrl without Fragment ({resp.fragment_url})")


def validate_list_journal(journal: pb.ListResponse.Journal) -> None:
    """One journal of a listing: a valid spec, a mod revision > 0 and a valid route."""
    try:
        validate_journal_spec(journal.spec)
    except ValidationError as err:
        raise err.extend("Spec") from None
    if journal.mod_revision <= 0:
        raise ValidationError(f"invalid ModRevision ({journal.mod_revision}; expected > 0)")
    try:
        validate_route(journal.route)
    except ValidationError as err:
        raise err.extend("Route") from None


def validate_list_journals(resp: pb.ListResponse) -> None:
    """The journals of a ListResponse (all a snapshot's later responses carry: Gazette's client
    validates the whole of a snapshot's first response only, with its status and header)."""
    for i, journal in enumerate(resp.journals):
        try:
            validate_list_journal(journal)
        except ValidationError as err:
            raise err.extend(f"Journals[{i}]") from None


def validate_list_response(resp: pb.ListResponse) -> None:
    """A snapshot's first response: status, header and journals."""
    _status_and_header(resp)
    validate_list_journals(resp)


def validate_apply_response(resp: pb.ApplyResponse) -> None:
    _status_and_header(resp)


def validate_fragments_response(resp: pb.FragmentsResponse) -> None:
    _status_and_header(resp)
    for i, item in enumerate(resp.fragments):
        try:
            try:
                validate_fragment(item.spec)
            except ValidationError as err:
                raise err.extend("Spec") from None
            _url_field(item.signed_url, "SignedUrl")
        except ValidationError as err:
            raise err.extend(f"Fragments[{i}]") from None


def validate_fragment_store_health_response(resp: pb.FragmentStoreHealthResponse) -> None:
    _status_and_header(resp)
