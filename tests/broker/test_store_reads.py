"""Reads of persisted fragments out of a real S3 server (versitygw on loopback), by a broker in
the test's process (its replica's listings observable) and by a client reading a fragment's
signed URL directly: a fragment that retention (or `journals prune`, or a hand) removes while
a read serves it is read to its end, as Gazette's broker and client read the one GET they
opened; reads from offsets inside fragments."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from pygazette.broker import read_service
from pygazette.broker.server import Broker, BrokerConfig
from pygazette.client.fragment_reader import open_fragment_url
from pygazette.protocol.fragment_name import fragment_content_path, sha1sum_from_digest
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.stores import codecs
from pygazette.stores.store import open_store
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.s3_real_server import RealS3Server, credentials_env, running_real_s3

MiB = 1 << 20


@pytest.fixture(scope="module")
def real_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealS3Server]:
    with running_real_s3(tmp_path_factory.mktemp("real-s3")) as server:
        yield server


@pytest.fixture(autouse=True)
def s3_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's credentials, for the stores this process opens (obstore reads them)."""
    for key, value in credentials_env().items():
        monkeypatch.setenv(key, value)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    b = Broker(BrokerConfig(data_dir=tmp_path / "data", port=0, retention_interval=0))
    await b.start()
    try:
        yield b
    finally:
        await b.stop(grace=1.0)


def _content(codec: int) -> bytes:
    # 24 MiB: several of the ranges pygazette once fetched (8 MiB), compressed or not.
    if codec == pb.NONE:
        return os.urandom(24 * MiB)
    return os.urandom(12 * MiB).hex().encode()  # About half as large compressed.


