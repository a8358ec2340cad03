"""Go's `net/http.DetectContentType`: the Content-Type Go's HTTP server gives a response whose
handler set none, from its first bytes (https://mimesniff.spec.whatwg.org/, as Go 1.26
implements it). Gazette's journal gateway answers reads with it."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["SNIFF_LEN", "detect_content_type"]

# The most bytes the algorithm looks at.
SNIFF_LEN = 512

_WS = b"\t\n\x0c\r "
_HTML = "text/html; charset=utf-8"
_TEXT = "text/plain; charset=utf-8"
_FALLBACK = "application/octet-stream"

_HTML_TAGS = [
    b"<!DOCTYPE HTML",
    b"<HTML",
    b"<HEAD",
    b"<SCRIPT",
    b"<IFRAME",
    b"<H1",
    b"<DIV",
    b"<FONT",
    b"<TABLE",
    b"<A",
    b"<STYLE",
    b"<TITLE",
    b"<B",
    b"<BODY",
    b"<BR",
    b"<P",
    b"<!--",
]


class _Sig(NamedTuple):
    """A signature: `pattern` at the start of the data under `mask` (None: an exact prefix),
    after leading whitespace with `skip_ws`; `mp4`: Go's mp4Sig instead."""

    mask: bytes | None
    pattern: bytes
    skip_ws: bool
    ctype: str
    mp4: bool = False


def _exact(prefix: bytes, ctype: str) -> _Sig:
    return _Sig(None, prefix, False, ctype)


def _m(mask: bytes, pattern: bytes, ctype: str, skip_ws: bool = False) -> _Sig:
    return _Sig(mask, pattern, skip_ws, ctype)


# The signatures after the HTML ones, in Go's order.
_SIGNATURES: list[_Sig] = [
    _m(b"\xff\xff\xff\xff\xff", b"<?xml", "text/xml; charset=utf-8", skip_ws=True),
    _exact(b"%PDF-", "application/pdf"),
    _exact(b"%!PS-Adobe-", "application/postscript"),
    # UTF BOMs.
    _m(b"\xff\xff\x00\x00", b"\xfe\xff\x00\x00", "text/plain; charset=utf-16be"),
    _m(b"\xff\xff\x00\x00", b"\xff\xfe\x00\x00", "text/plain; charset=utf-16le"),
    _m(b"\xff\xff\xff\x00", b"\xef\xbb\xbf\x00", _TEXT),
    # Images.
    _exact(b"\x00\x00\x01\x00", "image/x-icon"),
    _exact(b"\x00\x00\x02\x00", "image/x-icon"),
    _exact(b"BM", "image/bmp"),
    _exact(b"GIF87a", "image/gif"),
    _exact(b"GIF89a", "image/gif"),
    _m(
        b"\xff\xff\xff\xff\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff",
        b"RIFF\x00\x00\x00\x00WEBPVP",
        "image/webp",
    ),
    _exact(b"\x89PNG\x0d\x0a\x1a\x0a", "image/png"),
    _exact(b"\xff\xd8\xff", "image/jpeg"),
    # Audio and video.
    _m(
        b"\xff\xff\xff\xff\x00\x00\x00\x00\xff\xff\xff\xff",
        b"FORM\x00\x00\x00\x00AIFF",
        "audio/aiff",
    ),
    _m(b"\xff\xff\xff", b"ID3", "audio/mpeg"),
    _m(b"\xff\xff\xff\xff\xff", b"OggS\x00", "application/ogg"),
    _m(b"\xff" * 8, b"MThd\x00\x00\x00\x06", "audio/midi"),
    _m(
        b"\xff\xff\xff\xff\x00\x00\x00\x00\xff\xff\xff\xff",
        b"RIFF\x00\x00\x00\x00AVI ",
        "video/avi",
    ),
    _m(
        b"\xff\xff\xff\xff\x00\x00\x00\x00\xff\xff\xff\xff",
        b"RIFF\x00\x00\x00\x00WAVE",
        "audio/wave",
    ),
    _Sig(None, b"", False, "video/mp4", mp4=True),
    _exact(b"\x1a\x45\xdf\xa3", "video/webm"),
    # Fonts.
    _m(b"\x00" * 34 + b"\xff\xff", b"\x00" * 34 + b"LP", "application/vnd.ms-fontobject"),
    _exact(b"\x00\x01\x00\x00", "font/ttf"),
    _exact(b"OTTO", "font/otf"),
    _exact(b"ttcf", "font/collection"),
    _exact(b"wOFF", "font/woff"),
    _exact(b"wOF2", "font/woff2"),
    # Archives.
    _exact(b"\x1f\x8b\x08", "application/x-gzip"),
    _exact(b"PK\x03\x04", "application/zip"),
    _exact(b"Rar!\x1a\x07\x00", "application/x-rar-compressed"),
    _exact(b"Rar!\x1a\x07\x01\x00", "application/x-rar-compressed"),
    _exact(b"\x00\x61\x73\x6d", "application/wasm"),
]

# Bytes that make data binary (mimesniff's "binary data bytes").
_BINARY = frozenset([*range(0x00, 0x09), 0x0B, *range(0x0E, 0x1B), *range(0x1C, 0x20)])


def _html(data: bytes, tag: bytes) -> bool:
    if len(data) < len(tag) + 1:
        return False
    for i, b in enumerate(tag):
        db = data[i]
        if 0x41 <= b <= 0x5A:  # 'A'..'Z': compared case-insensitively.
            db &= 0xDF
        if b != db:
            return False
    return data[len(tag)] in b" >"  # A tag-terminating byte.


def _masked(data: bytes, mask: bytes, pattern: bytes) -> bool:
    if len(data) < len(pattern):
        return False
    return all(data[i] & mask[i] == p for i, p in enumerate(pattern))


def _mp4(data: bytes) -> bool:
    if len(data) < 12:
        return False
    box = int.from_bytes(data[:4], "big")
    if len(data) < box or box % 4 != 0 or data[4:8] != b"ftyp":
        return False
    # (Bytes 12-15 are the major brand's version.)
    return any(data[st : st + 3] == b"mp4" for st in range(8, box, 4) if st != 12)


def detect_content_type(data: bytes) -> str:
    """The MIME type Go's `http.DetectContentType` gives `data` (its first 512 bytes)."""
    data = bytes(data[:SNIFF_LEN])
    first = 0
    while first < len(data) and data[first] in _WS:
        first += 1
    trimmed = data[first:]
    for tag in _HTML_TAGS:
        if _html(trimmed, tag):
            return _HTML
    for sig in _SIGNATURES:
        if sig.mp4:
            if _mp4(data):
                return sig.ctype
        elif sig.mask is None:
            if data.startswith(sig.pattern):
                return sig.ctype
        elif _masked(trimmed if sig.skip_ws else data, sig.mask, sig.pattern):
            return sig.ctype
    if any(b in _BINARY for b in trimmed):
        return _FALLBACK
    return _TEXT
