"""The cluster append state machine when an append fails between its two commit rounds.

Three brokers run in this process on a real etcd, so that a test can make the replicas
commit an append (the first round) but never confirm it (the second), as a peer that is
cut off or loses its stream at that moment would. Such an append was never acknowledged:
the journal must carry on as if it never happened, whatever the primary does next.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.auth.client_interceptor import auth_interceptors
from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.broker import pipeline, replicate_service
from pygazette.broker.replica import Replica
from pygazette.broker.replicate_service import ReplicateAborted
from pygazette.broker.server import Broker, BrokerConfig
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import append_once, read_range
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

JOURNAL = "fsm/journal"
# Appends longer than the fragment length: each rolls the spool at the next append.
FRAGMENT_LENGTH = 1024


def _record(name: str, size: int = 1100) -> bytes:
    return f"{name}:".encode() + b"." * size + b"\n"


class UnconfirmedCommits:
    """Wraps the replicas' handling of Replicate requests: while armed, a replica commits
    an append (the first round) but never takes the round that confirms it — it holds
    that round until its stream is cut off ("hold"), or ends its stream ("fail")."""

    def __init__(self, mode: str, only: set[int] | None = None) -> None:
        self.mode = mode
        self.only = only  # ids of the replicas to affect (None: all)
        self.armed = False
        self.cut_off = 0
        self.both_cut_off = asyncio.Event()
        self._committed: set[int] = set()
        self._apply = replicate_service._apply

    async def apply(
        self, replica: Replica, req: pb.ReplicateRequest, is_first: bool, pair: bool = False
    ) -> pb.ReplicateResponse | None:
        if self.armed and req.HasField("proposal") and not is_first:
            rs = replica.rspool
            assert rs is not None
            if rs.delta:
                self._committed.add(id(replica))  # The first round: it commits the append.
            elif id(replica) in self._committed and (self.only is None or id(replica) in self.only):
                try:
                    if self.mode == "fail":
                        raise ReplicateAborted(grpc.StatusCode.UNAVAILABLE, "stream lost")
                    await asyncio.Event().wait()
                finally:
                    self.cut_off += 1
                    if self.cut_off == (2 if self.only is None else len(self.only)):
                        self.both_cut_off.set()
        return await self._apply(replica, req, is_first, pair=pair)


class InProcessCluster:
    def __init__(self, tmp: Path, etcd: EtcdProcess, root: str, *, auth_keys: str = "") -> None:
        """With `auth_keys`, the brokers authorize (`--auth-keys`) and `stub`s sign."""
        self.tmp, self.etcd, self.root = tmp, etcd, root
        self.auth_keys = auth_keys
        self.brokers: dict[int, Broker] = {}
        self._channels: dict[int, grpc.aio.Channel] = {}

    async def start(self, i: int) -> Broker:
        b = Broker(
            BrokerConfig(
                data_dir=self.tmp / f"broker-{i}",
                port=0,
                file_root=self.tmp / "store",
                zone="zone-a" if i % 2 == 0 else "zone-b",
                broker_id=f"broker-{i}",
                etcd_url=self.etcd.url,
                etcd_prefix=self.root,
                lease_ttl=3.0,
                auth_keys=self.auth_keys,
            )
        )
        await b.start()
        self.brokers[i] = b
        return b

    async def stop(self, i: int) -> None:
        b = self.brokers.pop(i)
        channel = self._channels.pop(i, None)
        if channel is not None:
            await channel.close(None)
        await b.stop(grace=1.0)

    def stub(self, i: int) -> pb_grpc.JournalStub:
        channel = self._channels.get(i)
        if channel is None:
            auth = KeyedAuth(self.auth_keys) if self.auth_keys else None
            channel = grpc.aio.insecure_channel(
                f"127.0.0.1:{self.brokers[i].port}", interceptors=auth_interceptors(auth)
            )
            self._channels[i] = channel
        return pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]

    def replica(self, i: int) -> Replica:
        replica = self.brokers[i].resolver.replicas.get(JOURNAL)
        assert replica is not None
        return replica

    def members(self) -> list[int]:
        return [i for i, b in self.brokers.items() if JOURNAL in b.resolver.replicas]

    def primary(self) -> int:
        for i, b in self.brokers.items():
            replica = b.resolver.replicas.get(JOURNAL)
            if replica is not None and replica.primary and replica.replication is not None:
                return i
        raise AssertionError("no broker has a pipeline for the journal")

    async def append_until_ok(self, i: int, data: bytes, within: float) -> pb.AppendResponse:
        """Append `data` through broker `i`, retrying while the journal can't take it."""
        deadline = time.monotonic() + within
        last: object = None
        while time.monotonic() < deadline:
            try:
                resp = await append_once(self.stub(i), JOURNAL, data, within=5)
            except grpc.aio.AioRpcError as exc:
                last = exc.code()
            else:
                if resp.status == pb.OK:
                    return resp
                last = pb.Status.Name(resp.status)
            await asyncio.sleep(0.1)
        raise AssertionError(f"append of {data[:12]!r} never succeeded (last: {last})")

    async def check_reads(self, acked: list[tuple[bytes, pb.AppendResponse]]) -> None:
        """Every broker reads every acknowledged append where its commit said, once each
        has listed the store again (as they do every refresh interval)."""
        for b in self.brokers.values():
            replica = b.resolver.replicas.get(JOURNAL)
            if replica is not None:
                await replica.refresh()
        for i in self.brokers:
            content, head = await read_range(self.stub(i), JOURNAL)
            assert head == len(content) == acked[-1][1].commit.end
            for data, resp in acked:
                begin, end = resp.commit.begin, resp.commit.end
                assert content[begin:end] == data, (
                    f"broker-{i} reads {content[begin : begin + 12]!r} where {data[:12]!r} "
                    f"was acknowledged at [{begin}, {end})"
                )

    async def close(self) -> None:
        for i in list(self.brokers):
            await self.stop(i)


