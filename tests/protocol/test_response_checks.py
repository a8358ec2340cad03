"""Servers checking their own responses (`ResponseCheckInterceptor`, PYGAZETTE_CHECK_RESPONSES):
a handler answering something that breaks Gazette's rules gets its RPC aborted INTERNAL with
"response failed validation: ...", and the response is never sent; valid responses pass
untouched, over every kind of RPC (unary, server-, client- and bidi-streaming)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import consumer_pb2_grpc as cpb_grpc
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.response_checks import (
    ListCheck,
    ReadCheck,
    ResponseCheckInterceptor,
    response_checks_enabled,
)

J = "a/journal"


def header() -> pb.Header:
    return pb.Header(
        route=pb.Route(primary=-1),
        etcd=pb.Header.Etcd(cluster_id=1, member_id=1, revision=1, raft_term=1),
    )


def fragment(begin: int, end: int) -> pb.Fragment:
    return pb.Fragment(journal=J, begin=begin, end=end, compression_codec=pb.NONE)


def spec(name: str) -> pb.JournalSpec:
    s = pb.JournalSpec(name=name, replication=1)
    s.fragment.length = 1 << 20
    s.fragment.compression_codec = pb.NONE
    s.fragment.refresh_interval.seconds = 60
    return s


def listed(name: str) -> pb.ListResponse.Journal:
    return pb.ListResponse.Journal(spec=spec(name), mod_revision=1, route=pb.Route(primary=-1))


class Scripted(pb_grpc.JournalServicer):  # type: ignore[misc]
    """Answers each RPC with what the test put in `reads`, `appends`, ..."""

    def __init__(self) -> None:
        self.reads: list[pb.ReadResponse] = []
        self.lists: list[pb.ListResponse] = []
        self.append: pb.AppendResponse = pb.AppendResponse()
        self.replicates: list[pb.ReplicateResponse] = []
        self.sent = 0  # Responses the handlers handed over.

    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.ReadResponse]:
        for resp in self.reads:
            self.sent += 1
            yield resp

    async def List(self, request: pb.ListRequest, context: Any) -> AsyncIterator[pb.ListResponse]:
        for resp in self.lists:
            self.sent += 1
            yield resp

    async def Append(self, request_iterator: Any, context: Any) -> pb.AppendResponse:
        async for _ in request_iterator:
            pass
        self.sent += 1
        return self.append

    async def Replicate(
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[pb.ReplicateResponse]:
        async for _ in request_iterator:
            for resp in self.replicates:
                self.sent += 1
                yield resp
            return


class Shards(cpb_grpc.ShardServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.unassign = cpb.UnassignResponse()
        self.stat = cpb.StatResponse()

    async def Unassign(self, request: Any, context: Any) -> cpb.UnassignResponse:
        return self.unassign

    async def Stat(self, request: Any, context: Any) -> cpb.StatResponse:
        return self.stat


@pytest.fixture
async def server() -> AsyncIterator[tuple[Scripted, Shards, ResponseCheckInterceptor, str]]:
    checks = ResponseCheckInterceptor()
    srv = grpc.aio.server(interceptors=[checks])
    journal, shards = Scripted(), Shards()
    pb_grpc.add_JournalServicer_to_server(journal, srv)  # type: ignore[no-untyped-call]
    cpb_grpc.add_ShardServicer_to_server(shards, srv)  # type: ignore[no-untyped-call]
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        yield journal, shards, checks, f"127.0.0.1:{port}"
    finally:
        await srv.stop(None)


async def read_all(address: str, req: pb.ReadRequest) -> list[pb.ReadResponse]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        return [resp async for resp in stub.Read(req)]


async def test_a_read_fragment_past_the_write_head_is_never_sent(
    server: tuple[Scripted, Shards, ResponseCheckInterceptor, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal, _, checks, address = server
    journal.reads = [
        pb.ReadResponse(offset=0, write_head=10, fragment=fragment(0, 10), header=header()),
        pb.ReadResponse(offset=0, content=b"0123456789"),
        # The next fragment runs ahead of the write head: Gazette's client rejects it.
        pb.ReadResponse(offset=10, write_head=15, fragment=fragment(10, 20)),
        pb.ReadResponse(offset=10, content=b"0123456789"),
    ]
    received: list[pb.ReadResponse] = []
    with caplog.at_level(logging.ERROR, logger="pygazette.protocol.response_checks"):
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for resp in stub.Read(pb.ReadRequest(journal=J, block=True)):
                    received.append(resp)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == (
        "response failed validation: ReadResponse: invalid WriteHead (15; expected >= 20)"
    )
    assert [r.offset for r in received] == [0, 0]  # The valid ones, then nothing.
    assert journal.sent == 3  # The handler's fourth response was never asked for.
    assert checks.refused == 1
    (record,) = caplog.records
    assert record.getMessage() == "response failed validation (not sent)"
    assert record.__dict__["method"] == "/protocol.Journal/Read"
    assert "write_head: 15" in record.__dict__["response"]


async def test_a_read_response_behind_the_readers_position_is_refused(
    server: tuple[Scripted, Shards, ResponseCheckInterceptor, str],
) -> None:
    journal, _, _, address = server
    journal.reads = [
        pb.ReadResponse(offset=5, write_head=10, fragment=fragment(0, 10)),
        pb.ReadResponse(offset=5, content=b"abc"),
        pb.ReadResponse(offset=6, content=b"def"),  # Behind 8, where the reader is.
    ]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await read_all(address, pb.ReadRequest(journal=J, offset=5))
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == (
        "response failed validation: ReadResponse: invalid ReadResponse offset (6; expected >= 8)"
    )


async def test_valid_reads_pass_untouched(
    server: tuple[Scripted, Shards, ResponseCheckInterceptor, str],
) -> None:
    journal, _, checks, address = server
    journal.reads = [
        pb.ReadResponse(offset=7, write_head=20, fragment=fragment(0, 10), header=header()),
        pb.ReadResponse(offset=7, content=b"789"),
        pb.ReadResponse(offset=10, write_head=20, fragment=fragment(10, 20)),
        pb.ReadResponse(offset=10, content=b"0123456789"),
        pb.ReadResponse(status=pb.OFFSET_NOT_YET_AVAILABLE, offset=20, write_head=20),
    ]
    assert await read_all(address, pb.ReadRequest(journal=J, offset=3)) == journal.reads
    assert checks.refused == 0


async def test_an_append_commit_without_a_header_gets_internal(
    server: tuple[Scripted, Shards, ResponseCheckInterceptor, str],
) -> None:
    journal, _, _, address = server
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]

        async def requests() -> AsyncIterator[pb.AppendRequest]:
            yield pb.AppendRequest(journal=J)
            yield pb.AppendRequest(content=b"x")
            yield pb.AppendRequest()

        journal.append = pb.AppendResponse(
            status=pb.OK, commit=fragment(0, 1), registers=pb.LabelSet()
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Append(requests())
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert info.value.details() == (
            "response failed validation: AppendResponse: Header.Route: invalid Primary "
            "(0; expected -1 <= Primary < 0)"
        )
        journal.append.header.CopyFrom(header())
        journal.append.ClearField("commit")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Append(requests())
        assert info.value.details() == "response failed validation: AppendResponse: expected Commit"
        journal.append.commit.CopyFrom(fragment(0, 1))
        resp = await stub.Append(requests())
        assert resp.commit.end == 1


async def test_a_replicate_response_with_a_stray_header_gets_internal(
    server: tuple[Scripted, Shards, ResponseCheckInterceptor, str],
) -> None:
    journal, _, _, address = server
    journal.replicates = [pb.ReplicateResponse(status=pb.OK), pb.ReplicateResponse(header=header())]
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Replicate()
        await call.write(pb.ReplicateRequest(proposal=fragment(0, 0), acknowledge=True))
        assert (await call.read()).status == pb.OK
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert "ReplicateResponse: unexpected Header" in (info.value.details() or "")


async def test_list_snapshots_are_checked_whole_then_chunk_by_chunk(
    server: tuple[Scripted, Shards, ResponseCheckInterceptor, str],
) -> None:
    journal, _, _, address = server
    first = pb.ListResponse(status=pb.OK, header=header(), journals=[listed("a/one")])
    more = pb.ListResponse(journals=[listed("a/two")])
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        # A watch: a snapshot in two responses, its end, then the next snapshot.
        journal.lists = [first, more, pb.ListResponse(), first, pb.ListResponse()]
        assert [r async for r in stub.List(pb.ListRequest(watch=True))] == journal.lists
        # A later snapshot must start with its header again.
        journal.lists = [first, pb.ListResponse(), more]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            _ = [r async for r in stub.List(pb.ListRequest(watch=True))]
        assert info.value.details() == (
            "response failed validation: ListResponse: Header.Route: invalid Primary "
            "(0; expected -1 <= Primary < 0)"
        )


async def test_shard_responses_are_checked(
    server: tuple[Scripted, Shards, ResponseCheckInterceptor, str],
) -> None:
    _, shards, _, address = server
    async with grpc.aio.insecure_channel(address) as channel:
        stub = cpb_grpc.ShardStub(channel)  # type: ignore[no-untyped-call]
        # Gazette's own consumers answer a failed transaction so: a status, not a fault.
        shards.unassign = cpb.UnassignResponse(status=cpb.ETCD_TRANSACTION_FAILED)
        resp = await stub.Unassign(cpb.UnassignRequest(shards=["shard-1"]))
        assert resp.status == cpb.ETCD_TRANSACTION_FAILED
        shards.unassign = cpb.UnassignResponse(status=4242)  # type: ignore[arg-type]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Unassign(cpb.UnassignRequest(shards=["shard-1"]))
        assert info.value.details() == (
            "response failed validation: UnassignResponse: Status: invalid status (4242)"
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Stat(cpb.StatRequest(shard="shard-1"))  # No header.
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert "StatResponse: Header" in (info.value.details() or "")


@pytest.mark.parametrize(
    ("value", "enabled"),
    [("1", True), ("true", True), ("yes", True), ("", False), ("0", False), ("no", False)],
)
def test_the_environment_variable_switches_it_on(value: str, enabled: bool) -> None:
    assert response_checks_enabled({"PYGAZETTE_CHECK_RESPONSES": value}) is enabled
    assert response_checks_enabled({}) is False


# Properties of the stream checks ------------------------------------------------------------


@given(
    begin=st.integers(0, 1 << 40),
    length=st.integers(1, 1 << 20),
    into=st.integers(0, 1 << 20),
    head_delta=st.integers(-(1 << 20), 1 << 20),
)
def test_a_read_metadata_response_is_valid_iff_its_fragment_is_within_the_write_head(
    begin: int, length: int, into: int, head_delta: int
) -> None:
    end = begin + length
    offset = begin + min(into, length - 1)
    write_head = max(0, end + head_delta)
    resp = pb.ReadResponse(offset=offset, write_head=write_head, fragment=fragment(begin, end))
    check = ReadCheck(pb.ReadRequest(journal=J, offset=begin))
    if write_head >= end:
        check.check(resp)
        assert check.position == offset
    else:
        with pytest.raises(ValidationError, match=r"invalid WriteHead"):
            check.check(resp)


@given(chunks=st.lists(st.integers(1, 100), min_size=1, max_size=20), back=st.integers(1, 50))
def test_read_content_must_follow_the_readers_position(chunks: list[int], back: int) -> None:
    check = ReadCheck(pb.ReadRequest(journal=J, offset=-1))
    total = sum(chunks)
    check.check(pb.ReadResponse(offset=0, write_head=total, fragment=fragment(0, total)))
    offset = 0
    for n in chunks:
        check.check(pb.ReadResponse(offset=offset, content=b"x" * n))
        offset += n
    assert check.position == total
    behind = pb.ReadResponse(offset=max(0, total - back), content=b"y")
    with pytest.raises(ValidationError, match="invalid ReadResponse offset"):
        check.check(behind)


@given(sizes=st.lists(st.integers(0, 4), min_size=1, max_size=6))
def test_list_watch_snapshots_of_any_size_pass(sizes: list[int]) -> None:
    check = ListCheck(pb.ListRequest(watch=True))
    for i, size in enumerate(sizes):
        names = [f"a/j-{i}-{k}" for k in range(size)]
        check.check(pb.ListResponse(header=header(), journals=[listed(n) for n in names[:1]]))
        for name in names[1:]:
            check.check(pb.ListResponse(journals=[listed(name)]))
        check.check(pb.ListResponse())  # The snapshot's end.
    assert check.first


def test_zero_valued_headers_of_continuations_pass() -> None:
    """Gazette encodes its non-nullable Header in every ListResponse: a watch snapshot's
    continuations and end carry a zero-valued one (as the broker's `_list_chunk` does). Gazette's
    stream-sum chunker (a WatchedList) got 'unexpected Header' aborts from checking brokers."""

    def continuation(*journals: pb.ListResponse.Journal) -> pb.ListResponse:
        resp = pb.ListResponse(journals=journals)
        resp.header.process_id.SetInParent()
        resp.header.route.SetInParent()
        resp.header.etcd.SetInParent()
        return resp

    check = ListCheck(pb.ListRequest(watch=True))
    for _ in range(2):
        check.check(pb.ListResponse(header=header(), journals=[listed("a/one")]))
        check.check(continuation(listed("a/two")))
        check.check(continuation())  # The snapshot's end.
    assert check.first


def test_a_header_within_a_snapshot_is_refused() -> None:
    check = ListCheck(pb.ListRequest())
    check.check(pb.ListResponse(header=header()))
    with pytest.raises(ValidationError, match="unexpected Header or Status within a snapshot"):
        check.check(pb.ListResponse(header=header(), journals=[listed("a/two")]))
