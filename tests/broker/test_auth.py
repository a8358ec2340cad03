"""Authorization on a real `pygazette serve --auth-keys` broker (single-node).

Every RPC is refused without its capability and allowed with it; bad tokens are refused
before anything happens; `AA==` lets token-less requests through; a token's selector limits
the journals it reaches; and the client library signs its RPCs from the same keys.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import jwt
import pytest

from pygazette.auth import rpc_claims
from pygazette.auth.authorizer import BearerAuth
from pygazette.auth.capability import Capability
from pygazette.auth.claims import Claims, label_selector
from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.client import JournalClient, Reader, RetryReader, append, list_all
from pygazette.client.retention import prune_journal
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.pb import retention_pb2 as rpb
from pygazette.protocol.stream_write import send_all
from tests.broker.rpc_helpers import journal_spec
from tests.support.broker_process import BrokerProcess

SECRET = b"broker-auth-test-key".ljust(32, b"k")
KEYS = base64.b64encode(SECRET).decode()
OTHER_KEYS = base64.b64encode(b"some-other-key".ljust(32, b"o")).decode()
SIGNER = KeyedAuth(KEYS)

Metadata = tuple[tuple[str, str], ...]


def token(cap: int, sel: pb.LabelSelector | None = None, *, auth: KeyedAuth = SIGNER) -> Metadata:
    return (("authorization", "Bearer " + auth.sign(Claims(cap, sel or pb.LabelSelector()))),)


ALL = token(Capability.ALL)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("auth-broker")
    proc = BrokerProcess(root / "data", extra_args=["--auth-keys", f"{KEYS}, {OTHER_KEYS}"])
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def stub(broker: BrokerProcess) -> Any:
    channel = grpc.aio.insecure_channel(broker.address)
    stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
    specs = [
        journal_spec("auth/a", labels={"app": "a"}),
        journal_spec("auth/b", labels={"app": "b"}),
    ]
    resp = await stub.Apply(
        pb.ApplyRequest(
            changes=[pb.ApplyRequest.Change(upsert=s, expect_mod_revision=-1) for s in specs]
        ),
        metadata=ALL,
    )
    assert resp.status == pb.OK
    yield stub
    await channel.close()


async def _append(stub: Any, journal: str, data: bytes, md: Metadata) -> pb.AppendResponse:
    async def reqs() -> Any:
        yield pb.AppendRequest(journal=journal)
        yield pb.AppendRequest(content=data)
        yield pb.AppendRequest()

    # Written as pygazette's clients write: a broker refusing the append (no token, say)
    # ends the stream while we write, and grpc.aio's own request-iterator writer may then
    # report INTERNAL "Internal error from Core" in place of the broker's status.
    call = stub.Append(metadata=md, timeout=30)
    await send_all(call, reqs())
    resp: pb.AppendResponse = await call
    return resp


async def _read(stub: Any, journal: str, md: Metadata) -> list[pb.ReadResponse]:
    req = pb.ReadRequest(journal=journal, offset=0, block=False)
    return [r async for r in stub.Read(req, metadata=md, timeout=30)]


async def _list(stub: Any, md: Metadata, selector: str = "") -> pb.ListResponse:
    sel = label_selector(include={"prefix": "auth/"})
    out = pb.ListResponse()
    async for resp in stub.List(pb.ListRequest(selector=sel), metadata=md, timeout=30):
        if resp.HasField("header") and resp.header.process_id.suffix:
            out.header.CopyFrom(resp.header)
        out.journals.extend(resp.journals)
    return out


async def _write_head(stub: Any, journal: str) -> int:
    resps = await _read(stub, journal, ALL)
    return max((r.write_head for r in resps), default=0)


# One entry per RPC: (method, capability it needs, a call with the given metadata).
def _calls(
    stub: Any, channel: grpc.aio.Channel
) -> dict[str, tuple[Capability, Callable[[Metadata], Awaitable[Any]]]]:
    prune = channel.unary_unary(
        "/pygazette.Retention/Prune",
        request_serializer=rpb.PruneRequest.SerializeToString,
        response_deserializer=rpb.PruneResponse.FromString,
    )
    return {
        "List": (Capability.LIST, lambda md: _list(stub, md)),
        "Apply": (
            Capability.APPLY,
            lambda md: stub.Apply(
                pb.ApplyRequest(
                    changes=[
                        pb.ApplyRequest.Change(
                            upsert=journal_spec("auth/applied", labels={"app": "a"}),
                            expect_mod_revision=-1,
                        )
                    ]
                ),
                metadata=md,
            ),
        ),
        "Read": (Capability.READ, lambda md: _read(stub, "auth/a", md)),
        "Append": (Capability.APPEND, lambda md: _append(stub, "auth/a", b"x\n", md)),
        "ListFragments": (
            Capability.READ,
            lambda md: stub.ListFragments(pb.FragmentsRequest(journal="auth/a"), metadata=md),
        ),
        "FragmentStoreHealth": (
            Capability.READ,
            lambda md: stub.FragmentStoreHealth(
                pb.FragmentStoreHealthRequest(fragment_store="file:///"), metadata=md
            ),
        ),
        "Prune": (
            Capability.APPLY,
            lambda md: prune(rpb.PruneRequest(journal="auth/a", dry_run=True), metadata=md),
        ),
        "Replicate": (
            Capability.REPLICATE,
            lambda md: _replicate(stub, md),
        ),
    }


async def _replicate(stub: Any, md: Metadata) -> list[pb.ReplicateResponse]:
    # No request is written: the broker answers (refuses, or says it doesn't replicate)
    # before reading one, and a write racing that answer fails the call on the client side
    # with its own INTERNAL status.
    call = stub.Replicate(metadata=md, timeout=30)
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
        await call.done_writing()
    return [r async for r in call]


RPCS = [
    "List",
    "Apply",
    "Read",
    "Append",
    "ListFragments",
    "FragmentStoreHealth",
    "Prune",
    "Replicate",
]


@pytest.mark.parametrize("rpc", RPCS)
async def test_every_rpc_needs_its_capability(broker: BrokerProcess, stub: Any, rpc: str) -> None:
    channel = grpc.aio.insecure_channel(broker.address)
    try:
        cap, call = _calls(stub, channel)[rpc]
        # Every capability but the one it needs: refused before the handler runs.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(token(Capability.ALL & ~cap))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert info.value.details() == f"authorization is missing required {cap.name} capability"
        # Just the one it needs: served.
        try:
            await call(token(cap))
        except grpc.aio.AioRpcError as exc:
            # Single-node brokers don't replicate: the handler ran and said so.
            assert rpc == "Replicate" and exc.code() == grpc.StatusCode.UNIMPLEMENTED, exc
    finally:
        await channel.close()


def _raw(doc: dict[str, Any], key: bytes = SECRET) -> Metadata:
    return (("authorization", "Bearer " + jwt.encode(doc, key, algorithm="HS256")),)


BAD_TOKENS: dict[str, Metadata] = {
    "missing": (),
    "not-bearer": (("authorization", "Basic dXNlcjpwYXNz"),),
    "malformed": (("authorization", "Bearer not.a.jwt"),),
    "wrong-key": token(Capability.ALL, auth=KeyedAuth(base64.b64encode(b"x" * 32).decode())),
    "expired": _raw({"cap": int(Capability.ALL), "exp": int(time.time()) - 60}),
    "no-exp": _raw({"cap": int(Capability.ALL)}),
}


@pytest.mark.parametrize("bad", sorted(BAD_TOKENS))
async def test_bad_tokens_are_unauthenticated_and_nothing_happens(stub: Any, bad: str) -> None:
    md = BAD_TOKENS[bad]
    head = await _write_head(stub, "auth/b")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _append(stub, "auth/b", b"must not land\n", md)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await _write_head(stub, "auth/b") == head

    change = pb.ApplyRequest.Change(upsert=journal_spec("auth/never"), expect_mod_revision=-1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Apply(pb.ApplyRequest(changes=[change]), metadata=md)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "auth/never" not in [j.spec.name for j in (await _list(stub, ALL)).journals]

    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _read(stub, "auth/b", md)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_tokens_are_judged_as_gazette_judges_them(stub: Any) -> None:
    """A token with an audience (as identity providers mint them) is served, as Gazette
    serves it; a "never expiring" one (exp 1e30, the distant past for Gazette's Go clock) is
    refused. (tests/auth/test_keyed_auth.py holds the full table.)"""
    exp = int(time.time()) + 60
    for aud in ("gazette", ["gazette", "other"]):
        resps = await _read(
            stub, "auth/a", _raw({"cap": int(Capability.READ), "exp": exp, "aud": aud})
        )
        assert resps and resps[0].status in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE)  # Served.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _read(stub, "auth/a", _raw({"cap": int(Capability.READ), "exp": 1e30}))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_any_key_verifies(stub: Any) -> None:
    other = KeyedAuth(f"{OTHER_KEYS} {KEYS}")  # Signs with the broker's second key.
    resps = await _read(stub, "auth/a", token(Capability.READ, auth=other))
    assert resps and resps[0].status == pb.OK


async def test_selector_limits_journals(stub: Any) -> None:
    only_a = label_selector(include={"app": "a"})
    md = token(Capability.LIST | Capability.READ | Capability.APPEND | Capability.APPLY, only_a)

    names = [j.spec.name for j in (await _list(stub, md)).journals]
    assert "auth/a" in names and "auth/b" not in names
    assert "auth/b" in [j.spec.name for j in (await _list(stub, ALL)).journals]

    assert (await _append(stub, "auth/a", b"ok\n", md)).status == pb.OK
    head = await _write_head(stub, "auth/b")
    assert (await _append(stub, "auth/b", b"no\n", md)).status == pb.JOURNAL_NOT_FOUND
    assert await _write_head(stub, "auth/b") == head
    assert (await _read(stub, "auth/b", md))[0].status == pb.JOURNAL_NOT_FOUND
    frags = await stub.ListFragments(pb.FragmentsRequest(journal="auth/b"), metadata=md)
    assert frags.status == pb.JOURNAL_NOT_FOUND

    # Apply: a change outside the selector is refused, and the whole request with it.
    inside = pb.ApplyRequest.Change(
        upsert=journal_spec("auth/a2", labels={"app": "a"}), expect_mod_revision=-1
    )
    outside = pb.ApplyRequest.Change(
        upsert=journal_spec("auth/b2", labels={"app": "b"}), expect_mod_revision=-1
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Apply(pb.ApplyRequest(changes=[inside, outside]), metadata=md)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "not authorized to auth/b2" in (info.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.Apply(
            pb.ApplyRequest(
                changes=[pb.ApplyRequest.Change(delete="auth/b", expect_mod_revision=-1)]
            ),
            metadata=md,
        )
    names = [j.spec.name for j in (await _list(stub, ALL)).journals]
    assert "auth/a2" not in names and "auth/b2" not in names and "auth/b" in names
    assert (await stub.Apply(pb.ApplyRequest(changes=[inside]), metadata=md)).status == pb.OK

    # A name selector (what clients sign by default) reaches that journal only.
    by_name = token(Capability.READ, label_selector(include={"name": "auth/b"}))
    assert (await _read(stub, "auth/b", by_name))[0].status in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE)
    assert (await _read(stub, "auth/a", by_name))[0].status == pb.JOURNAL_NOT_FOUND


async def test_a_long_read_outlives_its_token(
    broker: BrokerProcess, stub: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The broker ends a Read when its token expires (past its 5 s leeway), as Gazette's does;
    # the client's RetryReader reads on with a freshly signed token, losing nothing.
    monkeypatch.setitem(rpc_claims.TOKEN_TTL, "/protocol.Journal/Read", 2.0)
    async with JournalClient(broker.url, auth=KeyedAuth(KEYS)) as client:
        first = await append(client, "auth/a", b"before\n")
        rr = RetryReader(client, "auth/a", offset=first.commit.begin, block=True)
        assert await rr.read() == b"before\n"
        restarted = asyncio.Event()
        restart = rr._restart

        async def restart_and_tell(offset: int | None = None) -> None:
            await restart(offset)
            restarted.set()

        rr._restart = restart_and_tell  # type: ignore[method-assign]
        reading = asyncio.create_task(rr.read())
        async with asyncio.timeout(30):
            await restarted.wait()  # The broker ended the stream, and the reader came back.
        assert not reading.done()
        await append(client, "auth/a", b"after\n")
        async with asyncio.timeout(30):
            assert await reading == b"after\n"
        await rr.aclose()


async def test_client_library_signs_its_rpcs(broker: BrokerProcess, stub: Any) -> None:
    async with JournalClient(broker.url, auth=KeyedAuth(KEYS)) as client:
        resp = await append(client, "auth/a", b"from the client\n")
        assert resp.status == pb.OK
        names = [j.spec.name for j in (await list_all(client, "prefix=auth/")).journals]
        assert "auth/a" in names
        reader = Reader(
            client, pb.ReadRequest(journal="auth/a", offset=resp.commit.begin, block=False)
        )
        assert (await reader.read()).startswith(b"from the client\n")
        assert (await prune_journal(client, "auth/a", dry_run=True)).status == pb.OK

    # A token of the wrong key, or no authorization at all: one clear refusal.
    async with JournalClient(broker.url, auth=BearerAuth("junk")) as client:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await list_all(client, "prefix=auth/")
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with JournalClient(broker.url) as client:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await append(client, "auth/a", b"nope\n", max_attempts=1)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "missing or empty Authorization token" in (info.value.details() or "")


def test_rollout_key_allows_missing_tokens(tmp_path: Path) -> None:
    import asyncio

    proc = BrokerProcess(tmp_path / "data", extra_args=["--auth-keys", f"{KEYS} AA=="])
    proc.start()

    async def run() -> None:
        async with JournalClient(proc.url) as client:  # Sends no token.
            apply = pb.ApplyRequest(
                changes=[
                    pb.ApplyRequest.Change(upsert=journal_spec("roll/a"), expect_mod_revision=-1)
                ]
            )
            assert (await client.rpc_apply(apply)).status == pb.OK
            assert (await append(client, "roll/a", b"hi\n")).status == pb.OK
        channel = grpc.aio.insecure_channel(proc.address)
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        try:
            # A token that is given must still be good.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _read(stub, "roll/a", BAD_TOKENS["wrong-key"])
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # An empty one is given, and no token (as Gazette: only no metadata is let through).
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _read(stub, "roll/a", (("authorization", ""),))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert (await _read(stub, "roll/a", token(Capability.READ)))[0].status == pb.OK
        finally:
            await channel.close()

    try:
        asyncio.run(run())
    finally:
        proc.stop()


def test_bad_auth_keys_fail_serve_with_one_line(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data", extra_args=["--auth-keys", "not*base64"])
    with pytest.raises(RuntimeError, match="exited early"):
        proc.start(timeout=20)
    assert "--auth-keys" in proc.log() and "Traceback" not in proc.log()


def test_sync_client_and_spark_runtime_sign(broker: BrokerProcess) -> None:
    from pygazette.client import SyncJournalClient
    from pygazette.spark import runtime
    from pygazette.spark.journals import fragments, write_head
    from pygazette.spark.options import parse_read_options

    sync = SyncJournalClient(broker.url, auth=KeyedAuth(KEYS))
    try:
        resp = sync.append("auth/a", b"from the sync client\n")
        assert resp.status == pb.OK
        assert "auth/a" in [j.spec.name for j in sync.list_journals("prefix=auth/")]
    finally:
        sync.close()

    # Spark's options reach the clients of the driver and executors (runtime).
    options = {"broker": broker.url, "journals": "auth/a", "authKeys": KEYS}
    target = parse_read_options(options, streaming=False).target
    assert KEYS not in repr(target)
    assert runtime.call(target, lambda c: write_head(c, "auth/a")) >= resp.commit.end
    assert runtime.call(target, lambda c: fragments(c, "auth/a"))
    anonymous = parse_read_options({**options, "authKeys": ""}, streaming=False).target
    with pytest.raises(grpc.aio.AioRpcError) as info:
        runtime.call(anonymous, lambda c: write_head(c, "auth/a"))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