def _put_fragments(
    s3: RealS3Server, bucket: str, name: str, codec: int, contents: list[bytes]
) -> list[tuple[pb.Fragment, str]]:
    """Fragments of `contents`, one after another, put into the bucket as a broker would."""
    out = []
    begin = 0
    for content in contents:
        frag = pb.Fragment(
            journal=name,
            begin=begin,
            end=begin + len(content),
            compression_codec=codec,  # type: ignore[arg-type]
        )
        frag.sum.CopyFrom(sha1sum_from_digest(hashlib.sha1(content).digest()))
        key = fragment_content_path(frag)
        # As the persister puts them: an offloaded gzip fragment says it is gzip-encoded.
        extra = {"ContentEncoding": "gzip"} if codec == pb.GZIP_OFFLOAD_DECOMPRESSION else {}
        s3.client().put_object(
            Bucket=bucket, Key=key, Body=codecs.compress(codec, content), **extra
        )
        out.append((frag, key))
        begin += len(content)
    return out


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP, pb.SNAPPY])
async def test_a_fragment_removed_while_the_broker_reads_it_is_read_to_its_end(
    broker: Broker, real_s3: RealS3Server, codec: int
) -> None:
    # Retention removes a fragment from the bucket while a read is serving it. Gazette's
    # broker reads on from the one GET it opened, to the fragment's end. pygazette fetched it
    # as a series of 8 MiB ranges: the range after the removal found it missing, the broker
    # listed its store again and jumped to the next fragment (the reader got 8 MiB of 24,
    # then an offset jump).
    name = f"read/s3-removed-while-read/{codec}"
    bucket = real_s3.create_bucket()
    first, second = _content(codec), b"b" * 1000
    frags = _put_fragments(real_s3, bucket, name, codec, [first, second])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        spec = journal_spec(name, codec=codec, stores=[real_s3.store_url(bucket)])
        assert (await apply_specs(stub, spec)).status == pb.OK
        replica = broker.resolver.resolve(name)
        assert replica is not None
        await replica.refresh()
        assert len(replica.index.persisted()) == 2

        content = b""
        offsets = []
        sizes = []
        async for resp in stub.Read(pb.ReadRequest(journal=name, offset=0), timeout=60):
            if not resp.content:
                offsets.append((resp.status, resp.offset))
                continue
            sizes.append(len(resp.content))
            if not content:
                # The read is under way: the fragment is removed, and the broker lists its
                # store again.
                await asyncio.to_thread(
                    real_s3.client().delete_object, Bucket=bucket, Key=frags[0][1]
                )
                await replica.refresh()
                assert len(replica.index.persisted()) == 1
            assert resp.offset == len(content)
            content += resp.content
    assert len(content) == len(first) + len(second)
    assert content == first + second
    if codec == pb.NONE:
        # Whole READ_CHUNKs, as the store's network-sized chunks are coalesced (the store's
        # chunks of 1-1.3 MiB each went out as 1 MiB and a sliver).
        assert sizes == [read_service.READ_CHUNK] * 24 + [len(second)]
    assert offsets == [
        (pb.OK, 0),
        (pb.OK, len(first)),
        (pb.OFFSET_NOT_YET_AVAILABLE, len(first) + len(second)),
    ]


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.GZIP_OFFLOAD_DECOMPRESSION])
async def test_reads_from_offsets_inside_a_fragment(
    broker: Broker, real_s3: RealS3Server, codec: int
) -> None:
    name = f"read/s3-offsets/{codec}"
    bucket = real_s3.create_bucket()
    first, second = _content(codec)[: 10 * MiB + 17], b"second" * 100
    _put_fragments(real_s3, bucket, name, codec, [first, second])
    whole = first + second
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        spec = journal_spec(name, codec=codec, stores=[real_s3.store_url(bucket)])
        assert (await apply_specs(stub, spec)).status == pb.OK
        replica = broker.resolver.resolve(name)
        assert replica is not None
        await replica.refresh()
        for offset, end_offset in (
            (0, 0),
            (1, 0),
            (9 * MiB + 5, 0),
            (len(first) - 1, 0),
            (3, 9),
            (MiB, 9 * MiB + 1),
            (len(first), 0),
        ):
            content = b""
            req = pb.ReadRequest(journal=name, offset=offset, end_offset=end_offset)
            async for resp in stub.Read(req, timeout=60):
                if resp.content:
                    assert resp.offset == offset + len(content)
                    content += resp.content
                else:
                    assert resp.status in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE), resp
            assert content == whole[offset : end_offset or None], (offset, end_offset)


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION])
async def test_a_fragment_removed_while_a_client_reads_its_signed_url_is_read_to_its_end(
    real_s3: RealS3Server, tmp_path: Path, codec: int
) -> None:
    # A do_not_proxy reader fetches the fragment from its signed URL in one GET and reads on
    # from it, as Gazette's client does, whatever becomes of the object meanwhile.
    name = f"read/s3-signed-removed/{codec}"
    bucket = real_s3.create_bucket()
    content = _content(codec)
    [(frag, key)] = _put_fragments(real_s3, bucket, name, codec, [content])
    store = open_store(real_s3.store_url(bucket), file_root=tmp_path)
    url = await store.signed_url(key, 600)
    for offset in (0, 5 * MiB + 3):
        reader = await open_fragment_url(frag, offset, url)
        got = [await reader.read()]
        assert got[0]
        if offset:
            await asyncio.to_thread(real_s3.client().delete_object, Bucket=bucket, Key=key)
        while chunk := await reader.read():
            got.append(chunk)
        assert b"".join(got) == content[offset:]
        await reader.aclose()


async def test_fragment_urls_of_reads_are_signed_for_a_minute_as_gazettes(
    broker: Broker, real_s3: RealS3Server
) -> None:
    # Gazette's broker signs a Read response's fragment URL for a minute (fragment/index.go:
    # SignGetURL(..., time.Minute)); pygazette's were good for an hour, so a URL caught from
    # a response (a log, a proxy) read the fragment 60 times longer.
    name = "read/s3-url-ttl"
    bucket = real_s3.create_bucket()
    [(_, key)] = _put_fragments(real_s3, bucket, name, pb.NONE, [b"x" * 100])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        spec = journal_spec(name, stores=[real_s3.store_url(bucket)])
        assert (await apply_specs(stub, spec)).status == pb.OK
        replica = broker.resolver.resolve(name)
        assert replica is not None
        await replica.refresh()
        req = pb.ReadRequest(journal=name, offset=0, do_not_proxy=True)
        urls = [r.fragment_url async for r in stub.Read(req, timeout=30) if r.fragment_url]
    assert len(urls) == 1 and f"/{bucket}/{key}?" in urls[0], urls
    assert "X-Amz-Expires=60&" in urls[0] or urls[0].endswith("X-Amz-Expires=60"), urls[0]
