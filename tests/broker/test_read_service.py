"""The Read RPC over persisted fragments that go away while a read runs (retention by another
broker, or by hand), against a broker in the test's process (its replica's listings
observable)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from pygazette.broker import read_service
from pygazette.broker.server import Broker, BrokerConfig
from pygazette.protocol.fragment_name import fragment_content_path
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.fragment_helpers import wait_persisted
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all


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
        pread = read_service._pread_file

        def pread_then_retention(path: object, pos: int, n: int) -> bytes:
            data = pread(path, pos, n)
            for f in removals.pop(str(path), []):
                f.unlink()
            return data

        monkeypatch.setattr(read_service, "_pread_file", pread_then_retention)
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
