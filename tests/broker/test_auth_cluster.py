"""Authorization in a 2-broker cluster on a real etcd: brokers sign their peer RPCs.

With replication 2 and `--auth-keys` on both brokers, appends sent to either broker (the
non-primary proxies to the primary) commit on both replicas, and reads through either broker
return them; proxied requests and Replicate streams are re-signed by the brokers themselves,
with narrow claims, so a client's name-selected token is all it takes.
"""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.auth.authorizer import TOKEN_TTL_ENV
from pygazette.auth.capability import Capability
from pygazette.auth.claims import Claims
from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.auth.rpc_claims import journal_name_selector
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.stream_write import send_all
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, append_once, read_range
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

KEYS = base64.b64encode(b"cluster-auth-key".ljust(32, b"c")).decode()


async def test_two_brokers_proxy_and_replicate_with_auth(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    auth = KeyedAuth(KEYS)
    cluster = Cluster(tmp_path, etcd, etcd_root, broker_args=["--auth-keys", KEYS], auth=auth)
    b1, b2 = cluster.add("zone-a", "broker-1"), cluster.add("zone-b", "broker-2")
    try:
        await cluster.start()
        assert (
            await apply_specs(cluster.stub(b1), journal_spec("sec/j", replication=2))
        ).status == pb.OK
        await cluster.wait_ready(["sec/j"], 2)
        primary = cluster.primary_of("sec/j")
        assert primary is not None
        other = b2 if primary is b1 else b1

        # Through both brokers: the non-primary proxies, the primary replicates to the other.
        acked = []
        for i, b in enumerate([other, primary, other, primary]):
            data = f"secure-{i}\n".encode()
            resp = await append_once(cluster.stub(b), "sec/j", data)
            assert resp.status == pb.OK, (resp, cluster.log_tail())
            assert resp.header.process_id.suffix == primary.suffix
            acked.append(data)
        for b in (b1, b2):
            content, _ = await read_range(cluster.stub(b), "sec/j")
            assert content == b"".join(acked), cluster.log_tail()
        # A client's token for this journal only is enough through the proxying broker.
        md = (
            (
                "authorization",
                "Bearer "
                + auth.sign(
                    Claims(Capability.APPEND | Capability.READ, journal_name_selector("sec/j"))
                ),
            ),
        )
        channel = grpc.aio.insecure_channel(other.address)
        try:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]

            async def reqs():  # type: ignore[no-untyped-def]
                yield pb.AppendRequest(journal="sec/j")
                yield pb.AppendRequest(content=b"narrow\n")
                yield pb.AppendRequest()

            resp = await stub.Append(reqs(), metadata=md, timeout=30)
            assert resp.status == pb.OK
            # Without a token, the proxying broker refuses before forwarding anything.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                # (Written with send_all: see tests/broker/test_auth.py's _append.)
                call = stub.Append(timeout=30)
                await send_all(call, reqs())
                await call
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            await channel.close()
        content, _ = await read_range(cluster.stub(primary), "sec/j")
        assert content == b"".join(acked) + b"narrow\n"
    finally:
        await cluster.close()


async def test_pipelines_are_renewed_before_their_tokens_expire(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    # Brokers sign their peer RPCs with 2-second tokens here (an hour by default): a replica
    # ends a Replicate stream once its token expired (past the 5 s leeway), so a primary
    # must replace its pipeline before that; appends go on through it all, none failing.
    auth = KeyedAuth(KEYS)
    cluster = Cluster(
        tmp_path,
        etcd,
        etcd_root,
        broker_args=["--auth-keys", KEYS],
        auth=auth,
        broker_env={TOKEN_TTL_ENV: "2"},
    )
    b1, b2 = cluster.add("zone-a", "broker-1"), cluster.add("zone-b", "broker-2")
    try:
        await cluster.start()
        assert (
            await apply_specs(cluster.stub(b1), journal_spec("sec/renewed", replication=2))
        ).status == pb.OK
        await cluster.wait_ready(["sec/renewed"], 2)
        primary = cluster.primary_of("sec/renewed")
        assert primary is not None
        stub = cluster.stub(primary)
        acked = []
        deadline = time.monotonic() + 12  # Past the first pipeline's tokens and leeway.
        while time.monotonic() < deadline:
            data = f"record-{len(acked)}\n".encode()
            resp = await append_once(stub, "sec/renewed", data)
            assert resp.status == pb.OK, (resp, cluster.log_tail())
            acked.append(data)
            await asyncio.sleep(0.05)  # A steady trickle of appends, as a producer's.
        for b in (b1, b2):
            content, _ = await read_range(cluster.stub(b), "sec/renewed")
            assert content == b"".join(acked), cluster.log_tail()
        assert "replication pipeline broken" not in primary.log(), primary.log()
    finally:
        await cluster.close()
