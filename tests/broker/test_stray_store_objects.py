"""Objects of a fragment store that are not fragments, beside a journal's fragments, against a
real broker: on the file system and on a real S3 server (versitygw). Gazette's listing skips
and logs each (WalkAllStores); so does pygazette's, logging and counting each once, while
every fragment stays listed and readable. One such object used to fail the whole listing, so
that no fragment of the journal was listed or readable: a name that is not UTF-8 or a symbolic
link loop on the file system; on S3, a key that obstore refuses as a path (a control
character), which failed obstore's whole listing."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.fragment_helpers import list_fragments
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all
from tests.support.broker_process import BrokerProcess
from tests.support.http_scrape import scrape, value, wait_status
from tests.support.ports import free_port
from tests.support.s3_real_server import RealS3Server, running_real_s3

JOURNAL = "stray/journal"
SKIPPED = "pygazette_store_listing_skipped_objects_total"
RECORDS = [f"{i:03d} {'x' * 596}\n".encode() for i in range(5)]  # 601 bytes each.
FRAGMENT_NAME = f"{0:016x}-{601:016x}-{'ab' * 20}.raw"  # A name of a fragment (not here).


@pytest.fixture(scope="module")
def real_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealS3Server]:
    with running_real_s3(tmp_path_factory.mktemp("real-s3")) as server:
        yield server


def _broker(tmp_path: Path, env: dict[str, str] | None = None) -> tuple[BrokerProcess, str]:
    http_port = free_port()
    proc = BrokerProcess(
        tmp_path / "data",
        extra_args=["--http-port", str(http_port), "--retention-interval", "0s"],
        env=env,
    )
    return proc, f"http://127.0.0.1:{http_port}"


async def _wait_skipped(base: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while (seen := value(await asyncio.to_thread(scrape, base), SKIPPED)) != count:
        assert seen < count, f"{seen} objects counted as skipped, {count} expected"
        assert time.monotonic() < deadline, f"{seen} objects counted as skipped, not {count}"
        await asyncio.sleep(0.05)


def _skip_lines(broker: BrokerProcess) -> int:
    text = broker.log_path.read_text(errors="replace")
    return text.count("skipping an object of the fragment store that is not a fragment")


async def _check(
    tmp_path: Path,
    store: str,
    put_strays: Callable[[], int],
    put_another: Callable[[], None],
    env: dict[str, str] | None = None,
) -> None:
    broker, base = _broker(tmp_path, env)
    broker.start()
    try:
        wait_status(base + "/debug/ready")
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            spec = journal_spec(JOURNAL, length=1024, stores=[store])
            spec.fragment.refresh_interval.FromSeconds(1)
            assert (await apply_specs(stub, spec)).status == pb.OK
            for record in RECORDS:
                assert (await append(stub, JOURNAL, record)).status == pb.OK
        broker.stop()  # Its spools are persisted: the journal's content is in the store.

        strays = put_strays()
        broker.start()
        wait_status(base + "/debug/ready")
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            # Listed from the store, beside the strays, and read from it.
            listed = await list_fragments(stub, JOURNAL)
            assert [(f.begin, f.end) for f in listed] == [(0, 601), (601, 1803), (1803, 3005)]
            assert all(f.backing_store == store for f in listed), listed
            content, _ = await read_all(stub, JOURNAL)
            assert content == b"".join(RECORDS)
            await _wait_skipped(base, strays)
            assert _skip_lines(broker) == strays

            # Listings go on (every second): only a stray they had not found before is logged
            # and counted again, once.
            put_another()
            await _wait_skipped(base, strays + 1)
            assert _skip_lines(broker) == strays + 1
            assert len(await list_fragments(stub, JOURNAL)) == 3
    finally:
        broker.kill()


async def test_strays_in_a_file_store(tmp_path: Path) -> None:
    top = tmp_path / "data" / "fragments" / JOURNAL

    def put_strays() -> int:
        (top / "notes.txt").write_text("not a fragment")
        # A directory whose name is not UTF-8, holding what is named as a fragment.
        odd = os.fsencode(top) + b"/date=\xff"
        os.mkdir(odd)
        with open(odd + b"/" + FRAGMENT_NAME.encode(), "wb") as f:
            f.write(b"x" * 601)
        os.symlink("loop", top / "loop")  # A link to itself: stat() fails with ELOOP.
        return 3

    await _check(tmp_path, "file:///", put_strays, lambda: (top / "later.txt").write_text("x"))


async def test_strays_in_an_s3_store(real_s3: RealS3Server, tmp_path: Path) -> None:
    bucket = real_s3.create_bucket()
    store = real_s3.store_url(bucket, "gazette")
    client = real_s3.client()
    prefix = f"gazette/{JOURNAL}/"

    def put_strays() -> int:
        # Keys obstore refuses as paths (each failed its whole listing), and a plain one.
        for key in ["notes.txt", "tab\there", f"del\x7f/{FRAGMENT_NAME}"]:
            client.put_object(Bucket=bucket, Key=prefix + key, Body=b"x")
        return 3

    def put_another() -> None:
        client.put_object(Bucket=bucket, Key=prefix + "later\r", Body=b"x")

    await _check(tmp_path, store, put_strays, put_another, env=real_s3.env())
