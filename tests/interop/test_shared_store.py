"""pygazette and Gazette brokers sharing one file store: each reads what the other persisted.

Both brokers serve the same journals from the same `file://` root. Journals written through
one broker are read through the other once their fragments are persisted (the reader learns
of them from its periodic store listing), with the same fragment names, sums and content.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pygazette.client import JournalClient, append, apply_journals, list_all_fragments
from pygazette.client.reader import Reader
from pygazette.protocol.errors import IndexHasGreaterOffset, OffsetNotYetAvailable
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.interop.scenario import record_content
from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import EtcdServer, GazetteBinaries, GazetteBroker

CODECS = {"none": pb.NONE, "snappy": pb.SNAPPY, "gzip": pb.GZIP}
SIZES = [300, 2000, 1500, 700, 100]  # Rolls several fragments; the last stays open.
WAIT_SECONDS = 60.0


def spec(name: str, codec: int) -> pb.JournalSpec:
    out = pb.JournalSpec(name=name, replication=1)
    out.fragment.length = 1024
    out.fragment.compression_codec = codec  # type: ignore[assignment]
    out.fragment.stores.append("file:///")
    out.fragment.refresh_interval.seconds = 1
    return out


@pytest.fixture
def shared_root(tmp_path: Path) -> Path:
    root = tmp_path / "shared-store"
    root.mkdir()
    return root


@pytest.fixture
def gazette_shared(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path, shared_root: Path
) -> Iterator[GazetteBroker]:
    broker = GazetteBroker(binaries.gazette, etcd, tmp_path / "gazette", file_root=shared_root)
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


@pytest.fixture
def pygazette_shared(tmp_path: Path, shared_root: Path) -> Iterator[BrokerProcess]:
    (tmp_path / "pygazette").mkdir()
    broker = BrokerProcess(
        tmp_path / "pygazette" / "data", extra_args=["--file-root", str(shared_root)]
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


async def read_all(client: JournalClient, journal: str) -> bytes:
    """Non-blocking read from 0 to the write head, through one Read RPC per fragment."""
    out = b""
    offset = 0
    while True:
        reader = Reader(client, journal, offset=offset)
        try:
            async for chunk in reader:
                out += chunk
        except OffsetNotYetAvailable:
            return out
        finally:
            await reader.aclose()
        offset = reader.offset


async def wait_for(what: str, check: object) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not await check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.1)


async def persisted(client: JournalClient, journal: str) -> list[pb.Fragment]:
    return [f.spec for f in await list_all_fragments(client, journal) if f.spec.backing_store]


async def write_and_persist(client: JournalClient, journal: str) -> tuple[bytes, int]:
    """Append SIZES; returns the content and the end of its persisted fragments."""
    content = b""
    for n, size in enumerate(SIZES):
        data = record_content(journal, n, size)
        await append(client, journal, data)
        content += data
    frags = await list_all_fragments(client, journal)
    rolled = len(frags) - 1  # All but the open spool.

    async def all_persisted() -> bool:
        return len(await persisted(client, journal)) >= rolled

    await wait_for(f"{journal} persisted", all_persisted)
    return content, (await persisted(client, journal))[-1].end


async def wait_assigned(client: JournalClient, names: list[str]) -> None:
    async def assigned() -> bool:
        routes = {
            j.spec.name: j.route.primary
            async for r in client.rpc_list(pb.ListRequest())
            for j in r.journals
        }
        return all(routes.get(n, -1) >= 0 for n in names)

    await wait_for("journals assigned", assigned)


def test_each_broker_reads_what_the_other_persisted(
    pygazette_shared: BrokerProcess, gazette_shared: GazetteBroker, shared_root: Path
) -> None:
    from_py = {f"shared/from-pygazette/{c}": codec for c, codec in CODECS.items()}
    from_go = {f"shared/from-gazette/{c}": codec for c, codec in CODECS.items()}
    specs = [spec(n, c) for n, c in {**from_py, **from_go}.items()]

    async def run() -> None:
        async with (
            JournalClient(pygazette_shared.url) as py,
            JournalClient(gazette_shared.url) as go,
        ):
            changes = [pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs]
            await apply_journals(py, changes)
            await apply_journals(go, changes)
            await wait_assigned(go, [s.name for s in specs])

            written = {}
            for journal in from_py:
                written[journal] = await write_and_persist(py, journal)
            for journal in from_go:
                written[journal] = await write_and_persist(go, journal)

            for journal, (content, end) in written.items():
                writer, reader = (py, go) if journal in from_py else (go, py)

                async def caught_up(reader: JournalClient = reader, journal: str = journal) -> bool:
                    return len(await read_all(reader, journal)) >= end  # noqa: B023

                await wait_for(f"{journal} readable through the other broker", caught_up)
                assert await read_all(reader, journal) == content[:end], journal
                # Both list the same persisted fragments: names, sums, codecs.
                assert await persisted(reader, journal) == await persisted(writer, journal)

            # Gazette continues a journal pygazette wrote: it first refuses an append at an
            # unknown offset (its spool is behind the index), then accepts one at the end of
            # what it read.
            journal = "shared/from-pygazette/none"
            content, end = written[journal]
            with pytest.raises(IndexHasGreaterOffset):
                await append(go, journal, b"refused\n")
            resp = await append(go, journal, b"continued by gazette\n", offset=end)
            assert resp.commit.begin == end

            # pygazette continues a journal Gazette wrote, at the end of its persisted
            # fragments (it keeps spools across restarts, so a journal it holds no spool
            # of has nothing unpersisted: README).
            journal = "shared/from-gazette/snappy"
            content, end = written[journal]
            resp = await append(py, journal, b"continued by pygazette\n")
            assert resp.commit.begin == end

    asyncio.run(run())
    # Both wrote under one root, with the same layout.
    assert sorted(p.name for p in (shared_root / "shared").iterdir()) == [
        "from-gazette",
        "from-pygazette",
    ]
