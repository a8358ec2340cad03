"""Fragment store URLs: their parts and Gazette's query arguments.

A store URL is `<scheme>://<host>/<path>/?<args>`: the host is the bucket (s3, gs), the
container (azure) or the tenant (azure-ad), and the path — which must end in '/' — prefixes
every object the store holds. Query arguments are Gazette's, matched case-insensitively as
Gazette's decoder matches them, and unknown ones are refused:

- every scheme: `find` and `replace`, which rewrite the first occurrence of `find` in an
  object's path (`<journal>/<postfix>/<name>`) to `replace` (nothing without `find`);
- s3 also: `endpoint`, `region`, `profile`, `storageClass`, `SSE`, `SSEKMSKeyId`, `ACL`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.validation import validate_fragment_store
from pygazette.stores.interface import StoreError

# Canonical (Gazette field) names of the arguments each scheme accepts.
_COMMON_ARGS = ("Find", "Replace")
_S3_ARGS = ("Profile", "Endpoint", "ACL", "StorageClass", "SSE", "SSEKMSKeyId", "Region")
SCHEME_ARGS: dict[str, tuple[str, ...]] = {
    "file": _COMMON_ARGS,
    "s3": _COMMON_ARGS + _S3_ARGS,
    "gs": _COMMON_ARGS,
    "azure": _COMMON_ARGS,
    "azure-ad": _COMMON_ARGS,
}


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed, validated fragment store URL."""

    url: str
    scheme: str
    host: str
    path: str  # Begins and ends with '/'.
    args: dict[str, str] = field(default_factory=dict)  # Canonical name -> value.

    @property
    def prefix(self) -> str:
        """The path without its leading '/': what object keys begin with ("" or "a/b/")."""
        return self.path[1:]

    def arg(self, name: str) -> str:
        return self.args.get(name, "")

    def rewrite(self, path: str) -> str:
        """`path` with the first occurrence of `find` replaced (Gazette's RewriterConfig)."""
        find = self.arg("Find")
        if not find:
            return path
        return path.replace(find, self.arg("Replace"), 1)


def parse_store_url(url: str) -> StoreURL:
    """Parse and validate `url`; StoreError names what is wrong with it."""
    try:
        validate_fragment_store(url)
    except ValidationError as exc:
        raise StoreError(f"invalid fragment store URL {url!r}: {exc}") from None
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    allowed = SCHEME_ARGS.get(scheme)
    if allowed is None:
        raise StoreError(f"unsupported fragment store scheme {scheme!r} ({url})")
    by_lower = {name.lower(): name for name in allowed}
    args: dict[str, str] = {}
    spelled: dict[str, str] = {}  # Canonical name -> the key it was given as.
    for key, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        name = by_lower.get(key.lower())
        if name is None:
            raise StoreError(
                f"fragment store URL {url!r}: unknown query argument {key!r} "
                f"(a {scheme}:// store takes {', '.join(allowed)})"
            )
        # A key given again takes its last value, as Gazette's decoder does. Two spellings
        # of one argument with different values are refused: which Gazette takes depends
        # on Go's map order.
        if name in args and spelled[name] != key and args[name] != value:
            raise StoreError(
                f"fragment store URL {url!r}: query argument {key!r} is repeated "
                f"as {spelled[name]!r} with another value"
            )
        args[name], spelled[name] = value, key
    # replace= without find= rewrites nothing (Gazette's RewritePath), and is accepted.
    return StoreURL(
        url=url,
        scheme=scheme,
        host=parts.netloc.rsplit("@", 1)[-1],
        path=unquote(parts.path) or "/",
        args=args,
    )
