"""Gazette's JSON API for shards (`POST /v1/shards/list`, `/v1/shards/stat`) on the HTTP port of
a real consumer process (`consumer serve --http-port`, the Counter app on etcd): bodies byte
for byte as the consumer's own gRPC answers in gogo jsonpb, and errors as grpc-gateway writes
unary ones. Side by side with Gazette's consumer: tests/interop/test_json_api_vs_gazette.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pygazette.client import JournalClient, apply_journals
from pygazette.consumer.shard_client import ShardClient
from pygazette.gateway.jsonpb import marshal
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.consumer.test_consumer_cluster import (
    LEASE,
    LOGS,
    OUT,
    PREFIX,
    RECOVERY_LOG,
    SHARD,
    SOURCES,
    Group,
    shard_spec,
)
from tests.gateway.test_json_api import NOT_IMPLEMENTED, post
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess
from tests.support.etcd_process import EtcdProcess, etcd_binary
from tests.support.http_scrape import wait_status
from tests.support.journal_data import small_journal_spec
from tests.support.ports import free_port

pytestmark = [
    pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed"),
    pytest.mark.timeout(180),
]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    proc = EtcdProcess(tmp_path / "etcd")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def group(tmp_path: Path, etcd: EtcdProcess, broker: BrokerProcess) -> AsyncIterator[Group]:
    g = Group(tmp_path, etcd, broker)
    await g.ks.open()
    async with JournalClient(broker.url) as client:
        specs = [small_journal_spec(j) for j in [*SOURCES, OUT]]
        specs.append(small_journal_spec(f"{LOGS}/{SHARD}", RECOVERY_LOG))
        await apply_journals(
            client, [pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs]
        )
    try:
        yield g
    finally:
        for c in g.consumers:
            c.kill()
        await g.ks.close()


async def test_shards_list_and_stat(group: Group) -> None:
    http_port = free_port()
    proc = ConsumerProcess(
        group.tmp / "consumer-0",
        app="tests.consumer.apps:Counter",
        broker=group.broker.url,
        etcd=group.etcd.url,
        etcd_prefix=PREFIX,
        member_id="member-0",
        extra_args=["--lease-ttl", LEASE, "--http-port", str(http_port)],
    )
    group.consumers.append(proc)
    proc.start()
    base = f"http://127.0.0.1:{http_port}"
    await asyncio.to_thread(wait_status, base + "/debug/ready")
    await group.apply(shard_spec(standbys=0))
    await group.wait_primary()

    async with ShardClient(proc.url) as shards:
        for _ in range(5):  # (The group's keyspace revision may move between the two.)
            listed = await shards.stub.List(cpb.ListRequest())
            status, headers, body = await post(base + "/v1/shards/list", "")
            if body == marshal(listed):
                break
        assert status == 200
        assert headers["Content-Type"] == "application/json"
        assert headers["Grpc-Metadata-Content-Type"] == "application/grpc"
        assert body == marshal(listed)  # One object, no newline: a unary RPC.
        shard = json.loads(body)["shards"][0]
        assert shard["spec"]["id"] == SHARD and shard["spec"]["maxTxnDuration"] == "0.100s"
        assert shard["status"] == [{"code": "PRIMARY", "errors": []}]
        assert json.loads(body)["extension"] is None

        for _ in range(5):
            stat = await shards.stub.Stat(cpb.StatRequest(shard=SHARD))
            status, _, body = await post(base + "/v1/shards/stat", json.dumps({"shard": SHARD}))
            if body == marshal(stat):
                break
        assert status == 200 and body == marshal(stat)
        assert set(json.loads(body)["readThrough"]) == set(SOURCES)

    status, _, body = await post(base + "/v1/shards/stat", '{"shard":"no-such-shard"}')
    assert status == 200 and json.loads(body)["status"] == "SHARD_NOT_FOUND"
    status, _, body = await post(base + "/v1/shards/stat", '{"shard":5}')
    assert (status, body) == (
        400,
        b'{"code":3,"message":"json: cannot unmarshal number into Go value of type '
        b'protocol.ShardID","details":[]}',
    )
    # An invalid request fails the RPC: a unary error is a Status body, not a stream's chunk;
    # UNKNOWN, as Gazette's consumer answers it.
    status, _, body = await post(base + "/v1/shards/stat", '{"shard":"bad id"}')
    error = json.loads(body)
    assert status == 500 and error["code"] == 2 and error["details"] == [], body
    assert (await post(base + "/v1/journals/list", "{}"))[::2] == (501, NOT_IMPLEMENTED)
