"""Authorization of consumer processes (`consumer serve --auth-keys`), for real: a broker and
two consumers of the Counter app on etcd, all authorizing with the same keys.

Each Shard RPC is refused without its capability and allowed with it; a bad or missing token
is UNAUTHENTICATED; a token's selector limits the shards it reaches (by labels, and by `id`
for Apply's deletes and Unassign); a Stat through the process that isn't primary is proxied
and re-signed; and the consumers sign their own reads and appends to the broker.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from pygazette.auth.capability import Capability
from pygazette.auth.claims import Claims, label_selector
from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.client import JournalClient, append, apply_journals
from pygazette.consumer.shard_client import ShardClient
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import consumer_pb2_grpc as cpb_grpc
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess
from tests.support.etcd_process import EtcdProcess, etcd_binary
from tests.support.journal_data import small_journal_spec

pytestmark = [
    pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed"),
    pytest.mark.timeout(240),
]

KEYS = base64.b64encode(b"consumer-auth-key".ljust(32, b"c")).decode()
AUTH = KeyedAuth(KEYS)
SOURCE = "tests/shard-auth/in"
OUT = "tests/shard-auth/out"
SHARD = "auth-shard-0"


def token(cap: int, sel: pb.LabelSelector | None = None) -> tuple[tuple[str, str], ...]:
    return (("authorization", "Bearer " + AUTH.sign(Claims(cap, sel or pb.LabelSelector()))),)


def shard_spec(shard_id: str = SHARD) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(id=shard_id, hot_standbys=0)
    spec.sources.add(journal=SOURCE)
    spec.max_txn_duration.FromMilliseconds(100)
    spec.labels.CopyFrom(label_set({"app": "counter"}))
    return spec


class Setup:
    def __init__(self, broker: BrokerProcess, consumers: list[ConsumerProcess]) -> None:
        self.broker = broker
        self.consumers = consumers


@pytest.fixture
async def setup(tmp_path: Path, etcd: EtcdProcess, etcd_root: str) -> AsyncIterator[Setup]:
    broker = BrokerProcess(tmp_path / "broker", extra_args=["--auth-keys", KEYS])
    broker.start()
    consumers: list[ConsumerProcess] = []
    try:
        async with JournalClient(broker.url, auth=AUTH) as client:
            await apply_journals(
                client,
                [
                    pb.ApplyRequest.Change(upsert=small_journal_spec(j), expect_mod_revision=0)
                    for j in (SOURCE, OUT)
                ],
            )
        for n in range(2):
            proc = ConsumerProcess(
                tmp_path / f"consumer-{n}",
                app="tests.consumer.apps:Counter",
                broker=broker.url,
                etcd=etcd.url,
                etcd_prefix=etcd_root + "/consumer",
                member_id=f"member-{n}",
                extra_args=["--lease-ttl", "3s", "--auth-keys", KEYS],
                env={"COUNTER_OUTPUT": OUT},
            )
            consumers.append(proc)
            proc.start()
        yield Setup(broker, consumers)
    finally:
        for c in consumers:
            c.kill()
        broker.stop()


async def _primary(client: ShardClient, within: float = 60.0) -> str:
    """The endpoint of the shard's primary, once it has one."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for shard in await client.list_shards():
            if shard.spec.id == SHARD and shard.route.primary >= 0:
                if any(s.code == cpb.ReplicaStatus.PRIMARY for s in shard.status):
                    return shard.route.endpoints[shard.route.primary]
        await _sleep()
    raise TimeoutError("the shard got no primary")


async def _sleep() -> None:
    import asyncio

    await asyncio.sleep(0.1)


