"""Journals on an S3 store, end to end against a local S3 server (moto_server) on loopback:
persisting with every codec, reads after a restart, direct reads from presigned URLs, and
an unreachable store (appends refused past the spool backlog bound, nothing acknowledged
lost across a crash, recovery once the store is back)."""

from __future__ import annotations

import asyncio
import gzip
import time
from pathlib import Path

import grpc
import pytest

from pygazette.client.journal_client import JournalClient
from pygazette.client.reader import Reader
from pygazette.client.retry_reader import read_journal
from pygazette.client.store_health import fragment_store_health
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.fragment_helpers import assemble, check_fragment_file, wait_persisted
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all
from tests.cli.test_journals_cli import cli, ok
from tests.support.broker_process import BrokerProcess
from tests.support.s3_server import S3Server
from tests.support.tcp_proxy import TcpProxy


def _lines(n: int, tag: str) -> bytes:
    return b"".join(f'{{"{tag}": {i}, "pad": "{"p" * (i % 50)}"}}\n'.encode() for i in range(n))


def _objects(s3: S3Server, bucket: str, prefix: str) -> dict[str, tuple[bytes, str]]:
    return {
        key[len(prefix) :]: s3.get_object(bucket, key)
        for key in s3.object_keys(bucket)
        if key.startswith(prefix)
    }


async def test_s3_journals_round_trip_with_every_codec(
    s3_server: S3Server, tmp_path: Path, snappycat: Path
) -> None:
    bucket = s3_server.create_bucket()
    store = s3_server.store_url(bucket, "gazette/fragments")
    codecs_by_journal = {
        "s3/none": pb.NONE,
        "s3/gzip": pb.GZIP,
        "s3/zstd": pb.ZSTANDARD,
        "s3/snappy": pb.SNAPPY,
        "s3/gzip-offload": pb.GZIP_OFFLOAD_DECOMPRESSION,
    }
    broker = BrokerProcess(tmp_path / "data", extra_args=["--retention-interval", "0s"])
    broker.start()
    sent: dict[str, bytes] = {}
    try:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            specs = [
                journal_spec(name, codec=codec, length=8192, stores=[store])
                for name, codec in codecs_by_journal.items()
            ]
            assert (await apply_specs(stub, *specs)).status == pb.OK
            for name in codecs_by_journal:
                data = _lines(600, name)
                for i in range(0, len(data), 5000):
                    assert (await append(stub, name, data[i : i + 5000])).status == pb.OK
                sent[name] = data
        broker.stop()  # Persists the open spools: everything is in the bucket now.

        for name, codec in codecs_by_journal.items():
            objects = _objects(s3_server, bucket, f"gazette/fragments/{name}/")
            assert objects, name
            checked = []
            for path, (raw, encoding) in objects.items():
                if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
                    # No extension (Gazette v0.103), stored with Content-Encoding: gzip.
                    assert "." not in path.rsplit("/", 1)[-1] and encoding == "gzip", path
                    assert gzip.decompress(raw)
                checked.append(check_fragment_file(name, path, raw, snappycat))
            assert assemble(checked) == sent[name]

        broker.start()  # No spools left: reads are served from the store listing.
        async with JournalClient(broker.url) as client:
            stub = pb_grpc.JournalStub(client.channel)
            for name in codecs_by_journal:
                content, meta = await read_all(stub, name)
                assert content == sent[name], name
                assert all(
                    m.fragment_url.startswith(s3_server.endpoint) for m in meta if m.status == pb.OK
                )
                # do_not_proxy: the client reads each fragment from its presigned URL.
                async with Reader(client, name, do_not_proxy=True) as reader:
                    first = await reader.read()
                    assert reader.fragment_url.startswith(s3_server.endpoint + f"/{bucket}/")
                    assert "X-Amz-Signature=" in reader.fragment_url
                    assert reader.direct is not None
                direct = b"".join([c async for c in read_journal(client, name, do_not_proxy=True)])
                assert first and direct == sent[name], name

        out = ok(
            cli(broker.url, "journals", "fragments", "-l", "name=s3/zstd", "--url-ttl", "5m")
        ).decode()
        assert f"{s3_server.endpoint}/{bucket}/gazette/fragments/s3/zstd/" in out
        assert "X-Amz-Expires=300" in out
    finally:
        broker.kill()


async def _try_append(stub: pb_grpc.JournalStub, journal: str, data: bytes) -> pb.AppendResponse:
    return await append(stub, journal, data)


