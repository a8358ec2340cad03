"""A journal whose spec names no fragment store: closed spools are never persisted, but every
acknowledged append stays readable where it is — across spool rolls and a broker restart —
and is persisted once the spec names a store (as Gazette keeps such fragments in its index)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc.aio

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all
from tests.support.broker_process import BrokerProcess

JOURNAL = "no-stores/one"


async def _appends(stub: pb_grpc.JournalStub, records: list[bytes]) -> list[tuple[int, int]]:
    spans = []
    for record in records:
        resp = await append(stub, JOURNAL, record)
        assert resp.status == pb.OK
        spans.append((resp.commit.begin, resp.commit.end))
    return spans


async def test_acknowledged_appends_stay_readable_and_persist_once_a_store_is_named(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            # Small fragments: the spool rolls after the first append and every ~100 bytes.
            spec = journal_spec(JOURNAL, length=1024, stores=())
            assert (await apply_specs(stub, spec)).status == pb.OK
            records = [b'{"n":%d}\n' % i for i in range(300)]
            spans = await _appends(stub, records)
            # The write head only moves forward: each append begins where the last ended.
            ends = [0] + [end for _, end in spans]
            assert [begin for begin, _ in spans] == ends[:-1]
            assert (await read_all(stub, JOURNAL))[0] == b"".join(records)

        broker.kill()
        broker.start()  # The spools on disk are recovered, not dropped.
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            assert (await read_all(stub, JOURNAL))[0] == b"".join(records)
            more = await _appends(stub, [b'{"n":"after"}\n'])
            assert more[0][0] == ends[-1]

            listed = await stub.List(pb.ListRequest()).read()
            (entry,) = listed.journals
            with_store = journal_spec(JOURNAL, length=1024)
            req = pb.ApplyRequest(
                changes=[
                    pb.ApplyRequest.Change(
                        upsert=with_store, expect_mod_revision=entry.mod_revision
                    )
                ]
            )
            assert (await stub.Apply(req)).status == pb.OK
            # The kept spools are persisted to the new store: every fragment but the open
            # spool's (the newest).
            for _ in range(600):
                resp = await stub.ListFragments(pb.FragmentsRequest(journal=JOURNAL))
                frags = sorted((f.spec for f in resp.fragments), key=lambda f: f.begin)
                if len(frags) > 1 and all(f.backing_store for f in frags[:-1]):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the kept spools were not persisted")
            assert (await read_all(stub, JOURNAL))[0] == b"".join(records) + b'{"n":"after"}\n'
    finally:
        broker.kill()
