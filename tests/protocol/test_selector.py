"""Selector grammar, canonical form and matching (cases from Gazette's label_extensions_test.go)."""

from __future__ import annotations

import pytest

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.labels import journal_label_set_ext, label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import (
    format_selector,
    journal_matcher,
    journal_selected,
    parse_selector,
    rewrite_prefix_meta_label,
    selector_matches,
)


def ls(*nv: str) -> pb.LabelSet:
    return label_set(list(zip(nv[::2], nv[1::2], strict=True)))


def sel(include: pb.LabelSet | None = None, exclude: pb.LabelSet | None = None) -> pb.LabelSelector:
    return pb.LabelSelector(include=include or pb.LabelSet(), exclude=exclude or pb.LabelSet())


PARSE_CASES = [
    ("foo = bar", sel(ls("foo", "bar"))),
    ("foo:prefix =bar", sel(ls("foo:prefix", "bar"))),
    ("foo != bar", sel(exclude=ls("foo", "bar"))),
    ("foo ", sel(ls("foo", ""))),
    (" !foo", sel(exclude=ls("foo", ""))),
    (" foo in (bing, baz,bar)", sel(ls("foo", "bar", "foo", "baz", "foo", "bing"))),
    (" foo not in ( pear, apple )", sel(exclude=ls("foo", "apple", "foo", "pear"))),
    (
        "foo==bar, baz !=bing ,apple:prefix in (fruit, banana)",
        sel(
            ls("apple:prefix", "banana", "apple:prefix", "fruit", "foo", "bar"),
            ls("baz", "bing"),
        ),
    ),
    (
        "!foo,baz,bing:prefix not in (thing-one, thing-2),!bar,",
        sel(
            ls("baz", ""),
            ls("bar", "", "bing:prefix", "thing-2", "bing:prefix", "thing-one", "foo", ""),
        ),
    ),
    (
        "foo = ba=ar, baz=bi=ngo,exc!=who=ops",
        sel(ls("foo", "ba=ar", "baz", "bi=ngo"), ls("exc", "who=ops")),
    ),
    (
        "foo in (bi=ng,ba=ar), exc notin (who=ops,oth=er)",
        sel(ls("foo", "bi=ng", "foo", "ba=ar"), ls("exc", "who=ops", "exc", "oth=er")),
    ),
    ("", sel()),
    ("foo=", sel(ls("foo", ""))),
    ("foo=a", sel(ls("foo", "a"))),
    ("ab:prefix", sel(ls("ab:prefix", ""))),
    ("é-ø=ü%20/x", sel(ls("é-ø", "ü%20/x"))),
]


@pytest.mark.parametrize(("text", "expect"), PARSE_CASES)
def test_parse_and_round_trip(text: str, expect: pb.LabelSelector) -> None:
    parsed = parse_selector(text)
    assert parsed == expect
    assert parse_selector(format_selector(parsed)) == parsed


def test_canonical_form() -> None:
    assert format_selector(parse_selector(" foo in (bing, baz,bar)")) == "foo in (bar,baz,bing)"
    assert (
        format_selector(parse_selector("!foo,baz,bing:prefix not in (thing-one, thing-2),!bar,"))
        == "baz,!bar,bing:prefix notin (thing-2,thing-one),!foo"
    )
    assert (
        format_selector(parse_selector("foo==bar, baz !=bing ,apple:prefix in (fruit, banana)"))
        == "apple:prefix in (banana,fruit),foo=bar,baz!=bing"
    )
    # Prefix and exact values of one name are written separately; "name:prefix"
    # sorts after "name-x" (':' > '-').
    mixed = sel(ls("aa", "x", "aa:prefix", "m/", "aa:prefix", "z/", "aa-b", "1"))
    assert format_selector(mixed) == "aa=x,aa-b=1,aa:prefix in (m/,z/)"
    assert parse_selector(format_selector(mixed)) == mixed
    assert format_selector(sel()) == ""
    assert format_selector(sel(exclude=ls("x", "yy"))) == "x!=yy"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "apple,banana err in (bar)",
            'could not match "banana err in (bar)" to a label selector expression',
        ),
        (
            "apple,banana in (bar,err baz)",
            'parsing "banana in (bar,err baz)": could not match "err baz" '
            "to a label selector set expression",
        ),
        ("ban=ana in (bar)", 'could not match "ban=ana in (bar)" to a label selector expression'),
        (
            "foo, foo in (bar)",
            "Include: Label has empty & non-empty values (index 1; label foo value bar)",
        ),
        (
            "foo:prefix=bar,foo=bar",
            "Include: Labels not in unique, sorted order (index 1; label foo value bar <= bar)",
        ),
        ("a=b", 'could not match "a=b" to a label selector expression'),  # names need 2 runes
        ("foo\n", 'could not match "foo\\n" to a label selector expression'),
        ("foo  = bar", 'could not match "foo  = bar" to a label selector expression'),
        ("x" * 65, "Include.Labels[0].Name: invalid length (65; expected 2 <= length <= 64)"),
    ],
)
def test_parse_errors(text: str, message: str) -> None:
    # Note that exact duplicates ("foo=bar,foo=bar") are merged, as in Gazette.
    with pytest.raises(ValidationError) as info:
        parse_selector(text)
    assert str(info.value) == message