async def test_unreachable_store_bounds_spools_and_loses_nothing(
    s3_server: S3Server, tmp_path: Path
) -> None:
    bucket = s3_server.create_bucket()
    proxy = TcpProxy(s3_server.port)
    store = s3_server.store_url(bucket, endpoint=proxy.endpoint)
    journal = "s3/outage"
    limit = 16 * 1024
    broker = BrokerProcess(
        tmp_path / "data",
        extra_args=["--spool-backlog-limit", str(limit), "--retention-interval", "0s"],
    )
    broker.start()
    acked: list[tuple[int, bytes]] = []
    record = 0

    def next_record() -> bytes:
        nonlocal record
        record += 1
        return f"record {record:05d} ".encode() + b"." * 1000 + b"\n"

    try:
        async with JournalClient(broker.url) as client:
            stub = pb_grpc.JournalStub(client.channel)
            spec = journal_spec(journal, codec=pb.SNAPPY, length=1024, stores=[store])
            assert (await apply_specs(stub, spec)).status == pb.OK
            assert (await fragment_store_health(client, store)).status == pb.OK

            proxy.cut()
            # Appends go on while closed spools queue locally, up to the bound...
            refused = None
            for _ in range(200):
                data = next_record()
                resp = await _try_append(stub, journal, data)
                if resp.status != pb.OK:
                    refused = resp
                    record -= 1
                    break
                acked.append((resp.commit.begin, data))
            assert refused is not None, "appends were never refused"
            # ...then they are refused with Gazette's status and the store's error.
            assert refused.status == pb.FRAGMENT_STORE_UNHEALTHY
            assert store in refused.store_health_error
            assert f"limit {limit}" in refused.store_health_error
            assert limit <= len(acked) * 1012 <= limit + 3 * 1012
            health = await fragment_store_health(client, store)
            deadline = time.monotonic() + 30
            while health.status == pb.OK:  # The first failing check may still be running.
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
                health = await fragment_store_health(client, store)
            assert health.status == pb.FRAGMENT_STORE_UNHEALTHY and health.store_health_error

        # A crash while spools wait for the store: they are recovered, and still count.
        broker.kill()
        broker.start()
        async with JournalClient(broker.url) as client:
            stub = pb_grpc.JournalStub(client.channel)
            resp = await _try_append(stub, journal, b"refused\n")
            assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY
            # Readable meanwhile, from the recovered spools.
            end = acked[-1][0] + len(acked[-1][1])
            content, _ = await read_all(stub, journal, end_offset=end)
            assert content == b"".join(d for _, d in acked)
            with pytest.raises(grpc.aio.AioRpcError) as err:  # The stores hold the head.
                await read_all(stub, journal, offset=end)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "cannot list fragments" in (err.value.details() or "")

            proxy.restore()
            deadline = time.monotonic() + 60
            while True:  # Appends resume once the backlog drains into the store.
                data = next_record()
                resp = await _try_append(stub, journal, data)
                if resp.status == pb.OK:
                    acked.append((resp.commit.begin, data))
                    break
                record -= 1
                assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY
                assert time.monotonic() < deadline, resp.store_health_error
                await asyncio.sleep(0.1)
            await wait_persisted(stub, journal, acked[-1][0])
            # A persist that went through asks for a health check at once: no waiting out
            # the failure backoff (up to 10 s) to see the store healthy again.
            deadline = time.monotonic() + 5
            while (await fragment_store_health(client, store)).status != pb.OK:
                assert time.monotonic() < deadline, "store still reported unhealthy"
                await asyncio.sleep(0.05)
        broker.stop()

        expected = b"".join(d for _, d in sorted(acked))
        assert [b for b, _ in acked] == sorted(b for b, _ in acked)
        objects = _objects(s3_server, bucket, f"{journal}/")
        checked = [
            check_fragment_file(journal, p, raw, None)
            for p, (raw, _) in objects.items()
            if not p.endswith(".sz")
        ] + [
            _snappy_checked(journal, p, raw) for p, (raw, _) in objects.items() if p.endswith(".sz")
        ]
        assert assemble(checked) == expected
    finally:
        broker.kill()
        proxy.close()


def _snappy_checked(journal: str, path: str, raw: bytes) -> tuple[pb.Fragment, bytes]:
    import hashlib

    from pygazette.protocol.fragment_name import parse_fragment_path, sha1sum_to_hex
    from pygazette.stores import codecs

    frag = parse_fragment_path(journal, path)
    content = codecs.decompress(pb.SNAPPY, raw)
    assert hashlib.sha1(content).hexdigest() == sha1sum_to_hex(frag.sum)
    return frag, content


@pytest.mark.parametrize("bad", ["s3://no-such-bucket/", "s3://b/?endpoint=http://127.0.0.1:1"])
async def test_health_of_broken_stores(
    bad: str, s3_server: S3Server, broker: BrokerProcess
) -> None:
    url = bad if "endpoint" in bad else s3_server.store_url("no-such-bucket")
    async with JournalClient(broker.url) as client:
        resp = await fragment_store_health(client, url)
    assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY
    assert "health check PUT failed" in resp.store_health_error
