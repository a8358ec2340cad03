"""The registers kept for a journal whose spools are all persisted: records and their file."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pygazette.broker.fragment import kept_registers
from pygazette.protocol.pb import protocol_pb2 as pb


def _labels(*pairs: tuple[str, str]) -> pb.LabelSet:
    return pb.LabelSet(labels=[pb.Label(name=n, value=v) for n, v in pairs])


def test_a_record_reads_back_as_it_was_kept(tmp_path: Path) -> None:
    path = kept_registers.path_of(tmp_path, "a%2Fb")
    regs = _labels(("author", "shard-1"), ("spark.w", "5.q"))
    kept_registers.save(path, "a/b", 2048, regs, sync=True)
    assert kept_registers.load(path, "a/b") == (2048, regs)
    # Rewritten in place with a shorter record: the longer one's tail is ignored.
    kept_registers.save(path, "a/b", 4096, pb.LabelSet(), sync=False)
    assert kept_registers.load(path, "a/b") == (4096, pb.LabelSet())


def test_no_record_of_another_journal_a_torn_one_or_none(tmp_path: Path) -> None:
    path = kept_registers.path_of(tmp_path, "j")
    assert kept_registers.load(path, "j") is None
    kept_registers.save(path, "j", 10, _labels(("k", "v")), sync=False)
    assert kept_registers.load(path, "other") is None
    data = path.read_bytes()
    for cut in range(len(data)):  # Torn anywhere: no record.
        path.write_bytes(data[:cut])
        assert kept_registers.load(path, "j") is None
    flipped = bytearray(data)
    flipped[-1] ^= 0x01
    path.write_bytes(bytes(flipped))
    assert kept_registers.load(path, "j") is None
    kept_registers.forget(path)
    kept_registers.forget(path)  # Gone already: nothing to do.
    assert not path.exists()


@given(
    st.text(min_size=1, max_size=40),
    st.integers(0, 2**63 - 1),
    st.lists(st.tuples(st.text(max_size=20), st.text(max_size=50)), max_size=8),
)
def test_records_round_trip(journal: str, end: int, pairs: list[tuple[str, str]]) -> None:
    regs = _labels(*pairs)
    assert kept_registers.decode(journal, kept_registers.encode(journal, end, regs)) == (end, regs)
