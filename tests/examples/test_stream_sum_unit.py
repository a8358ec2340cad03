"""stream-sum without servers: CRC-64 against Go's hash/crc64, Chunk and Sum encoded byte for
byte as Go's encoding/json writes them, Go's Sum.Update and generate cases, and the Summer
folding chunks in every store kind (a fake publisher collects what it publishes)."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from examples.stream_sum import crc64
from examples.stream_sum.chunker import generate
from examples.stream_sum.messages import (
    FINAL_SUMS_JOURNAL,
    FRAMING,
    InvalidChunk,
    Sum,
    chunk_data,
    chunk_id,
    chunks_mapping,
    new_chunk,
)
from examples.stream_sum.summer import Summer
from pygazette.consumer.json_file_store import JSONFileStore
from pygazette.consumer.memory_store import MemoryStore
from pygazette.consumer.sqlite_store import SQLiteStore
from pygazette.message.envelope import Envelope
from pygazette.message.framing import framing_for
from pygazette.message.mapping import fnv1a32
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb

# Produced by Go 1.25: crc64.Checksum(s, crc64.MakeTable(crc64.ECMA)).
GO_CRC64 = [
    (b"", 0x0000000000000000),
    (b"a", 0x330284772E652B05),
    (b"123456789", 0x995DC9BBDF1939FA),  # The CRC-64/XZ check value.
    (b"battery", 0x2BE55FC66A381C84),
    (b"battery horse", 0xAE763109C1192ED6),
    (b"The quick brown fox jumps over the lazy dog", 0x5B5EB8C2E54AA1C4),
    (bytes((i * 7) & 0xFF for i in range(1000)), 0x4BB90D757D4EFE3D),
]

# Produced by Go's json.NewEncoder(os.Stdout).Encode of Gazette's stream_sum.Chunk and Sum
# (UUID 9f2952f3-c6a3-11ea-8802-080607050309, ID[i] = i*17+3).
GO_UUID = "9f2952f3-c6a3-11ea-8802-080607050309"
GO_ID = bytes((i * 17 + 3) & 0xFF for i in range(16))
GO_CHUNK = (
    b'{"UUID":"9f2952f3-c6a3-11ea-8802-080607050309",'
    b'"ID":[3,20,37,54,71,88,105,122,139,156,173,190,207,224,241,2],'
    b'"SeqNo":7,"Data":"YmF0dGVyeSBob3JzZSBzdGFwbGUh"}\n'
)
GO_FINAL_CHUNK = (
    b'{"UUID":"9f2952f3-c6a3-11ea-8802-080607050309",'
    b'"ID":[3,20,37,54,71,88,105,122,139,156,173,190,207,224,241,2],"SeqNo":8,"Data":null}\n'
)
GO_EMPTY_CHUNK = (
    b'{"UUID":"9f2952f3-c6a3-11ea-8802-080607050309",'
    b'"ID":[3,20,37,54,71,88,105,122,139,156,173,190,207,224,241,2],"SeqNo":9,"Data":""}\n'
)
GO_SUM = (
    b'{"UUID":"9f2952f3-c6a3-11ea-8802-080607050309",'
    b'"ID":[3,20,37,54,71,88,105,122,139,156,173,190,207,224,241,2],'
    b'"SeqNo":8,"Value":12571289327815438038}\n'
)
GO_ZERO_SUM = (
    b'{"UUID":"00000000-0000-0000-0000-000000000000",'
    b'"ID":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"SeqNo":0,"Value":0}\n'
)


# CRC-64 ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "want"), GO_CRC64)
def test_crc64_matches_go(data: bytes, want: int) -> None:
    assert crc64.checksum(data) == want
    assert crc64.checksum(bytearray(data)) == want
    assert crc64.checksum(memoryview(data)) == want


def test_crc64_update_continues_across_any_split() -> None:
    data = random.Random(1).randbytes(301)
    whole = crc64.checksum(data)
    for cut in (0, 1, 7, 8, 9, 64, 300, 301):
        assert crc64.update(crc64.update(0, data[:cut]), data[cut:]) == whole
    assert crc64.update(0x2BE55FC66A381C84, b" horse") == 0xAE763109C1192ED6


# Messages --------------------------------------------------------------------------------


def test_chunk_encodes_as_go_does() -> None:
    chunk = new_chunk(GO_ID, 7, b"battery horse staple!")
    FRAMING.set_uuid(chunk, GO_UUID)
    assert FRAMING.marshal(chunk) == GO_CHUNK
    final = new_chunk(GO_ID, 8, None)
    FRAMING.set_uuid(final, GO_UUID)
    assert FRAMING.marshal(final) == GO_FINAL_CHUNK
    # Many at once (the chunker's batches) keep Go's field order too.
    from pygazette.message.uuid import OUTSIDE_TXN, UUIDFormatter

    batch = [new_chunk(GO_ID, i, b"x") for i in (1, 2)]
    out = FRAMING.marshal_sequence(batch, UUIDFormatter(b"\x01" * 6), 1 << 40, OUTSIDE_TXN)
    for line in out.splitlines():
        assert list(orjson.loads(line)) == ["UUID", "ID", "SeqNo", "Data"]


def test_go_chunks_decode() -> None:
    payloads, _ = FRAMING.split(GO_CHUNK + GO_FINAL_CHUNK + GO_EMPTY_CHUNK)
    out: list[Any] = []
    FRAMING.envelopes(payloads, "j", 0, out)
    chunk, final, empty = (env.message for env in out)
    assert out[0].clock != 0  # The UUID was found in Go's field "UUID".
    assert chunk_id(chunk) == GO_ID
    assert chunk_data(chunk) == b"battery horse staple!"
    assert chunk_data(final) == b"" and chunk_data(empty) == b""
    # The default JSON framing (field "uuid") finds Go's "UUID" too.
    default: list[Any] = []
    framing_for("application/x-ndjson").envelopes(payloads[:1], "j", 0, default)
    assert default[0].clock == out[0].clock


def test_sum_encodes_as_go_does_with_any_json_framing() -> None:
    for framing in (FRAMING, framing_for("application/x-ndjson")):
        s = Sum.of_stream(GO_ID, 8, 0xAE763109C1192ED6)
        framing.set_uuid(s, GO_UUID)
        assert framing.marshal(s) == GO_SUM
        ack = framing.new_acknowledgement(s, FINAL_SUMS_JOURNAL)
        framing.set_uuid(ack, "00000000-0000-0000-0000-000000000000")
        assert framing.marshal(ack) == GO_ZERO_SUM
    doc = orjson.loads(GO_SUM)
    s = Sum.from_json(doc)
    assert (s.stream_id, s.SeqNo, s.Value, s.UUID) == (GO_ID, 8, 0xAE763109C1192ED6, GO_UUID)


def test_sum_update_cases_of_go() -> None:
    """Gazette's TestUpdateSumCases."""
    sid = random.Random(2).randbytes(16)
    cases = [
        ([(1, b"battery horse")], 0xAE763109C1192ED6),
        ([(1, b"battery"), (2, b" horse")], 0xAE763109C1192ED6),
    ]
    for chunks, want in cases:
        s = Sum.of_stream(sid)
        for seq, data in chunks:
            assert s.update(new_chunk(sid, seq, data)) is False
        assert (s.SeqNo, s.Value) == (len(chunks), want)

    s = Sum.of_stream(sid, 2, 0xFEEDBEEF)
    with pytest.raises(InvalidChunk, match=r"invalid chunk\.SeqNo"):
        s.update(new_chunk(sid, 4, b"foo"))
    with pytest.raises(InvalidChunk, match=r"invalid chunk\.ID"):
        s.update(new_chunk(random.Random(3).randbytes(16), 3, b"foo"))
    assert (s.SeqNo, s.Value) == (2, 0xFEEDBEEF)  # Unchanged by the failures.
    assert s.update(new_chunk(sid, 3, None)) is True  # A terminating (empty) chunk.
    assert (s.SeqNo, s.Value) == (3, 0xFEEDBEEF)


