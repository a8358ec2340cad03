"""The gateway's GET/HEAD query, decoded as Gazette's gateway decodes it (gorilla/schema into
a ReadRequest: Go's strconv for the values)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from pygazette.gateway.journal_gateway import BadRequest, parse_read_request


def _read(query: str) -> tuple[int, bool]:
    req = parse_read_request(make_mocked_request("GET", f"/a/journal?{query}"))
    return req.offset, req.block


def test_offsets_and_blocks_as_go_parses_them() -> None:
    assert _read("offset=10&block=true") == (10, True)
    assert _read("Offset=%2B7&BLOCK=F") == (7, False)
    assert _read("offset=&block=") == (0, False)  # Empty: the zero value.


@pytest.mark.parametrize("value", ["1_0", " 5", "5 ", "\u0665", "0x10", "1.0", "abc", "--1"])
def test_an_offset_go_would_refuse_is_a_bad_request(value: str) -> None:
    with pytest.raises(BadRequest):
        _read(f"offset={value}")
