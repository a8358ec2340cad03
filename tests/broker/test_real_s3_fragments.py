"""Journals of a real `pygazette serve` on a real S3 server process (versitygw, built from the
Go module proxy): persisting fragments, listing them, presigned URLs the server verifies and
direct (`do_not_proxy`) reads, retention (the broker's timer and `journals prune`) removing
expired fragments, and the server dying under a broker (appends refused past the spool
backlog, store health reporting it; the broker crashing meanwhile) and coming back (the
spools persist, health recovers, nothing acknowledged is lost)."""

from __future__ import annotations

import asyncio
import gzip
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pygazette.client.journal_client import JournalClient
from pygazette.client.reader import Reader
from pygazette.client.retry_reader import read_journal
from pygazette.client.store_health import fragment_store_health
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.fragment_helpers import (
    assemble,
    check_fragment_file,
    list_fragments,
    wait_persisted,
)
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all
from tests.cli.test_journals_cli import cli, ok
from tests.support.broker_process import BrokerProcess
from tests.support.s3_real_server import RealS3Server, running_real_s3


@pytest.fixture(scope="module")
def real_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealS3Server]:
    with running_real_s3(tmp_path_factory.mktemp("real-s3")) as server:
        yield server


def _broker(tmp_path: Path, s3: RealS3Server, *args: str) -> BrokerProcess:
    """A broker holding the server's credentials in its environment (and only it)."""
    return BrokerProcess(tmp_path / "data", extra_args=list(args), env=s3.env())


def _lines(n: int, tag: str) -> bytes:
    return b"".join(f'{{"{tag}": {i}, "pad": "{"p" * (i % 50)}"}}\n'.encode() for i in range(n))


def _fragments_in_bucket(
    s3: RealS3Server, bucket: str, prefix: str
) -> list[tuple[pb.Fragment, bytes]]:
    """Every fragment object under `prefix`, fetched over S3, decompressed and SHA-1 checked
    with the codec's standard tool."""
    out = []
    for key in s3.object_keys(bucket, prefix):
        raw, _ = s3.get_object(bucket, key)
        journal = prefix.rstrip("/")
        out.append(check_fragment_file(journal, key[len(prefix) :], raw))
    return out


def _http_get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code


async def test_persist_list_and_read_directly(real_s3: RealS3Server, tmp_path: Path) -> None:
    bucket = real_s3.create_bucket()
    store = real_s3.store_url(bucket, "gazette/fragments")
    codecs_by_journal = {
        "real-s3/none": pb.NONE,
        "real-s3/gzip": pb.GZIP,
        "real-s3/zstd": pb.ZSTANDARD,
        "real-s3/gzip-offload": pb.GZIP_OFFLOAD_DECOMPRESSION,
    }
    broker = _broker(tmp_path, real_s3, "--retention-interval", "0s")
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
            # Persisted while the broker runs (fragments roll past 8 KiB), and listed.
            for name, data in sent.items():
                full = len(data) - len(data) % 8192
                await wait_persisted(stub, name, full - 8192)
        broker.stop()  # Persists the open spools: everything is in the bucket now.

        for name, codec in codecs_by_journal.items():
            prefix = f"gazette/fragments/{name}/"
            found = _fragments_in_bucket(real_s3, bucket, prefix)
            assert len(found) > 1, name
            assert assemble(found) == sent[name], name
            if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
                for key in real_s3.object_keys(bucket, prefix):
                    raw, encoding = real_s3.get_object(bucket, key)
                    assert encoding == "gzip" and gzip.decompress(raw), key

        broker.start()  # No spools left: reads are served from the store's listing.
        async with JournalClient(broker.url) as client:
            stub = pb_grpc.JournalStub(client.channel)
            for name in codecs_by_journal:
                listed = await list_fragments(stub, name)
                assert all(f.backing_store == store and f.mod_time for f in listed), name
                content, meta = await read_all(stub, name)
                assert content == sent[name], name
                urls = [m.fragment_url for m in meta if m.status == pb.OK and m.fragment_url]
                assert urls and all(u.startswith(f"{real_s3.endpoint}/{bucket}/") for u in urls)
                # The broker's presigned URLs pass the server's signature check.
                assert await asyncio.to_thread(_http_get, urls[0]) == 200
                # do_not_proxy: the client reads each fragment from its presigned URL.
                async with Reader(client, name, do_not_proxy=True) as reader:
                    first = await reader.read()
                    assert "X-Amz-Signature=" in reader.fragment_url
                    assert reader.direct is not None
                direct = b"".join([c async for c in read_journal(client, name, do_not_proxy=True)])
                assert first and direct == sent[name], name

        out = ok(
            cli(broker.url, "journals", "fragments", "-l", "name=real-s3/zstd", "--url-ttl", "5m")
        ).decode()
        assert f"{real_s3.endpoint}/{bucket}/gazette/fragments/real-s3/zstd/" in out
        assert "X-Amz-Expires=300" in out
    finally:
        broker.kill()


