"""`detect_content_type` against Go's own cases (net/http/sniff_test.go, Go 1.26)."""

from __future__ import annotations

import pytest

from pygazette.gateway.sniff import detect_content_type

HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
BINARY = "application/octet-stream"

GO_CASES = [
    (b"", TEXT),
    (b"\x01\x02\x03", BINARY),
    (b"<HtMl><bOdY>blah blah blah</body></html>", HTML),
    (b"<HTML></HTML>", HTML),
    (b"   <!DOCTYPE HTML>...", HTML),
    (b"\r\n<html>...", HTML),
    ("This is not HTML. It has ☃ though.".encode(), TEXT),
    (b"\n<?xml!", "text/xml; charset=utf-8"),
    (b"\x00\x00\x01\x00", "image/x-icon"),
    (b"\x00\x00\x02\x00", "image/x-icon"),
    (b"BM...", "image/bmp"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a...", "image/gif"),
    (b"RIFF\x00\x00\x00\x00WEBPVP", "image/webp"),
    (b"\x89PNG\x0d\x0a\x1a\x0a", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"MThd\x00\x00\x00\x06\x00\x01", "audio/midi"),
    (b"ID3\x03\x00\x00\x00\x00\x0f", "audio/mpeg"),
    (b"RIFFb\xb8\x00\x00WAVEfmt \x12\x00\x00\x00\x06", "audio/wave"),
    (b"RIFF,\x00\x00\x00WAVEfmt \x12\x00\x00\x00\x06", "audio/wave"),
    (
        b"FORM\x00\x00\x00\x00AIFFCOMM\x00\x00\x00\x12\x00\x01\x00\x00\x57\x55\x00\x10\x40\x0d"
        b"\xf3\x34",
        "audio/aiff",
    ),
    (
        b"OggS\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x7e\x46\x00\x00\x00\x00\x00\x00\x1f\xf6"
        b"\xb4\xfc\x01\x1e\x01\x76\x6f\x72",
        "application/ogg",
    ),
    (b"owow\x00", BINARY),
    (b"oooS\x00", BINARY),
    (b"oggS\x00", BINARY),
    (b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom<\x06t\xbfmdat", "video/mp4"),
    ("RIFF,O\n\x00AVI LISTÀ".encode(), "video/avi"),
    ("RIFF,\n\x00\x00AVI LISTÀ".encode(), "video/avi"),
    (b"\x00\x01\x00\x00\x00\x17\x01\x00\x00\x04\x01\x60\x4f", "font/ttf"),
    (b"\x00\x01\x00\x00\x00\x0e\x00\x80\x00\x03\x00\x60\x46", "font/ttf"),
    (b"\x4f\x54\x54\x4f\x00\x0e\x00\x80\x00\x03\x00\x60\x42\x41\x53\x45", "font/otf"),
    (b"\x77\x4f\x46\x46\x00\x01\x00\x00\x00\x00\x30\x54\x00\x0d\x00\x00", "font/woff"),
    (b"\x77\x4f\x46\x32\x00\x01\x00\x00\x00", "font/woff2"),
    (b"\x00\x61\x73\x6d\x01\x00", "application/wasm"),
    (b"Rar!\x1a\x07\x00", "application/x-rar-compressed"),
    (b"Rar!\x1a\x07\x01\x00", "application/x-rar-compressed"),
    (b"Rar \x1a\x07\x00", BINARY),
    (b"Rar \x1a\x07\x01\x00", BINARY),
    # And: only the first 512 bytes count; a tag needs its terminating byte.
    (b"a" * 512 + b"\x00", TEXT),
    (b"<HTML", TEXT),
    (b"<html\t", TEXT),
    (b'{"json": 1}\n', TEXT),
]


@pytest.mark.parametrize(("data", "expected"), GO_CASES)
def test_detect_content_type_as_go(data: bytes, expected: str) -> None:
    assert detect_content_type(data) == expected