def test_matching() -> None:
    selector = sel(
        ls("inc-1:prefix", "a-val/", "inc-2", "", "inc-3", "val-1", "inc-3", "val-2"),
        ls("exc-1", "", "exc-2", "val-3", "exc-2", "val-4"),
    )
    cases = [
        (ls(), False),
        (ls("foo", "bar", "inc-1", "a-val/a/1", "inc-2", "any", "inc-3", "val-1"), True),
        (ls("foo", "bar", "inc-1", "a-val/b/2", "inc-2", "foo", "inc-3", "val-1"), True),
        (ls("foo", "bar", "inc-1", "a-val/c/3", "inc-2", "any", "inc-3", "val-2"), True),
        (ls("foo", "bar", "inc-1", "bad-val/4", "inc-2", "any", "inc-3", "val-1"), False),
        (ls("foo", "bar", "inc-1", "a-val/5", "inc-3", "val-1"), False),
        (ls("foo", "bar", "inc-1", "a-val/6", "inc-2", "any", "inc-3", "val-other"), False),
        (
            ls(
                "exc-1", "any", "foo", "bar", "inc-1", "a-val/a/7", "inc-2", "any", "inc-3", "val-1"
            ),
            False,
        ),
        (
            ls(
                "exc-2", "val-4", "foo", "bar", "inc-1", "a-val/8", "inc-2", "any", "inc-3", "val-1"
            ),
            False,
        ),
        (
            ls(
                "exc-2",
                "val-ok",
                "foo",
                "bar",
                "inc-1",
                "a-val/9/9",
                "inc-2",
                "any",
                "inc-3",
                "val-1",
            ),
            True,
        ),
    ]
    for labels, expect in cases:
        assert selector_matches(selector, labels) is expect, labels

    exclude_only = sel(exclude=selector.exclude)
    assert selector_matches(exclude_only, ls())
    assert selector_matches(exclude_only, ls("foo", "bar"))
    assert selector_matches(exclude_only, ls("exc-2", "val-ok", "foo", "bar"))
    assert not selector_matches(exclude_only, ls("exc-2", "val-3", "foo", "bar"))
    assert not selector_matches(exclude_only, ls("exc-1", "any", "foo", "bar"))
    # The empty selector selects everything.
    assert selector_matches(sel(), ls("a-b", "c"))


def test_prefix_matching_examples() -> None:
    selector = parse_selector("foo:prefix in (one/two/, three/)")
    assert selector_matches(selector, ls("foo", "one/two/three"))
    assert selector_matches(selector, ls("foo", "three/four/five"))
    assert not selector_matches(selector, ls("foo", "one/one/"))
    assert not selector_matches(selector, ls("foo", "four/five/six"))
    # Exact values are not prefixes.
    assert not selector_matches(parse_selector("foo=one/"), ls("foo", "one/two"))
    # A prefix matches any of several values of the label.
    assert selector_matches(parse_selector("foo:prefix=b/"), ls("foo", "a/x", "foo", "b/y"))
    assert not selector_matches(parse_selector("foo:prefix!=b/"), ls("foo", "a/x", "foo", "b/y"))


def spec(name: str, *labels: str) -> pb.JournalSpec:
    return pb.JournalSpec(name=name, labels=ls(*labels))


def test_journal_selected_meta_labels() -> None:
    j = spec("examples/a-name/part-000", "topic", "events")
    assert journal_selected(parse_selector("name=examples/a-name/part-000"), j)
    assert not journal_selected(parse_selector("name=examples/a-name"), j)
    assert journal_selected(parse_selector("prefix=examples/"), j)
    assert journal_selected(parse_selector("prefix=examples/a-name/"), j)
    assert not journal_selected(parse_selector("prefix=other/"), j)
    assert journal_selected(parse_selector("prefix in (other/, examples/)"), j)
    assert not journal_selected(parse_selector("prefix!=examples/"), j)
    assert journal_selected(parse_selector("prefix!=other/, topic=events"), j)
    assert journal_selected(parse_selector("name:prefix=examples/a-"), j)
    assert not journal_selected(parse_selector("topic=events, !topic"), j)
    assert journal_selected(sel(), j)


def test_rewrite_prefix_meta_label() -> None:
    out = rewrite_prefix_meta_label(parse_selector("prefix in (a/, b/), xx=yy, prefix!=c/"))
    assert out == sel(
        ls("name:prefix", "a/", "name:prefix", "b/", "xx", "yy"), ls("name:prefix", "c/")
    )


def test_a_value_starting_with_equals_round_trips() -> None:
    sel = parse_selector("aa===")
    assert [(x.name, x.value) for x in sel.include.labels] == [("aa", "=")]
    assert parse_selector(format_selector(sel)) == sel


def test_journal_matcher_agrees_with_matching_the_label_set() -> None:
    specs = [
        spec("examples/a-name/part-000", "topic", "events"),
        spec("examples/b/part-001", "topic", "clicks"),
        spec("other/c", "region", "eu"),
        spec("other/d"),
    ]
    many = ", ".join(f"a/{i:03d}" for i in range(200))
    selectors = [
        "",
        "name=examples/b/part-001",
        f"name in ({many}, other/c)",  # Hundreds of names: a set look-up.
        f"name notin ({many}, other/c)",
        "prefix in (other/, examples/a-)",
        "name:prefix in (examples/b/, zzz), topic",
        "topic in (events, clicks), prefix!=examples/b/",
        "topic=",
        "!region",
        "region in (us, eu), name:prefix=other/",
    ]
    for text in selectors:
        selector = parse_selector(text)
        matches = journal_matcher(selector)
        for j in specs:
            want = selector_matches(
                rewrite_prefix_meta_label(selector), journal_label_set_ext(j.name, j.labels)
            )
            assert matches(j) == want == journal_selected(selector, j), (text, j.name)
    assert [j.name for j in specs if journal_matcher(parse_selector(selectors[2]))(j)] == [
        "other/c"
    ]