def _age(s3: RealS3Server, bucket: str, key: str, seconds: float) -> None:
    """Make an object older: the posix backend reports its file's mtime as LastModified."""
    t = time.time() - seconds
    os.utime(s3.object_file(bucket, key), (t, t))


async def test_retention_removes_expired_fragments(real_s3: RealS3Server, tmp_path: Path) -> None:
    bucket = real_s3.create_bucket()
    store = real_s3.store_url(bucket)
    name = "real-s3/retained"
    broker = _broker(tmp_path, real_s3, "--retention-interval", "1s")
    broker.start()
    size = 1025
    try:
        async with JournalClient(broker.url) as client:
            stub = pb_grpc.JournalStub(client.channel)
            spec = journal_spec(name, length=1024, stores=[store])
            spec.fragment.retention.seconds = 3600
            spec.fragment.refresh_interval.seconds = 1
            assert (await apply_specs(stub, spec)).status == pb.OK
            for i in range(4):  # Each append overfills a fragment, which rolls and persists.
                assert (await append(stub, name, bytes([65 + i]) * size)).status == pb.OK
            await wait_persisted(stub, name, 4 * size)
            keys = real_s3.object_keys(bucket, f"{name}/")
            assert len(keys) == 4
            # Young fragments stay, however often retention runs.
            await asyncio.sleep(2.5)
            assert real_s3.object_keys(bucket, f"{name}/") == keys

            for key in keys[:2]:
                _age(real_s3, bucket, key, 7200)
            deadline = time.monotonic() + 30
            while real_s3.object_keys(bucket, f"{name}/") != keys[2:]:
                assert time.monotonic() < deadline, real_s3.object_keys(bucket, f"{name}/")
                await asyncio.sleep(0.1)

            # Everything expired: the fragment holding the write head stays.
            for key in keys[2:]:
                _age(real_s3, bucket, key, 7200)
            deadline = time.monotonic() + 30
            while real_s3.object_keys(bucket, f"{name}/") != keys[3:]:
                assert time.monotonic() < deadline, real_s3.object_keys(bucket, f"{name}/")
                await asyncio.sleep(0.1)
            await asyncio.sleep(2.5)  # A few more rounds of retention: the head survives them.
            assert real_s3.object_keys(bucket, f"{name}/") == keys[3:]

            # Once the broker's index is refreshed, a read from 0 starts at the head fragment.
            deadline = time.monotonic() + 30
            while len(await list_fragments(stub, name)) != 1:
                assert time.monotonic() < deadline, await list_fragments(stub, name)
                await asyncio.sleep(0.1)
            content, meta = await read_all(stub, name)
            assert meta[0].offset == 3 * size and content == b"D" * size
            resp = await append(stub, name, b"E")  # The write head did not move.
            assert resp.commit.begin == 4 * size
    finally:
        broker.kill()


async def test_prune_on_demand(real_s3: RealS3Server, tmp_path: Path) -> None:
    bucket = real_s3.create_bucket()
    store = real_s3.store_url(bucket, "pruned")
    name = "real-s3/pruned"
    broker = _broker(tmp_path, real_s3, "--retention-interval", "0s")
    broker.start()
    try:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            spec = journal_spec(name, length=1024, stores=[store])
            spec.fragment.retention.seconds = 3600
            assert (await apply_specs(stub, spec)).status == pb.OK
            for i in range(3):
                assert (await append(stub, name, bytes([65 + i]) * 1025)).status == pb.OK
            await wait_persisted(stub, name, 3 * 1025)
        keys = real_s3.object_keys(bucket, f"pruned/{name}/")
        assert len(keys) == 3
        for key in keys[:2]:
            _age(real_s3, bucket, key, 7200)

        out = ok(cli(broker.url, "journals", "prune", "-l", f"name={name}", "--dry-run")).decode()
        assert "would remove 2 fragment(s)" in out
        for key in keys[:2]:
            assert f"{store.split('?')[0]}{key[len('pruned/') :]}" in out
        assert real_s3.object_keys(bucket, f"pruned/{name}/") == keys

        out = ok(cli(broker.url, "journals", "prune", "-l", f"name={name}")).decode()
        assert "removed 2 fragment(s)" in out
        assert real_s3.object_keys(bucket, f"pruned/{name}/") == keys[2:]
    finally:
        broker.kill()