def test_chunks_map_by_fnv1a_of_the_stream_id_as_go() -> None:
    listing = pb.ListResponse()
    for i in range(4):
        j = listing.journals.add()
        j.spec.name = f"examples/stream-sum/chunks/part-{i:03d}"
        j.spec.labels.CopyFrom(label_set({"content-type": "application/x-ndjson"}))
    mapping = chunks_mapping(listing)
    for seed in range(20):
        sid = random.Random(seed).randbytes(16)
        journal, content_type = mapping(new_chunk(sid, 1, b"x"))
        assert journal == f"examples/stream-sum/chunks/part-{fnv1a32(sid) % 4:03d}"
        assert content_type == "application/x-ndjson"


# generate ----------------------------------------------------------------------------------


def test_generate_simple_fixture() -> None:
    """Gazette's TestGenerationWithSimpleFixture: 1 stream of 2 chunks, then its end."""
    out = list(generate(1, 2, random.Random(4)))
    assert [c["SeqNo"] for c, _ in out] == [1, 2, 3]
    assert len({chunk_id(c) for c, _ in out}) == 1
    assert [e is None for _, e in out] == [True, True, False]
    assert out[2][0]["Data"] is None
    expect = out[2][1]
    assert expect is not None
    assert expect.SeqNo == 3
    assert expect.Value == crc64.checksum(chunk_data(out[0][0]) + chunk_data(out[1][0]))


