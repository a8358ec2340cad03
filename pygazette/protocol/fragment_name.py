"""Fragment file names and paths, and SHA-1 sums in their protocol form.

A fragment is stored at ``<store>/<journal>/[<path postfix>/]<name>`` where
``<name>`` is ``%016x-%016x-<sha1 hex><ext>`` of its [begin, end) offsets, the
SHA-1 of its uncompressed content, and the extension of its codec. Names are
produced and parsed exactly as Gazette's Fragment.ContentName / ContentPath /
ParseFragmentFromRelativePath do, so both systems can share a store.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import cast

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import go_path_clean, validate_fragment

__all__ = [
    "CODEC_EXTENSIONS",
    "CODEC_FROM_EXTENSION",
    "codec_from_extension",
    "codec_to_extension",
    "fragment_content_path",
    "fragment_file_name",
    "fragment_location",
    "parse_fragment_file_name",
    "parse_fragment_path",
    "sha1sum_from_digest",
    "sha1sum_from_hex",
    "sha1sum_is_zero",
    "sha1sum_to_digest",
    "sha1sum_to_hex",
    "under_another_journal",
]

# The extension Gazette gives each codec's fragment files. Note that
# GZIP_OFFLOAD_DECOMPRESSION files are written with NO extension: Gazette's
# ToExtension returns "" for it (".gzod" is accepted when reading, and is
# reserved for a future switch upstream).
CODEC_EXTENSIONS: dict[int, str] = {
    pb.NONE: ".raw",
    pb.GZIP: ".gz",
    pb.ZSTANDARD: ".zst",
    pb.SNAPPY: ".sz",
    pb.GZIP_OFFLOAD_DECOMPRESSION: "",
}

# Every extension accepted when parsing (matched case-insensitively).
CODEC_FROM_EXTENSION: dict[str, int] = {
    ".raw": pb.NONE,
    ".gz": pb.GZIP,
    ".gzip": pb.GZIP,
    ".zst": pb.ZSTANDARD,
    ".zstandard": pb.ZSTANDARD,
    ".sz": pb.SNAPPY,
    ".snappy": pb.SNAPPY,
    "": pb.GZIP_OFFLOAD_DECOMPRESSION,
    ".gzod": pb.GZIP_OFFLOAD_DECOMPRESSION,
}

_SHA1_SIZE = 20
_PARTS = struct.Struct(">QQI")
_MAX_INT64 = (1 << 63) - 1
_HEX_INT = re.compile(r"\+?[0-9A-Fa-f]+")
_HEX_BYTES = re.compile(r"(?:[0-9A-Fa-f]{2})*")


def codec_to_extension(codec: int) -> str:
    """The file extension Gazette writes for `codec` (ValidationError if not a codec)."""
    try:
        return CODEC_EXTENSIONS[codec]
    except KeyError:
        raise ValidationError(f"invalid CompressionCodec ({codec})") from None


def codec_from_extension(ext: str) -> int:
    """The codec of a file extension (with its dot; "" means GZIP_OFFLOAD_DECOMPRESSION)."""
    try:
        return CODEC_FROM_EXTENSION[ext.lower()]
    except KeyError:
        raise ValidationError(f"unrecognized compression extension: {ext}") from None


# --- SHA-1 sums -------------------------------------------------------------------


def sha1sum_from_digest(digest: bytes) -> pb.SHA1Sum:
    """A SHA1Sum from a 20-byte digest (big-endian parts, as Gazette)."""
    if len(digest) != _SHA1_SIZE:
        raise ValidationError(f"invalid SHA1Sum length: {bytes(digest).hex()}")
    part1, part2, part3 = _PARTS.unpack(bytes(digest))
    return pb.SHA1Sum(part1=part1, part2=part2, part3=part3)


def sha1sum_to_digest(s: pb.SHA1Sum) -> bytes:
    return _PARTS.pack(s.part1, s.part2, s.part3)


def sha1sum_to_hex(s: pb.SHA1Sum) -> str:
    return sha1sum_to_digest(s).hex()


def sha1sum_from_hex(text: str) -> pb.SHA1Sum:
    """A SHA1Sum from 40 hex digits (either case)."""
    if not _HEX_BYTES.fullmatch(text):
        raise ValidationError(f"encoding/hex: invalid hex sum ({text})")
    return sha1sum_from_digest(bytes.fromhex(text))


def sha1sum_is_zero(s: pb.SHA1Sum) -> bool:
    """Zero sum: by convention, the sum of a fragment with no content."""
    return s.part1 == 0 and s.part2 == 0 and s.part3 == 0


# --- names and paths ---------------------------------------------------------------


def _go_hex(value: int) -> str:
    # Go's %016x of an int64: zero-padded to 16, sign first when negative.
    return f"{value:016x}" if value >= 0 else "-" + f"{-value:015x}"


def fragment_file_name(frag: pb.Fragment) -> str:
    """``%016x-%016x-<sha1 hex><ext>`` (Gazette's Fragment.ContentName)."""
    return (
        f"{_go_hex(frag.begin)}-{_go_hex(frag.end)}-{sha1sum_to_hex(frag.sum)}"
        f"{codec_to_extension(frag.compression_codec)}"
    )


def fragment_content_path(frag: pb.Fragment) -> str:
    """``<journal>/[<path postfix>/]<file name>``, relative to the store root.

    Like Gazette's ContentPath, the parts are joined and cleaned as Go's
    path.Join does (an empty postfix contributes nothing).
    """
    parts = [p for p in (frag.journal, frag.path_postfix, fragment_file_name(frag)) if p]
    return go_path_clean("/".join(parts))


def fragment_location(frag: pb.Fragment) -> str:
    """Where the fragment lives, for people to read: its store URL (without query arguments)
    and its content path."""
    store = frag.backing_store.split("?", 1)[0]
    return store + fragment_content_path(frag)


def _go_path_dir(path: str) -> str:
    return go_path_clean(path[: path.rfind("/") + 1])


def _go_path_ext(name: str) -> str:
    for i in range(len(name) - 1, -1, -1):
        if name[i] == "/":
            break
        if name[i] == ".":
            return name[i:]
    return ""


def _parse_hex_int64(text: str, field: str) -> int:
    if not _HEX_INT.fullmatch(text):
        raise ValidationError(f'strconv.ParseInt: parsing "{text}": invalid syntax', [field])
    value = int(text, 16)
    if value > _MAX_INT64:
        raise ValidationError(f'strconv.ParseInt: parsing "{text}": value out of range', [field])
    return value


def under_another_journal(
    journal: str, frag: pb.Fragment, is_journal: Callable[[str], bool]
) -> bool:
    """Whether `frag`, listed under `<journal>/`, lies under another journal named
    `<journal>/<...>` (`is_journal`): a store lists a nested journal's files (`a/b/c`'s under
    `a/b/`) as fragments with a postfix (`c`), which are not `journal`'s."""
    name = journal
    for part in frag.path_postfix.split("/") if frag.path_postfix else ():
        name = f"{name}/{part}"
        if is_journal(name):
            return True
    return False


def parse_fragment_path(journal: str, relative_path: str) -> pb.Fragment:
    """Parse a fragment from its path under ``<store>/<journal>/``.

    `relative_path` is ``[<postfix>/]<begin>-<end>-<sha1><ext>``; the journal
    is given separately. The result is validated as a Fragment (journal name,
    begin <= end, a clean postfix); any problem raises ValidationError, including a path that
    is not UTF-8 (a file name's undecodable bytes, as os.fsdecode escapes them), which a
    Fragment's string fields cannot hold.
    """
    try:
        relative_path.encode()
    except UnicodeEncodeError:
        raise ValidationError(f"wrong Fragment format: {relative_path!r} is not UTF-8") from None
    name = relative_path
    postfix = _go_path_dir(name)
    if postfix == ".":
        postfix = ""
    else:
        name = name[len(postfix) + 1 :]

    ext = _go_path_ext(name)
    stem = name[: len(name) - len(ext)]
    fields = stem.split("-")
    if len(fields) != 3:
        raise ValidationError(f"wrong Fragment format: {stem}")
    begin = _parse_hex_int64(fields[0], "Begin")
    end = _parse_hex_int64(fields[1], "End")
    sum_text = fields[2]
    if len(sum_text) % 2:
        raise ValidationError("encoding/hex: odd length hex string", ["Sum"])
    if not _HEX_BYTES.fullmatch(sum_text):
        raise ValidationError(f"encoding/hex: invalid byte in {sum_text!r}", ["Sum"])
    digest = bytes.fromhex(sum_text)
    if len(digest) != _SHA1_SIZE:
        raise ValidationError(f"invalid SHA1Sum length: {digest.hex()}")
    frag = pb.Fragment(
        journal=journal,
        begin=begin,
        end=end,
        sum=sha1sum_from_digest(digest),
        compression_codec=cast(pb.CompressionCodec, codec_from_extension(ext)),
        path_postfix=postfix,
    )
    validate_fragment(frag)
    return frag


def parse_fragment_file_name(journal: str, name: str) -> pb.Fragment:
    """Parse a bare fragment file name (no directories) of `journal`."""
    if "/" in name:
        raise ValidationError(f"wrong Fragment format: {name} (expected a file name)")
    return parse_fragment_path(journal, name)