async def _append_record(
    stub: pb_grpc.JournalStub, journal: str, n: int
) -> tuple[bytes, pb.AppendResponse]:
    data = f"record {n:05d} ".encode() + b"." * 1000 + b"\n"
    return data, await append(stub, journal, data)


async def test_server_outage_and_recovery(tmp_path: Path) -> None:
    # A server of this test's own: it is killed and restarted on the same port and data.
    with running_real_s3(tmp_path / "s3") as s3:
        bucket = s3.create_bucket()
        store = s3.store_url(bucket)
        journal = "real-s3/outage"
        limit = 16 * 1024
        broker = _broker(
            tmp_path, s3, "--spool-backlog-limit", str(limit), "--retention-interval", "0s"
        )
        broker.start()
        acked: list[tuple[int, bytes]] = []
        n = 0
        try:
            async with JournalClient(broker.url) as client:
                stub = pb_grpc.JournalStub(client.channel)
                spec = journal_spec(journal, codec=pb.GZIP, length=1024, stores=[store])
                assert (await apply_specs(stub, spec)).status == pb.OK
                assert (await fragment_store_health(client, store)).status == pb.OK
                data, resp = await _append_record(stub, journal, n)
                assert resp.status == pb.OK
                acked.append((resp.commit.begin, data))
                await wait_persisted(stub, journal, len(data))

                s3.kill()
                # Appends go on while closed spools queue locally, up to the bound...
                refused = None
                for _ in range(200):
                    n += 1
                    data, resp = await _append_record(stub, journal, n)
                    if resp.status != pb.OK:
                        refused = resp
                        break
                    acked.append((resp.commit.begin, data))
                assert refused is not None, "appends were never refused"
                # ...then they are refused with Gazette's status and the store's error.
                assert refused.status == pb.FRAGMENT_STORE_UNHEALTHY, refused
                assert store in refused.store_health_error
                assert f"limit {limit}" in refused.store_health_error
                deadline = time.monotonic() + 30
                while (health := await fragment_store_health(client, store)).status == pb.OK:
                    assert time.monotonic() < deadline, "store still reported healthy"
                    await asyncio.sleep(0.1)
                assert health.status == pb.FRAGMENT_STORE_UNHEALTHY
                assert health.store_health_error
                # What was acknowledged since stays readable, from the spools.
                end = acked[-1][0] + len(acked[-1][1])
                content, _ = await read_all(stub, journal, offset=acked[1][0], end_offset=end)
                assert content == b"".join(d for _, d in acked[1:])

            # The broker crashes too, while its spools wait for the store: they are
            # recovered from disk, still count against the bound, and are still readable.
            broker.kill()
            broker.start()
            async with JournalClient(broker.url) as client:
                stub = pb_grpc.JournalStub(client.channel)
                n += 1
                data, resp = await _append_record(stub, journal, n)
                assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY, resp
                content, _ = await read_all(stub, journal, offset=acked[1][0], end_offset=end)
                assert content == b"".join(d for _, d in acked[1:])

                s3.start()  # Same port, same objects.
                deadline = time.monotonic() + 60
                while True:  # Appends resume once the backlog drains into the store.
                    n += 1
                    data, resp = await _append_record(stub, journal, n)
                    if resp.status == pb.OK:
                        acked.append((resp.commit.begin, data))
                        break
                    assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY, resp
                    assert time.monotonic() < deadline, resp.store_health_error
                    await asyncio.sleep(0.1)
                await wait_persisted(stub, journal, acked[-1][0])
                deadline = time.monotonic() + 15
                while (await fragment_store_health(client, store)).status != pb.OK:
                    assert time.monotonic() < deadline, "store still reported unhealthy"
                    await asyncio.sleep(0.1)
            broker.stop()

            assert [b for b, _ in acked] == sorted(b for b, _ in acked)
            expected = b"".join(d for _, d in acked)
            found = _fragments_in_bucket(s3, bucket, f"{journal}/")
            # Every acknowledged byte is in the bucket, contiguously (refused appends are not).
            assert assemble(found) == expected
        except BaseException:
            print(broker.log())
            raise
        finally:
            broker.kill()
