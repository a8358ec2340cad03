"""A journal name or shard ID as one local path component: short names read as themselves,
long ones fit a file system's 255-byte limit and stay apart."""

from __future__ import annotations

from urllib.parse import unquote

from hypothesis import given
from hypothesis import strategies as st

from pygazette.protocol.path_name import MAX_QUOTED, path_name
from pygazette.protocol.validation import validate_journal_name

# Journal names: letters (any script) and digits, "-_+/.=%" (validation.TOKEN_SYMBOLS and
# "=%" for journals), 4 to 512 bytes; "/" may not repeat, lead or trail.
_segment = st.text(alphabet=st.sampled_from("abcXYZ019-_+.=%éж"), min_size=1, max_size=40).filter(
    lambda s: s not in (".", "..")
)
names = (
    st.lists(_segment, min_size=1, max_size=40)
    .map("/".join)
    .filter(lambda n: 4 <= len(n.encode()) <= 512)
)


@given(names)
def test_a_name_fits_one_path_component(name: str) -> None:
    component = path_name(name)
    assert len(component.encode()) <= MAX_QUOTED <= 255 - len("-1700000000000000000")
    assert "/" not in component and component not in (".", "..")
    if "~" not in component:
        assert unquote(component) == name  # Reads as the name.


@given(names, names)
def test_names_stay_apart(a: str, b: str) -> None:
    assert (path_name(a) == path_name(b)) == (a == b)


def test_long_names_are_cut_and_told_apart() -> None:
    long = "long/" + "a/" * 150 + "b"
    validate_journal_name(long)
    assert path_name("a/journal") == "a%2Fjournal"
    assert "~" in path_name(long) and path_name(long) != path_name(long + "c")
