"""Splitting input into whole-line appends (`journals append --framing lines`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pygazette.cli.journals_cmd import split_at_lines


def test_cuts_at_the_last_newline_within_the_target() -> None:
    buf = bytearray(b"aaa\nbbb\nccc\ndd")
    assert split_at_lines(buf, 10, final=False) == [b"aaa\nbbb\n"]
    assert buf == bytearray(b"ccc\ndd")
    assert split_at_lines(buf, 10, final=True) == [b"ccc\ndd"]
    assert buf == bytearray()


def test_a_line_longer_than_the_target_is_one_block() -> None:
    buf = bytearray(b"x" * 25 + b"\nyy\n")
    assert split_at_lines(buf, 10, final=False) == [b"x" * 25 + b"\n"]
    assert buf == bytearray(b"yy\n")


def test_an_incomplete_long_line_waits_for_more_input() -> None:
    buf = bytearray(b"x" * 25)
    assert split_at_lines(buf, 10, final=False) == []
    assert len(buf) == 25


@given(
    lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"") + b"\n")),
    tail=st.binary(max_size=5).map(lambda b: b.replace(b"\n", b"")),
    target=st.integers(min_value=1, max_value=64),
)
def test_blocks_are_whole_lines_and_preserve_input(
    lines: list[bytes], tail: bytes, target: int
) -> None:
    data = b"".join(lines) + tail
    buf = bytearray(data)
    blocks = split_at_lines(buf, target, final=False)
    assert all(b.endswith(b"\n") for b in blocks)
    assert all(len(b) <= target or b.count(b"\n") == 1 for b in blocks)
    blocks += split_at_lines(buf, target, final=True)
    assert b"".join(blocks) == data
    assert all(blocks)