async def test_shard_rpcs_are_authorized(setup: Setup) -> None:
    c0, c1 = setup.consumers
    async with ShardClient(c0.url, auth=AUTH, route_stat=False) as client:
        change = cpb.ApplyRequest.Change(upsert=shard_spec(), expect_mod_revision=0)
        assert (await client.apply([change])).status == cpb.OK
        primary = await _primary(client)

        # The consumers read the source and append outputs through the authorizing broker.
        async with JournalClient(setup.broker.url, auth=AUTH) as jc:
            resp = await append(jc, SOURCE, b'{"key": "a"}\n' * 3)
        other = c1 if primary.endswith(f":{c0.port}") else c0
        async with ShardClient(other.url, auth=AUTH, route_stat=False) as via_other:
            # Stat through the process that isn't primary: proxied, re-signed by it.
            stat = await via_other.stat(SHARD, {SOURCE: resp.commit.end}, within=60)
            assert stat.status == cpb.OK
            assert stat.read_through[SOURCE] >= resp.commit.end

    channel = grpc.aio.insecure_channel(c0.address)
    stub = cpb_grpc.ShardStub(channel)  # type: ignore[no-untyped-call]
    calls: dict[str, tuple[Capability, Any]] = {
        "Stat": (Capability.READ, lambda md: stub.Stat(cpb.StatRequest(shard=SHARD), metadata=md)),
        "List": (Capability.LIST, lambda md: stub.List(cpb.ListRequest(), metadata=md)),
        "Apply": (
            Capability.APPLY,
            lambda md: stub.Apply(
                cpb.ApplyRequest(
                    changes=[cpb.ApplyRequest.Change(upsert=shard_spec(), expect_mod_revision=-1)]
                ),
                metadata=md,
            ),
        ),
        "GetHints": (
            Capability.READ,
            lambda md: stub.GetHints(cpb.GetHintsRequest(shard=SHARD), metadata=md),
        ),
        "Unassign": (
            Capability.APPLY,
            lambda md: stub.Unassign(
                cpb.UnassignRequest(shards=[SHARD], dry_run=True), metadata=md
            ),
        ),
    }
    try:
        for name, (cap, call) in calls.items():
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(token(Capability.ALL & ~cap))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
            assert (
                info.value.details() == f"authorization is missing required {cap.name} capability"
            )
            assert (await call(token(cap))).status == cpb.OK, name
            for bad in [(), (("authorization", "Bearer junk"),)]:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(bad)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, name

        # A selector of other shards: this one doesn't exist for it, nor may it change it.
        elsewhere = label_selector(include={"app": "other"})
        md = token(Capability.ALL, elsewhere)
        assert not (await stub.List(cpb.ListRequest(), metadata=md)).shards
        assert (await stub.Stat(cpb.StatRequest(shard=SHARD), metadata=md)).status == (
            cpb.SHARD_NOT_FOUND
        )
        hints = await stub.GetHints(cpb.GetHintsRequest(shard=SHARD), metadata=md)
        assert hints.status == cpb.SHARD_NOT_FOUND
        for call in (
            lambda: stub.Apply(
                cpb.ApplyRequest(
                    changes=[cpb.ApplyRequest.Change(delete=SHARD, expect_mod_revision=-1)]
                ),
                metadata=md,
            ),
            lambda: stub.Unassign(cpb.UnassignRequest(shards=[SHARD]), metadata=md),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call()
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert f"not authorized to {SHARD}" in (info.value.details() or "")
        # Its own labels (or id) it reaches.
        mine = token(Capability.LIST, label_selector(include={"app": "counter"}))
        assert [s.spec.id for s in (await stub.List(cpb.ListRequest(), metadata=mine)).shards] == [
            SHARD
        ]
    finally:
        await channel.close()

    # The shard client without authorization: refused.
    async with ShardClient(c0.url) as anonymous:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await anonymous.list_shards()
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_blocking_stat_has_its_tokens_whole_lifetime(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Stat waiting for its shard to read through an offset runs until its token expires:
    a fresh token's whole lifetime, as Gazette's client signs one per call. The client's
    token cache handed out a Shard RPC's (one-minute) token until half its lifetime had gone,
    so such a Stat was cut after as little as half of it, depending on when an earlier call
    signed the token."""
    import asyncio

    from pygazette.auth import rpc_claims
    from pygazette.auth.keyed_auth import LEEWAY_SECONDS

    ttl = 8.0  # A Shard RPC token's lifetime (a minute), shortened for the test.
    monkeypatch.setitem(rpc_claims.TOKEN_TTL, "/consumer.Shard/Stat", ttl)
    c0, _ = setup.consumers
    async with ShardClient(c0.url, auth=AUTH, route_stat=False) as admin:
        change = cpb.ApplyRequest.Change(upsert=shard_spec(), expect_mod_revision=0)
        assert (await admin.apply([change])).status == cpb.OK
        await _primary(admin)

    async with ShardClient(c0.url, auth=KeyedAuth(KEYS), route_stat=False) as client:
        assert (await client.stat(SHARD)).status == cpb.OK  # Its token is signed now.
        await asyncio.sleep(ttl / 2 - 0.5)  # The token has a little over half its life left.
        began = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.stat(SHARD, {SOURCE: 1 << 40}, within=60)  # Never read through.
        took = time.monotonic() - began
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "authorization expired" in (info.value.details() or "")
    assert took >= ttl + LEEWAY_SECONDS - 1.0, f"cut after {took:.1f} s"
