"""The Read RPC against brokers in the test's process (their replicas' listings observable):
persisted fragments that go away while a read runs (retention by another broker, or by
hand), and, in cluster mode, gaps the primary reads from a peer."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from pygazette.broker import read_service
from pygazette.broker.replica import Replica
from pygazette.broker.server import Broker, BrokerConfig
from pygazette.protocol.fragment_name import fragment_content_path, sha1sum_from_digest
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.stores import codecs
from tests.broker.fragment_helpers import wait_persisted
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all
from tests.support.cluster import append_once
from tests.support.etcd_process import EtcdProcess


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    b = Broker(BrokerConfig(data_dir=tmp_path / "data", port=0, retention_interval=0))
    await b.start()
    try:
        yield b
    finally:
        await b.stop(grace=1.0)


async def test_a_long_read_reads_on_past_many_fragments_removed_since_its_listings(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A catch-up read runs behind retention that another broker enforces: fragment after
    # fragment it is about to read was removed since the broker's last listing. Each time it
    # lists again and reads on from the journal's first fragment left. Its count of missing
    # fragments never went back to zero as it read on, so the third one failed the read
    # with UNAVAILABLE.
    name = "read/missing/many"
    chunks = [bytes([ord("a") + i]) * 2000 for i in range(8)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        assert (await apply_specs(stub, journal_spec(name, length=1024))).status == pb.OK
        for data in chunks:  # Each append closes the spool before it.
            assert (await append(stub, name, data)).status == pb.OK
        frags = sorted(await wait_persisted(stub, name, 7 * 2000), key=lambda f: f.begin)
        files = [broker.file_root / fragment_content_path(f) for f in frags]
        replica = broker.resolver.resolve(name)
        assert replica is not None
        await replica.refresh()  # The index shows all 7 fragments.

        # Once the read has read fragments 0, 2 and 4, retention removes it and the next.
        removals = {str(files[i]): [files[i], files[i + 1]] for i in (0, 2, 4)}
        opened = read_service._FragmentFile

        def open_then_retention(path: object) -> read_service._FragmentFile:
            file = opened(path)
            for f in removals.pop(str(path), []):
                f.unlink()
            return file

        monkeypatch.setattr(read_service, "_FragmentFile", open_then_retention)
        content, meta = await read_all(stub, name)
        assert not removals
        assert content == b"".join(chunks[i] for i in (0, 2, 4, 6, 7))
        assert [(m.status, m.offset) for m in meta] == [
            (pb.OK, 0),
            (pb.OK, 2000),  # Found missing; after listing again: before every fragment.
            (pb.OK, 4000),
            (pb.OK, 6000),
            (pb.OK, 8000),
            (pb.OK, 10000),
            (pb.OK, 12000),
            (pb.OK, 14000),  # The open spool.
            (pb.OFFSET_NOT_YET_AVAILABLE, 16000),
        ]


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP])
async def test_a_fragment_removed_while_it_is_read_is_read_to_its_end(
    broker: Broker, codec: int
) -> None:
    # Retention (or gazctl journals prune) removes a fragment a read is serving, after the
    # read opened it: Gazette's broker reads on from the file it opened, to the fragment's
    # end (8 MiB of 8 MiB, interop/bin/gazette). pygazette opened the file again for every
    # 1 MiB it read, found it gone, listed the store again and jumped to the next fragment:
    # the reader got 1 MiB of it, then an offset jump.
    name = f"read/removed-while-read/{codec}"
    first = os.urandom(4 << 20).hex().encode()  # 8 MiB, as large compressed.
    second = b"b" * 1000
    frags = []
    for begin, content in ((0, first), (len(first), second)):
        frag = pb.Fragment(
            journal=name,
            begin=begin,
            end=begin + len(content),
            compression_codec=codec,  # type: ignore[arg-type]
        )
        frag.sum.CopyFrom(sha1sum_from_digest(hashlib.sha1(content).digest()))
        path = broker.file_root / fragment_content_path(frag)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(codecs.compress(codec, content))
        frags.append(frag)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        assert (await apply_specs(stub, journal_spec(name, codec=codec))).status == pb.OK
        replica = broker.resolver.resolve(name)
        assert replica is not None
        await replica.refresh()

        content = b""
        offsets = []
        async for resp in stub.Read(pb.ReadRequest(journal=name, offset=0), timeout=60):
            if not resp.content:
                offsets.append((resp.status, resp.offset))
                continue
            if not content:
                # The read is under way: retention removes the fragment, and the broker
                # lists its store again.
                (broker.file_root / fragment_content_path(frags[0])).unlink()
                await replica.refresh()
                assert len(replica.index.persisted()) == 1
            assert resp.offset == len(content)
            content += resp.content
    assert content == first + second
    assert offsets == [
        (pb.OK, 0),
        (pb.OK, len(first)),
        (pb.OFFSET_NOT_YET_AVAILABLE, len(first) + len(second)),
    ]


@pytest.mark.parametrize("codec", [pb.GZIP, pb.ZSTANDARD, pb.SNAPPY])
async def test_a_highly_compressed_fragment_is_served_in_bounded_memory(
    broker: Broker, codec: int
) -> None:
    # A fragment another broker persisted (Gazette's default fragment length is 512 MiB):
    # 64 MiB of repeated lines, a few KiB of gzip or zstd. Each raw chunk read from the store
    # was decoded at once, so serving it held all 64 MiB (snappy: 21 MiB per 1 MiB read).
    name = f"read/compressed/{codec}"
    content = b"0123456789abcdef" * (4 << 20)
    frag = pb.Fragment(journal=name, begin=0, end=len(content), compression_codec=codec)  # type: ignore[arg-type]
    frag.sum.CopyFrom(sha1sum_from_digest(hashlib.sha1(content).digest()))
    path = broker.file_root / fragment_content_path(frag)
    path.parent.mkdir(parents=True)
    path.write_bytes(codecs.compress(codec, content))
    digest = hashlib.sha1(content).hexdigest()
    del content
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        assert (await apply_specs(stub, journal_spec(name, codec=codec))).status == pb.OK
        replica = broker.resolver.resolve(name)
        assert replica is not None
        await replica.refresh()
        tracemalloc.start()
        try:
            served = hashlib.sha1()
            async for resp in stub.Read(
                pb.ReadRequest(journal=name, offset=0, end_offset=frag.end), timeout=60
            ):
                served.update(resp.content)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert served.hexdigest() == digest
    assert peak < 12 << 20, f"peak {peak >> 20} MiB while serving"


# Gap reads (cluster mode): two brokers, each persisting to `file:///` in its own data
# directory, as brokers started without a shared store do. What the primary lacks, it reads
# from its peer.
GAP_JOURNAL = "read/gaps"


class TwoBrokers:
    def __init__(self, brokers: list[Broker]) -> None:
        self.brokers = brokers
        self.channels = [grpc.aio.insecure_channel(f"127.0.0.1:{b.port}") for b in brokers]

    def stub(self, i: int) -> pb_grpc.JournalStub:
        return pb_grpc.JournalStub(self.channels[i])  # type: ignore[no-untyped-call]

    def replica(self, i: int) -> Replica:
        replica = self.brokers[i].resolver.replicas.get(GAP_JOURNAL)
        assert replica is not None
        return replica

    async def appends(self, *chunks: bytes) -> None:
        """Append each chunk (retrying while the journal is being assigned)."""
        async with asyncio.timeout(60):
            for data in chunks:
                while True:
                    try:
                        resp = await append_once(self.stub(0), GAP_JOURNAL, data, within=10)
                    except grpc.aio.AioRpcError:
                        resp = None
                    if resp is not None and resp.status == pb.OK:
                        break
                    await asyncio.sleep(0.1)

    def primary(self) -> int:
        for i in range(2):
            replica = self.brokers[i].resolver.replicas.get(GAP_JOURNAL)
            if replica is not None and replica.primary:
                return i
        raise AssertionError("no primary")

    async def persisted_everywhere(self, end: int) -> list[pb.Fragment]:
        """Wait until both brokers persisted [0, end) to their own stores; the fragments."""
        async with asyncio.timeout(30):
            while True:
                frags: list[pb.Fragment] = []
                for i in range(2):
                    replica = self.replica(i)
                    await replica.refresh()
                    frags = sorted(replica.index.persisted(), key=lambda f: f.begin)
                    if not frags or frags[0].begin != 0 or frags[-1].end < end:
                        break
                else:
                    return frags
                await asyncio.sleep(0.05)

    async def remove(self, i: int, frags: list[pb.Fragment]) -> None:
        """Remove fragments from broker `i`'s store: it never held them."""
        for f in frags:
            (self.brokers[i].file_root / fragment_content_path(f)).unlink()
        await self.replica(i).refresh()