def test_generate_interleaves_every_stream_to_its_end() -> None:
    n_streams, n_chunks = 20, 20
    streams: dict[bytes, list[int]] = {}
    sums = {}
    for chunk, expect in generate(n_streams, n_chunks, random.Random(5)):
        streams.setdefault(chunk_id(chunk), []).append(chunk["SeqNo"])
        if expect is not None:
            sums[expect.stream_id] = expect
    assert len(streams) == n_streams
    assert all(seqs == list(range(1, n_chunks + 2)) for seqs in streams.values())
    assert set(sums) == set(streams)
    # Interleaved: some stream starts before another ends.
    order = [chunk_id(c) for c, _ in generate(n_streams, n_chunks, random.Random(5))]
    assert order != sorted(order, key=order.index)


# The Summer --------------------------------------------------------------------------------


class FakePublisher:
    """Collects what the summer publishes uncommitted, encoded as the runtime would."""

    def __init__(self) -> None:
        self.framing = framing_for("application/x-ndjson")
        self.published: list[tuple[str, bytes]] = []

    def publish_uncommitted(self, mapping: Any, msg: Any) -> None:
        journal, content_type = mapping(msg)
        assert content_type == "application/x-ndjson"
        self.framing.set_uuid(msg, GO_UUID)
        self.published.append((journal, self.framing.marshal(msg)))


def fake_shard(store: str, local_dir: Path) -> Any:
    spec = cpb.ShardSpec(id="chunks-part-000", labels=label_set({"store": store}))
    return SimpleNamespace(id=spec.id, spec=spec, local_dir=str(local_dir))


def feed(
    app: Summer, shard: Any, store: Any, pub: FakePublisher, chunks: list[dict[str, Any]], seed: int
) -> None:
    """Consume chunks in transactions of random sizes, as the runtime would."""
    rng = random.Random(seed)
    i = 0
    while i < len(chunks):
        app.begin_txn(shard, store)
        for chunk in chunks[i : i + rng.randint(1, 50)]:
            # Round-trip through the wire form, as the runtime hands them over.
            doc = orjson.loads(FRAMING.marshal(dict(chunk, UUID=GO_UUID)))
            app.consume_message(shard, store, Envelope("j", 0, 1, doc), pub)  # type: ignore[arg-type]
            i += 1
        app.finalize_txn(shard, store, pub)  # type: ignore[arg-type]


async def commit(store: Any) -> None:
    await store.start_commit(None, cpb.Checkpoint(), [])


