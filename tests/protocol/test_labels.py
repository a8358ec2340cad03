"""Label sets and their algebra (cases ported from Gazette's label_extensions_test.go)."""

from __future__ import annotations

from pygazette.protocol.labels import (
    add_value,
    intersect_label_sets,
    journal_label_set_ext,
    label_set,
    label_value,
    label_values,
    remove_label,
    set_value,
    subtract_label_sets,
    union_label_sets,
    update_registers,
    with_meta_labels,
)
from pygazette.protocol.pb import protocol_pb2 as pb


def ls(*nv: str) -> pb.LabelSet:
    assert len(nv) % 2 == 0
    return label_set(list(zip(nv[::2], nv[1::2], strict=True)))


def pairs(s: pb.LabelSet) -> list[tuple[str, str]]:
    return [(x.name, x.value) for x in s.labels]


def test_label_set_sorts_and_dedupes() -> None:
    s = label_set([("bb", "3"), ("aa", "0"), ("bb", "1"), ("aa", "2"), ("bb", "3"), ("bb", "4")])
    assert pairs(s) == [("aa", "0"), ("aa", "2"), ("bb", "1"), ("bb", "3"), ("bb", "4")]
    assert pairs(label_set({"b": "1", "a": "2"})) == [("a", "2"), ("b", "1")]
    prefixed = label_set([("two:prefix", "pre/"), ("one", "1")])
    assert prefixed.labels[1] == pb.Label(name="two", value="pre/", prefix=True)


def test_values_of() -> None:
    s = pb.LabelSet(
        labels=[
            pb.Label(name="DDDD", value="111"),
            pb.Label(name="aaa", value="222"),
            pb.Label(name="aaa", value="333"),
            pb.Label(name="aaa", value="444"),
            pb.Label(name="ccc", value=""),
            pb.Label(name="ff", value="555"),
        ]
    )
    cases = [
        ("aa", [], ""),
        ("aaa", ["222", "333", "444"], "222"),
        ("bbb", [], ""),
        ("ccc", [""], ""),
        ("ddd", [], ""),
        ("DDDD", ["111"], "111"),
        ("eee", [], ""),
        ("ff", ["555"], "555"),
    ]
    for name, values, value in cases:
        assert label_values(s, name) == values
        assert label_value(s, name) == value
    assert label_value(s, "zzz", "dflt") == "dflt"


def test_add_set_remove() -> None:
    s = pb.LabelSet()
    for name, value in [
        ("bb", "3"),
        ("aa", "0"),
        ("bb", "1"),
        ("aa", "2"),
        ("bb", "3"),
        ("bb", "4"),
    ]:
        add_value(s, name, value)
    assert s == ls("aa", "0", "aa", "2", "bb", "1", "bb", "3", "bb", "4")

    set_value(s, "bb:prefix", "5")
    set_value(s, "cc", "6")
    set_value(s, "00", "6")
    assert s == ls("00", "6", "aa", "0", "aa", "2", "bb:prefix", "5", "cc", "6")
    set_value(s, "00", "7")
    set_value(s, "aa", "8")
    assert s == ls("00", "7", "aa", "8", "bb:prefix", "5", "cc", "6")

    add_value(s, "bb", "9")
    add_value(s, "00", "00")
    remove_label(s, "bb")
    remove_label(s, "bb")
    assert s == ls("00", "00", "00", "7", "aa", "8", "cc", "6")
    remove_label(s, "0")
    remove_label(s, "00")
    assert s == ls("aa", "8", "cc", "6")
    remove_label(s, "dd")
    remove_label(s, "cc")
    assert s == ls("aa", "8")
    remove_label(s, "aa")
    assert s == pb.LabelSet()


def test_union() -> None:
    out = union_label_sets(
        ls("bbb", "val-1", "bbb", "val-2", "ccc", "val-3"),
        ls("aaa", "val-4", "aaa", "val-5", "bbb", "val-6", "ddd", "val-7"),
    )
    assert out == ls(
        "aaa", "val-4", "aaa", "val-5",
        "bbb", "val-1", "bbb", "val-2",  # lhs's values of bbb replace rhs's.
        "ccc", "val-3", "ddd", "val-7",
    )  # fmt: skip


def test_intersection() -> None:
    lhs = ls(
        "aaa", "val", "bbb", "val-1", "ccc", "val-1", "ccc", "val-2",
        "ddd", "val-1", "ddd", "val-2", "eee", "val", "ggg", "val",
    )  # fmt: skip
    rhs = ls(
        "aaa", "val", "bbb", "val-2", "ccc", "val-1", "ddd", "val-1",
        "ddd", "val-2", "fff", "val", "ggg", "val",
    )  # fmt: skip
    assert intersect_label_sets(lhs, rhs) == ls(
        "aaa", "val", "ddd", "val-1", "ddd", "val-2", "ggg", "val"
    )
    assert subtract_label_sets(lhs, rhs) == ls(
        "bbb", "val-1", "ccc", "val-1", "ccc", "val-2", "eee", "val"
    )


def test_subtract_empty_value_is_not_a_wildcard() -> None:
    assert subtract_label_sets(ls("a", "x"), ls("a", "")) == ls("a", "x")
    assert subtract_label_sets(ls("a", ""), ls("a", "")) == ls()


def test_update_registers_like_gazette_append() -> None:
    registers = ls("author", "one", "cursor", "12", "keep", "me")
    out = update_registers(
        registers, union=ls("author", "two"), subtract=ls("cursor", "12", "gone", "x")
    )
    assert out == ls("author", "two", "keep", "me")
    assert update_registers(registers) == registers
    assert update_registers(registers) is not registers


def test_meta_labels() -> None:
    spec_labels = ls("hello", "world")
    assert journal_label_set_ext("path/to/my/journal", spec_labels) == ls(
        "name", "path/to/my/journal", "hello", "world"
    )
    assert with_meta_labels("path/to/my/journal", spec_labels) == ls(
        "hello", "world",
        "name", "path/to/my/journal",
        "prefix", "path/", "prefix", "path/to/", "prefix", "path/to/my/",
    )  # fmt: skip
    assert with_meta_labels("flat", ls()) == ls("name", "flat")
