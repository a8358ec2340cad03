"""Property tests: selector and fragment-name round trips, and robustness on garbage."""

from __future__ import annotations

import unicodedata

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import (
    CODEC_EXTENSIONS,
    fragment_content_path,
    fragment_file_name,
    parse_fragment_path,
)
from pygazette.protocol.labels import add_value, label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import format_selector, parse_selector, selector_matches
from pygazette.protocol.validation import (
    PATH_SYMBOLS,
    TOKEN_SYMBOLS,
    validate_fragment,
    validate_label_selector,
    validate_token,
)

MAX_INT64 = (1 << 63) - 1

letters_digits = st.characters(categories=("L", "N"))
token_char = st.one_of(letters_digits, st.sampled_from(TOKEN_SYMBOLS))
path_char = st.one_of(letters_digits, st.sampled_from(PATH_SYMBOLS))

# Names of at least two characters (the grammar counts runes; see selector.py).
names = st.text(token_char, min_size=2, max_size=12).filter(lambda s: len(s.encode()) <= 64)
# Values may be empty. A value starting with '=' does not survive "name==value"
# (Gazette's grammar reads "==" as the operator), so those are left out.
values = st.text(path_char, max_size=12).filter(lambda s: not s.startswith("="))


@st.composite
def selectors(draw: st.DrawFn) -> pb.LabelSelector:
    sel = pb.LabelSelector()
    sel.include.SetInParent()
    sel.exclude.SetInParent()
    for part in (sel.include, sel.exclude):
        for _ in range(draw(st.integers(0, 4))):
            name = draw(names)
            prefix = draw(st.booleans())
            for value in draw(st.lists(values, min_size=1, max_size=3)):
                add_value(part, name + (":prefix" if prefix else ""), value)
    try:
        validate_label_selector(sel)
    except ValidationError:
        assume(False)
    return sel


@settings(max_examples=300)
@given(selectors())
def test_selector_round_trip(sel: pb.LabelSelector) -> None:
    text = format_selector(sel)
    assert parse_selector(text) == sel
    assert format_selector(parse_selector(text)) == text


@settings(max_examples=500)
@given(st.text())
def test_parse_selector_only_raises_validation_errors(text: str) -> None:
    try:
        sel = parse_selector(text)
    except ValidationError:
        return
    validate_label_selector(sel)


@settings(max_examples=300)
@given(st.text(st.sampled_from(list("ab =!,()in:prefixot/-"))))
def test_parse_selector_grammar_soup(text: str) -> None:
    try:
        sel = parse_selector(text)
    except ValidationError:
        return
    assert parse_selector(format_selector(sel)) == sel


def reference_matches(sel: pb.LabelSelector, labels: pb.LabelSet) -> bool:
    def name_matches(want: list[pb.Label], have: list[str]) -> bool:
        return any(
            w.value == "" or (h.startswith(w.value) if w.prefix else h == w.value)
            for w in want
            for h in have
        )

    def by_name(ls: pb.LabelSet) -> dict[str, list[pb.Label]]:
        out: dict[str, list[pb.Label]] = {}
        for label in ls.labels:
            out.setdefault(label.name, []).append(label)
        return out

    have = {n: [x.value for x in ls] for n, ls in by_name(labels).items()}
    if any(name_matches(w, have.get(n, [])) for n, w in by_name(sel.exclude).items()):
        return False
    return all(name_matches(w, have.get(n, [])) for n, w in by_name(sel.include).items())


small_names = st.sampled_from(["aa", "bb", "cc"])
small_values = st.sampled_from(["", "x", "x/", "x/y", "y", "yz"])


@st.composite
def small_selectors(draw: st.DrawFn) -> pb.LabelSelector:
    sel = pb.LabelSelector()
    for part in (sel.include, sel.exclude):
        for _ in range(draw(st.integers(0, 3))):
            name = draw(small_names) + (":prefix" if draw(st.booleans()) else "")
            add_value(part, name, draw(small_values))
    try:
        validate_label_selector(sel)
    except ValidationError:
        assume(False)
    return sel


@settings(max_examples=500)
@given(
    small_selectors(),
    st.lists(st.tuples(small_names, small_values.filter(bool)), max_size=5),
)
def test_matches_agrees_with_reference(sel: pb.LabelSelector, pairs: list[tuple[str, str]]) -> None:
    labels = label_set(pairs)
    assert selector_matches(sel, labels) == reference_matches(sel, labels)


segment = st.text(path_char.filter(lambda c: c != "/"), min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..")
)
journals = (
    st.lists(segment, min_size=1, max_size=4)
    .map("/".join)
    .filter(lambda s: 4 <= len(s.encode()) <= 512)
)
postfixes = st.lists(segment, max_size=3).map("/".join)


@st.composite
def fragments(draw: st.DrawFn) -> pb.Fragment:
    begin = draw(st.integers(0, MAX_INT64))
    end = draw(st.integers(begin, MAX_INT64))
    return pb.Fragment(
        journal=draw(journals),
        begin=begin,
        end=end,
        sum=pb.SHA1Sum(
            part1=draw(st.integers(0, 2**64 - 1)),
            part2=draw(st.integers(0, 2**64 - 1)),
            part3=draw(st.integers(0, 2**32 - 1)),
        ),
        compression_codec=draw(st.sampled_from(sorted(CODEC_EXTENSIONS))),  # type: ignore[arg-type]
        path_postfix=draw(postfixes),
    )


@settings(max_examples=300)
@given(fragments())
def test_fragment_path_round_trip(frag: pb.Fragment) -> None:
    validate_fragment(frag)
    path = fragment_content_path(frag)
    assert path.startswith(frag.journal + "/")
    relative = path[len(frag.journal) + 1 :]
    assert relative.endswith(fragment_file_name(frag))
    assert parse_fragment_path(frag.journal, relative) == frag


@settings(max_examples=500)
@given(st.text(), st.text(st.sampled_from(list("0123456789abcdefABCDEF-./=+xz."))))
def test_parse_fragment_path_only_raises_validation_errors(junk: str, hexish: str) -> None:
    for text in (junk, hexish):
        try:
            frag = parse_fragment_path("a/journal", text)
        except ValidationError:
            continue
        validate_fragment(frag)


def _token_by_character(value: str, symbols: str) -> bool:
    """Gazette's rule, one character at a time: Unicode letters and numbers, and `symbols`."""
    return all(unicodedata.category(c)[0] in "LN" or c in symbols for c in value)


@given(
    st.one_of(
        st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=40),
        st.text(max_size=40),
    ),
    st.sampled_from([TOKEN_SYMBOLS, PATH_SYMBOLS, "-_.", ""]),
)
def test_token_fast_path_agrees_with_the_per_character_rule(value: str, symbols: str) -> None:
    try:
        validate_token(value, "Field", symbols, 0, 1000)
        valid = True
    except ValidationError:
        valid = False
    assert valid == _token_by_character(value, symbols), (value, symbols)