@pytest.fixture
async def cluster(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> AsyncIterator[InProcessCluster]:
    c = InProcessCluster(tmp_path, etcd, etcd_root)
    try:
        for i in range(3):
            await c.start(i)
        spec = journal_spec(JOURNAL, replication=3, length=FRAGMENT_LENGTH)
        assert (await apply_specs(c.stub(0), spec)).status == pb.OK
        yield c
    finally:
        await c.close()


@pytest.fixture
def short_ack_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds unanswered for 3 s break a pipeline: set before the cluster starts (the
    pipeline's watchdog, armed for a round sent earlier, would wait out the 30 s)."""
    monkeypatch.setattr(pipeline, "ACK_TIMEOUT_SECONDS", 3.0)


async def test_an_append_given_up_mid_commit_leaves_no_trace(
    short_ack_timeout: None, cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client gives up (its deadline passes) while the primary waits for the round that
    confirms its append, which the replicas never answer: the primary must not carry on
    with that pipeline as if nothing happened (it used to, rolling the spool with the
    unconfirmed append in it, which then persisted beside what the cluster wrote at the
    same offsets). The client's leaving breaks nothing (as with Gazette: other appends may
    be in flight); the unanswered round does, once ACK_TIMEOUT_SECONDS pass."""
    unconfirmed = UnconfirmedCommits("hold")
    monkeypatch.setattr(replicate_service, "_apply", unconfirmed.apply)
    acked = [(_record("first"), await cluster.append_until_ok(0, _record("first"), 30))]
    primary = cluster.primary()

    unconfirmed.armed = True
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await append_once(cluster.stub(primary), JOURNAL, _record("gone"), within=1.0)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    async with asyncio.timeout(10):  # Both replicas' streams are cut off, unconfirmed.
        await unconfirmed.both_cut_off.wait()
    unconfirmed.armed = False

    # The next append goes through at once, on a pipeline that dropped the given-up one.
    data = _record("next")
    resp = await append_once(cluster.stub(primary), JOURNAL, data, within=10)
    assert resp.status == pb.OK
    acked.append((data, resp))
    for n in range(3):
        data = _record(f"after-{n}")
        acked.append((data, await cluster.append_until_ok(primary, data, 20)))
    await cluster.check_reads(acked)


async def test_a_primary_stopping_after_a_failed_commit_persists_none_of_it(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replicas' streams end before they confirm an append: it fails; the primary then
    stops (a rolling restart) and persists its spool. The append must not be in what it
    persists: the new primary cut it everywhere else and writes other appends there."""
    unconfirmed = UnconfirmedCommits("fail")
    monkeypatch.setattr(replicate_service, "_apply", unconfirmed.apply)
    acked = [(_record("first"), await cluster.append_until_ok(0, _record("first"), 30))]
    primary = cluster.primary()

    unconfirmed.armed = True
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await append_once(cluster.stub(primary), JOURNAL, _record("failed"), within=10)
    # Its confirmation went out: for all the primary can tell, a replica took it.
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert unconfirmed.both_cut_off.is_set()
    unconfirmed.armed = False

    await cluster.stop(primary)
    await cluster.start(primary)
    other = next(i for i in cluster.brokers if i != primary)
    for n in range(4):
        data = _record(f"after-{n}")
        acked.append((data, await cluster.append_until_ok(other, data, 60)))
    await cluster.check_reads(acked)


async def test_a_roll_forward_outlives_the_peer_it_came_from(
    cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One replica confirms an append, another loses its stream first: the append fails.
    The next pipeline rolls forward past it (only that replica holds it); then that replica
    leaves the journal, persisting its copy. The offsets the roll forward passed must not be
    used again (they were, when nothing confirmed the roll forward before the route changed
    again: two appends at one offset, the acknowledged one read back as the other)."""
    await cluster.start(3)
    acked = [(_record("first"), await cluster.append_until_ok(0, _record("first"), 30))]
    primary = cluster.primary()
    holder, loser = (i for i in cluster.members() if i != primary)
    unconfirmed = UnconfirmedCommits("fail", only={id(cluster.replica(loser))})
    monkeypatch.setattr(replicate_service, "_apply", unconfirmed.apply)

    unconfirmed.armed = True
    with pytest.raises(grpc.aio.AioRpcError) as err:
        # Longer than the appends after it: a fragment of it would cover theirs.
        failed = _record("failed", 4000)
        await append_once(cluster.stub(primary), JOURNAL, failed, within=10)
    # In doubt (UNKNOWN), not failed outright: one replica holds it confirmed.
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    unconfirmed.armed = False

    # The holder drains: a fourth broker joins the route (the primary synchronises it,
    # rolling forward past the failed append), then the holder leaves it.
    await cluster.brokers[holder].member.drain()
    assert holder not in cluster.members()
    await cluster.stop(holder)
    for n in range(4):
        data = _record(f"after-{n}")
        acked.append((data, await cluster.append_until_ok(primary, data, 60)))
    await cluster.check_reads(acked)