@pytest.mark.parametrize("kind", ["memory", "json", "sqlite"])
async def test_summer_publishes_each_final_sum_once(kind: str, tmp_path: Path) -> None:
    app = Summer()
    shard = fake_shard(kind, tmp_path / "shard")
    store = app.new_store(shard, None)
    assert (
        type(store) is {"memory": MemoryStore, "json": JSONFileStore, "sqlite": SQLiteStore}[kind]
    )
    pub = FakePublisher()
    generated = list(generate(30, 15, random.Random(6)))
    expected = {e.stream_id: e for _, e in generated if e is not None}
    chunks = [c for c, _ in generated]
    half = len(chunks) // 2
    try:
        feed(app, shard, store, pub, chunks[:half], seed=7)
        await commit(store)
        if kind != "memory":
            # A new store on the same files (a restarted shard) continues the partial sums.
            store.destroy()
            store = app.new_store(shard, None)
            await store.restore_checkpoint(shard)
        feed(app, shard, store, pub, chunks[half:], seed=8)
        await commit(store)
    finally:
        store.destroy()
    got: dict[bytes, Sum] = {}
    for journal, line in pub.published:
        assert journal == FINAL_SUMS_JOURNAL
        s = Sum.from_json(orjson.loads(line))
        assert s.stream_id not in got, "a sum was published twice"
        got[s.stream_id] = s
        assert line == FRAMING.marshal(
            Sum(UUID=GO_UUID, ID=list(s.stream_id), SeqNo=s.SeqNo, Value=s.Value)
        )
    assert {k: (v.SeqNo, v.Value) for k, v in got.items()} == {
        k: (v.SeqNo, v.Value) for k, v in expected.items()
    }


async def test_summer_sqlite_keeps_gazettes_table(tmp_path: Path) -> None:
    app = Summer()
    shard = fake_shard("sqlite", tmp_path)
    store = app.new_store(shard, None)
    pub = FakePublisher()
    sid = bytes(range(16))
    try:
        feed(
            app, shard, store, pub, [new_chunk(sid, 1, b"battery"), new_chunk(sid, 2, b" horse")], 1
        )
        await commit(store)
        rows = list(store.db.execute("SELECT id, seq_no, val FROM sums"))
        assert rows == [(sid, 2, (0xAE763109C1192ED6).to_bytes(8, "little"))]
        feed(app, shard, store, pub, [new_chunk(sid, 3, None)], 1)
        await commit(store)
        # The final sum stays in the table, as Go's summer leaves it.
        assert list(store.db.execute("SELECT seq_no FROM sums")) == [(3,)]
    finally:
        store.destroy()
    assert len(pub.published) == 1


async def test_summer_fails_the_shard_on_a_gap(tmp_path: Path) -> None:
    app = Summer()
    shard = fake_shard("memory", tmp_path)
    store = app.new_store(shard, None)
    sid = bytes(16)
    with pytest.raises(InvalidChunk):
        feed(
            app,
            shard,
            store,
            FakePublisher(),
            [new_chunk(sid, 1, b"a"), new_chunk(sid, 3, b"b")],
            1,
        )


def test_summer_refuses_an_unknown_store_label(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rocksdb"):
        Summer().new_store(fake_shard("rocksdb", tmp_path), None)


def test_memory_state_forgets_finished_streams(tmp_path: Path) -> None:
    app = Summer()
    shard = fake_shard("memory", tmp_path)
    store = app.new_store(shard, None)
    sid = bytes(16)
    feed(app, shard, store, FakePublisher(), [new_chunk(sid, 1, b"a")], 1)
    assert store.state["sums"] == {sid.hex(): [1, crc64.checksum(b"a")]}
    feed(app, shard, store, FakePublisher(), [new_chunk(sid, 2, None)], 1)
    assert store.state["sums"] == {}


@pytest.mark.parametrize("seed", range(6))
def test_crc64_update_many_equals_update_per_stream(seed: int) -> None:
    """The vectorized fold of a whole transaction equals Go's CRC-64 stream by stream, for
    chunk sizes on both sides of its fast path and streams of very different lengths."""
    rng = random.Random(seed)
    for nstreams, maxchunks, sizes in (
        (rng.randint(0, 300), 60, [32]),
        (rng.randint(1, 300), 60, list(range(71))),
        (rng.randint(1, 5), 500, [0, 1, 7, 8, 9, 32]),
        (rng.randint(1, 50), 20, [32, 300]),
    ):
        values = [rng.getrandbits(64) for _ in range(nstreams)]
        pieces = [
            [rng.randbytes(rng.choice(sizes)) for _ in range(rng.randint(0, maxchunks))]
            for _ in range(nstreams)
        ]
        want = [crc64.update(v, b"".join(p)) for v, p in zip(values, pieces, strict=True)]
        assert crc64.update_many(values, pieces) == want
