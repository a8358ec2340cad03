"""The fragment index: cover sets, local spools first, and Gazette's offset-jump rule."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.broker.fragment.fragment_index import OFFSET_JUMP_AGE_SECONDS, FragmentIndex
from pygazette.broker.fragment.spool import Spool
from pygazette.protocol.pb import protocol_pb2 as pb


def _frag(begin: int, end: int, mod_time: int = 1) -> pb.Fragment:
    return pb.Fragment(
        journal="a/j",
        begin=begin,
        end=end,
        backing_store="file:///",
        mod_time=mod_time,
        compression_codec=pb.NONE,
    )


def test_cover_set_drops_covered_fragments() -> None:
    idx = FragmentIndex("a/j")
    assert idx.add_persisted(_frag(0, 100))
    assert idx.add_persisted(_frag(100, 200))
    assert not idx.add_persisted(_frag(10, 90))  # Covered: dropped.
    assert idx.add_persisted(_frag(50, 250))  # Overlaps; covers [100, 200).
    assert [(f.begin, f.end) for f in idx.persisted()] == [(0, 100), (50, 250)]
    assert idx.end_offset == 250
    frag, spool, offset = idx.query(120)
    assert frag is not None and (frag.begin, frag.end) == (50, 250) and spool is None
    assert offset == 120
    # The longest fragment covering an offset wins.
    frag, _, _ = idx.query(60)
    assert frag is not None and frag.end == 250


def test_local_spool_is_preferred(tmp_path: Path) -> None:
    idx = FragmentIndex("a/j")
    idx.add_persisted(_frag(0, 10))
    spool = Spool.create(tmp_path, "a/j", 0, pb.NONE, pb.LabelSet(), sync=False)
    pending = spool.start_append()
    pending.write(b"0123456789abc")
    spool.commit(pending, None)
    idx.add_local(spool)
    frag, got, offset = idx.query(5)
    assert got is spool and frag is not None and frag.end == 13 and offset == 5
    assert idx.end_offset == 13
    frag, got, _ = idx.query(13)
    assert frag is None and got is None


def test_summary_is_gazettes(tmp_path: Path) -> None:
    """Lowest and greatest offsets with content, and the newest fragment's mod time: 0 while
    a local spool reaches furthest (content not persisted yet)."""
    idx = FragmentIndex("a/j")
    assert idx.summary() == (0, 0, 0)
    idx.add_persisted(_frag(10, 20, mod_time=7))
    assert idx.summary() == (10, 20, 7)
    spool = Spool.create(tmp_path, "a/j", 20, pb.NONE, pb.LabelSet(), sync=False)
    idx.add_local(spool)
    assert idx.summary() == (10, 20, 7)  # An empty spool holds nothing.
    pending = spool.start_append()
    pending.write(b"abc")
    spool.commit(pending, None)
    assert idx.summary() == (10, 23, 0)


def test_offset_jump_only_over_old_gaps() -> None:
    now = int(time.time())
    idx = FragmentIndex("a/j")
    idx.add_persisted(_frag(0, 50, mod_time=now))
    idx.add_persisted(_frag(100, 200, mod_time=now))
    # A young fragment past a gap may be a sibling still being persisted: don't skip to it.
    assert idx.query(60) == (None, None, 60)
    old = FragmentIndex("a/j")
    old.add_persisted(_frag(0, 50, mod_time=now))
    old.add_persisted(_frag(100, 200, mod_time=now - OFFSET_JUMP_AGE_SECONDS - 10))
    frag, spool, offset = old.query(60)
    assert frag is not None and offset == 100 and spool is None
    # Nothing beyond the end.
    assert old.query(200) == (None, None, 200)


def test_offset_before_every_fragment_jumps_to_the_first() -> None:
    # Gazette's other rule: a read from before the journal's first fragment (e.g. offsets
    # removed by retention) moves to it, however young it is -- if it is persisted.
    now = int(time.time())
    idx = FragmentIndex("a/j")
    idx.add_persisted(_frag(100, 200, mod_time=now))
    frag, spool, offset = idx.query(0)
    assert frag is not None and (frag.begin, offset, spool) == (100, 100, None)
    unpersisted = FragmentIndex("a/j")
    unpersisted.add_persisted(_frag(100, 200, mod_time=0))
    assert unpersisted.query(0) == (None, None, 0)


def test_begin_mod_time_skips_older_fragments() -> None:
    idx = FragmentIndex("a/j")
    idx.add_persisted(_frag(0, 100, mod_time=1000))
    idx.add_persisted(_frag(100, 200, mod_time=2000))
    frag, _, offset = idx.query(10, begin_mod_time=1500)
    assert frag is not None and (frag.begin, offset) == (100, 100)
    assert idx.query(10, begin_mod_time=2500) == (None, None, 200)


def test_refresh_keeps_fragments_persisted_since_the_listing_began() -> None:
    idx = FragmentIndex("a/j")
    idx.replace_persisted([_frag(0, 100)])
    token = idx.listing_started()
    idx.add_persisted(_frag(100, 200))  # Persisted while the listing ran...
    idx.replace_persisted([_frag(0, 100)], token)  # ...which missed it.
    assert [(f.begin, f.end) for f in idx.persisted()] == [(0, 100), (100, 200)]
    token = idx.listing_started()
    idx.replace_persisted([_frag(0, 100)], token)  # A later listing is authoritative.
    assert [(f.begin, f.end) for f in idx.persisted()] == [(0, 100)]


def test_a_listing_landing_after_a_later_one_changes_nothing() -> None:
    # Listings overlap: the refresher's, and a read's or retention's `Replica.refresh`. An
    # older listing landing last replaced the newer one's result: a fragment persisted (and
    # its spool removed) between the two starts vanished from the index until the next
    # scheduled listing, and reads of its offsets waited; a fragment retention removed
    # between them came back.
    idx = FragmentIndex("a/j")
    idx.replace_persisted([_frag(0, 100), _frag(100, 200)])
    older = idx.listing_started()
    idx.add_persisted(_frag(200, 300))  # Persisted; its spool leaves the index.
    newer = idx.listing_started()
    idx.replace_persisted([_frag(100, 200), _frag(200, 300)], newer)  # [0, 100) removed.
    assert idx.replace_persisted([_frag(0, 100), _frag(100, 200)], older) == []
    assert [(f.begin, f.end) for f in idx.persisted()] == [(100, 200), (200, 300)]
    frag, _, _ = idx.query(250)
    assert frag is not None and (frag.begin, frag.end) == (200, 300)


def test_refresh_drops_closed_spools_already_persisted(tmp_path: Path) -> None:
    idx = FragmentIndex("a/j")
    spool = Spool.create(tmp_path, "a/j", 0, pb.NONE, pb.LabelSet(), sync=False)
    pending = spool.start_append()
    pending.write(b"0123456789")
    spool.commit(pending, None)
    idx.add_local(spool)
    assert idx.replace_persisted([_frag(0, 10)]) == []  # Open spools are never dropped.
    spool.close()
    assert idx.replace_persisted([_frag(0, 5)]) == []  # Not covered.
    assert idx.replace_persisted([_frag(0, 5), _frag(5, 10)]) == [spool]
    assert idx.local_spools() == []


def test_replace_persisted_keeps_cover_set() -> None:
    idx = FragmentIndex("a/j")
    idx.replace_persisted([_frag(0, 10), _frag(0, 20), _frag(20, 30), _frag(25, 30)])
    assert [(f.begin, f.end) for f in idx.persisted()] == [(0, 20), (20, 30)]
    assert idx.first_refresh_done.is_set()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 300)), max_size=30))
def test_persisted_end_is_the_largest_end(spans: list[tuple[int, int]]) -> None:
    idx = FragmentIndex("a/j")
    for begin, length in spans:
        idx.add_persisted(_frag(begin, begin + length))
    assert idx.persisted_end == max((f.end for f in idx.persisted()), default=0)
