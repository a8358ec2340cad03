"""bench/unpack.py: a message the unpacker could not decode fails the run, wherever it is
(only the first was checked, so an error later in the content counted as a message), and
the floor decodes every line in place."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from unpack import _content, _floor, _unpack


def test_a_message_that_does_not_decode_fails_the_run() -> None:
    good = _content(100, 3)
    content = good + b'{"uuid": broken\n' + good
    chunks = [content[i : i + 64] for i in range(0, len(content), 64)]
    with pytest.raises(RuntimeError, match="unpacked 7 of 7"):
        _unpack(chunks, 7)


def test_well_formed_content_unpacks() -> None:
    content = _content(1000, 20)
    chunks = [content[i : i + 700] for i in range(0, len(content), 700)]
    assert _unpack(chunks, 20) > 0


def test_the_floor_decodes_every_line() -> None:
    content = _content(300, 50)
    assert _floor(content, 50) > 0
    with pytest.raises(RuntimeError, match="decoded 50 of 51"):
        _floor(content, 51)
