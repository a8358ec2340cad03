"""Full disk: a broker whose data directory is a small tmpfs that fills up.

Appends are refused with RESOURCE_EXHAUSTED and an "insufficient storage" message, never in
part: the journal holds exactly the acknowledged appends, reads keep working, the broker
takes appends again by itself once space is freed, and a restart on the data directory
recovers everything acknowledged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.support.broker_process import BrokerProcess
from tests.support.small_fs import SmallFs, mounted_tmpfs

JOURNAL = "disk/full"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[SmallFs]:
    with mounted_tmpfs(tmp_path / "data", size="8m") as fs:
        yield fs


def _spec() -> pb.JournalSpec:
    spec = pb.JournalSpec(name=JOURNAL, replication=1)
    spec.labels.labels.add(name="app", value="full-disk")
    spec.fragment.length = 1 << 30  # The spool never rolls: it is what fills the disk.
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 60
    return spec


def _append(stub: pb_grpc.JournalStub, data: bytes, chunk: int = 64 * 1024) -> pb.AppendResponse:
    def requests() -> Iterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=JOURNAL)
        for i in range(0, len(data), chunk):
            yield pb.AppendRequest(content=data[i : i + chunk])
        yield pb.AppendRequest()

    resp: pb.AppendResponse = stub.Append(requests(), timeout=10)
    return resp


def _read_all(stub: pb_grpc.JournalStub) -> tuple[bytes, int]:
    out = bytearray()
    head = 0
    for resp in stub.Read(pb.ReadRequest(journal=JOURNAL, offset=0, block=False), timeout=10):
        if resp.content:
            assert resp.offset == len(out)
            out += resp.content
        else:
            head = resp.write_head
            if resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
                break
            assert resp.status == pb.OK, pb.Status.Name(resp.status)
    return bytes(out), head


def _record(seq: int, size: int) -> bytes:
    head = f"{seq:06d}:".encode()
    return head + b"x" * (size - len(head) - 1) + b"\n"


@pytest.mark.parametrize("size", [48 * 1024, 320 * 1024], ids=["small-appends", "prefaulted"])
def test_full_spool_disk_refuses_appends_whole_and_recovers(
    tmp_path: Path, small_fs: SmallFs, size: int
) -> None:
    broker = BrokerProcess(small_fs.root, extra_args=["--file-root", str(tmp_path / "store")])
    broker.start()
    try:
        with grpc.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            applied = stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=_spec())]))
            assert applied.status == pb.OK
            small_fs.fill(leave=2 << 20)

            acked: list[bytes] = []
            refusal: grpc.RpcError | None = None
            for seq in range(200):
                data = _record(seq, size)
                try:
                    resp = _append(stub, data)
                except grpc.RpcError as exc:
                    refusal = exc
                    break
                assert resp.status == pb.OK, pb.Status.Name(resp.status)
                assert resp.commit.begin == sum(map(len, acked))
                acked.append(data)
            assert refusal is not None, "the disk never filled"
            assert acked, "no append fit before the disk filled"
            assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refusal
            assert "insufficient storage" in (refusal.details() or "")

            # Refused again while full, and reads keep serving exactly what was acknowledged.
            for seq in range(3):
                with pytest.raises(grpc.RpcError) as refused:
                    _append(stub, _record(1000 + seq, size))
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            content, head = _read_all(stub)
            assert content == b"".join(acked)
            assert head == len(content)

            # Space is freed: the broker takes appends again, at the head it reported.
            small_fs.free()
            for seq in range(3):
                data = _record(2000 + seq, size)
                resp = _append(stub, data)
                assert resp.status == pb.OK
                assert resp.commit.begin == sum(map(len, acked))
                acked.append(data)
            assert _read_all(stub)[0] == b"".join(acked)

        # Full again, then a crash: a restart recovers every acknowledged append.
        small_fs.fill(leave=0)
        with grpc.insecure_channel(broker.address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                _append(pb_grpc.JournalStub(channel), _record(3000, size))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        broker.kill()
        small_fs.free()
        broker.start()
        with grpc.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            content, head = _read_all(stub)
            assert content == b"".join(acked)
            assert head == len(content)
            resp = _append(stub, _record(4000, size))
            assert resp.status == pb.OK and resp.commit.begin == head
    finally:
        broker.stop()