@pytest.fixture
async def two_brokers(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> AsyncIterator[TwoBrokers]:
    brokers: list[Broker] = []
    try:
        for i in range(2):
            b = Broker(
                BrokerConfig(
                    data_dir=tmp_path / f"broker-{i}",
                    port=0,
                    zone="zone-a",
                    broker_id=f"broker-{i}",
                    etcd_url=etcd.url,
                    etcd_prefix=etcd_root,
                    lease_ttl=3.0,
                    retention_interval=0,
                )
            )
            await b.start()
            brokers.append(b)
        two = TwoBrokers(brokers)
        spec = journal_spec(GAP_JOURNAL, replication=2, length=1024)
        assert (await apply_specs(two.stub(0), spec)).status == pb.OK
        yield two
        for channel in two.channels:
            await channel.close(None)
    finally:
        for b in brokers:
            await b.stop(grace=1.0)


async def test_a_gap_read_from_a_peer_skips_fragments_older_than_begin_mod_time(
    two_brokers: TwoBrokers,
) -> None:
    # The primary lacks a persisted fragment that its peer holds, and reads it from the
    # peer. The read asked for fragments persisted since `begin_mod_time` only: as the
    # primary skips its own older fragments, it skips the peer's. The peer was asked without
    # it, and the older fragment's content was passed on.
    chunks = [bytes([ord("a") + i]) * 2000 for i in range(3)]
    await two_brokers.appends(*chunks)  # Each append closes the spool before it.
    frags = await two_brokers.persisted_everywhere(4000)
    p = two_brokers.primary()
    await two_brokers.remove(p, [frags[1]])  # [2000, 4000): on the peer only.

    since = max(f.mod_time for f in frags) + 1  # Both persisted fragments are older.
    content, meta = await read_all(two_brokers.stub(p), GAP_JOURNAL, begin_mod_time=since)
    assert content == chunks[2]  # The open spool's: it has no mod time.
    assert [(m.status, m.offset) for m in meta] == [
        (pb.OK, 4000),
        (pb.OFFSET_NOT_YET_AVAILABLE, 6000),
    ]


async def test_a_gap_read_passes_on_no_offset_jump_of_the_peer(two_brokers: TwoBrokers) -> None:
    # The primary lacks [2000, 4000), young, which its peer lacks too; the peer's index, which
    # begins after it, would jump over it to its first fragment. The primary's index doesn't
    # jump over a young gap (Gazette's rules: it may be a fragment still being persisted),
    # and the peer's jump is no reason to: it answers as without the peer. The peer's jump,
    # to beyond the gap, was passed on to the client, and then the primary's answer at the
    # gap's offset, moving the read's offset back.
    chunks = [bytes([ord("a") + i]) * 2000 for i in range(4)]
    await two_brokers.appends(*chunks)
    frags = await two_brokers.persisted_everywhere(6000)
    p = two_brokers.primary()
    await two_brokers.remove(p, [frags[1]])
    await two_brokers.remove(1 - p, frags[:2])

    content, meta = await read_all(two_brokers.stub(p), GAP_JOURNAL)
    assert content == chunks[0]
    assert [(m.status, m.offset) for m in meta] == [
        (pb.OK, 0),
        (pb.OFFSET_NOT_YET_AVAILABLE, 2000),
    ]


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP, pb.ZSTANDARD])
async def test_a_fragment_file_longer_than_its_name_says_fails_the_read_at_its_end(
    broker: Broker, codec: int
) -> None:
    # A persisted fragment's name promises end - begin bytes of content. A file holding more
    # (damaged, or written by hand under the wrong name) was served up to its name's end as if
    # whole; Gazette's fragment reader fails such a read once it reaches the end.
    name = f"read/longer/{codec}"
    content = b"0123456789abcdef" * 1000
    frag = pb.Fragment(journal=name, begin=0, end=len(content), compression_codec=codec)  # type: ignore[arg-type]
    frag.sum.CopyFrom(sha1sum_from_digest(hashlib.sha1(content).digest()))
    path = broker.file_root / fragment_content_path(frag)
    path.parent.mkdir(parents=True)
    path.write_bytes(codecs.compress(codec, content + b"and then some"))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        assert (await apply_specs(stub, journal_spec(name, codec=codec))).status == pb.OK
        replica = broker.resolver.resolve(name)
        assert replica is not None
        await replica.refresh()

        async def read(offset: int, end_offset: int) -> bytes:
            got = b""
            async for resp in stub.Read(
                pb.ReadRequest(journal=name, offset=offset, end_offset=end_offset), timeout=30
            ):
                got += resp.content
            return got

        # Short of the end, the file's promise is not in question.
        assert await read(0, 5000) == content[:5000]
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await read(100, frag.end)
        assert "more content than its name says" in (failed.value.details() or "")


async def test_a_fragment_file_as_long_as_its_name_says_reads_to_its_end(broker: Broker) -> None:
    # The byte asked for past the end finds none: the read ends cleanly, whole.
    name = "read/exact"
    content = b"x" * (3 * read_service.READ_CHUNK + 5)
    frag = pb.Fragment(journal=name, begin=0, end=len(content), compression_codec=pb.NONE)
    frag.sum.CopyFrom(sha1sum_from_digest(hashlib.sha1(content).digest()))
    path = broker.file_root / fragment_content_path(frag)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        assert (await apply_specs(stub, journal_spec(name))).status == pb.OK
        replica = broker.resolver.resolve(name)
        assert replica is not None
        await replica.refresh()
        got = b""
        async for resp in stub.Read(
            pb.ReadRequest(journal=name, offset=0, end_offset=frag.end), timeout=30
        ):
            got += resp.content
    assert got == content
