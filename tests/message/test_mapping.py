"""Mappings of messages to journals: Gazette's own choices for the same keys and listing
(vectors from its message package), and the properties that make them useful."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pygazette.message import (
    EmptyPartitions,
    MappingFunc,
    fnv1a32,
    modulo_mapping,
    random_mapping,
    rendezvous_mapping,
)
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb

VECTORS = Path(__file__).parent / "data" / "gazette_vectors.txt"
NAMES = ["a/part-000", "a/part-001", "a/part-002", "a/part-003", "a/part-004", "b/other"]


def listing(names: list[str], content_type: str = "application/x-ndjson") -> pb.ListResponse:
    resp = pb.ListResponse()
    for name in names:
        resp.journals.add(
            spec=pb.JournalSpec(name=name, labels=label_set({"content-type": content_type}))
        )
    return resp


def identity(msg: object) -> bytes:
    assert isinstance(msg, bytes)
    return msg


def test_fnv1a32_known_values() -> None:
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32(b"foobar") == 0xBF9CF968
    assert fnv1a32("foobar") == fnv1a32(b"foobar")
    assert fnv1a32(b"x" * 100) == fnv1a32("x" * 100)  # Long keys skip the cache.


def test_modulo_and_rendezvous_choose_as_gazette_does() -> None:
    parts = listing(NAMES)
    modulo = modulo_mapping(identity, parts)
    rendezvous = rendezvous_mapping(identity, parts)
    rows = [
        line.split(" ")[1:]
        for line in VECTORS.read_text().splitlines()
        if line.startswith("mapping ")
    ]
    assert len(rows) == 7
    for key_hex, go_modulo, go_rendezvous in rows:
        key = bytes.fromhex(key_hex)
        assert modulo(key) == (go_modulo, "application/x-ndjson")
        assert rendezvous(key) == (go_rendezvous, "application/x-ndjson")


def test_mappings_follow_a_changing_listing_and_refuse_an_empty_one() -> None:
    current = [listing(NAMES[:2])]
    rendezvous = rendezvous_mapping(identity, lambda: current[0])
    modulo = modulo_mapping(lambda m: str(m), lambda: current[0])
    rnd = random_mapping(lambda: current[0], random.Random(1))
    assert {rnd(b"")[0] for _ in range(50)} == set(NAMES[:2])
    assert rendezvous(b"k")[0] in NAMES[:2] and modulo(b"k")[0] in NAMES[:2]
    current[0] = listing(NAMES, "text/csv")
    assert {rnd(b"")[0] for _ in range(200)} == set(NAMES)
    assert rnd(b"")[1] == "text/csv"
    current[0] = listing([])
    for mapping in (rendezvous, modulo, rnd):
        with pytest.raises(EmptyPartitions):
            mapping(b"k")


@given(st.lists(st.binary(max_size=12), min_size=50, max_size=200, unique=True), st.integers(2, 12))
def test_rendezvous_moves_only_keys_of_a_removed_journal(keys: list[bytes], n: int) -> None:
    names = [f"topic/part-{i:03d}" for i in range(n)]
    before = rendezvous_mapping(identity, listing(names))
    gone = names[n // 2]
    after = rendezvous_mapping(identity, listing([x for x in names if x != gone]))
    for key in keys:
        was, now = before(key)[0], after(key)[0]
        if was != gone:
            assert now == was  # Keys of the remaining journals stay put.


@given(st.lists(st.binary(max_size=12), max_size=100), st.integers(1, 12))
def test_modulo_and_rendezvous_are_stable(keys: list[bytes], n: int) -> None:
    names = [f"topic/part-{i:03d}" for i in range(n)]
    for make in (modulo_mapping, rendezvous_mapping):
        m1, m2 = make(identity, listing(names)), make(identity, listing(names))
        assert [m1(k) for k in keys] == [m2(k) for k in keys]
        assert all(m1(k)[0] in names for k in keys)


@pytest.mark.parametrize("make", [modulo_mapping, rendezvous_mapping])
def test_a_mapping_used_by_threads_never_mixes_two_listings(
    make: Callable[..., MappingFunc], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishers are thread-safe, and so their mappings must be: a thread mapping a message
    while another takes in a new listing gets the journal and content type of one listing.
    The listing's names, content types and hashes were replaced one after the other in
    place: a message was mapped to a journal of the new listing with a content type of the
    old one (written in the wrong framing), or raised IndexError when the listing shrank."""
    from pygazette.message import mapping as mapping_module

    old, new = listing(["a/1"]), listing(["b/1"], "text/csv")
    current = [old]
    a_paused, b_done = threading.Event(), threading.Event()
    original = mapping_module.label_value

    def label_value(labels: pb.LabelSet, name: str) -> str:
        if threading.current_thread() is thread_a:  # A takes in the new listing: pause it.
            a_paused.set()
            b_done.wait(5)
        return original(labels, name)

    def key(msg: object) -> bytes:
        if msg == b"b":  # B holds the old listing: a new one comes, and A takes it in.
            current[0] = new
            thread_a.start()
            a_paused.wait(5)
        return b"k"

    monkeypatch.setattr(mapping_module, "label_value", label_value)
    mapping = make(key, lambda: current[0])
    thread_a = threading.Thread(target=mapping, args=(b"a",))
    try:
        got = mapping(b"b")
    finally:
        b_done.set()
        thread_a.join(5)
    assert got in (("a/1", "application/x-ndjson"), ("b/1", "text/csv"))
