"""An append in doubt at replication 2: its peer confirmed it, the primary never heard so.

On a route of two a commit confirms itself: the primary commits it, then sends the commit
carrying the Header, and the peer that commits it takes it as confirmed. Here the peer's
acknowledgement is lost on its way back (a relay in front of the peer, which the peer
advertises, stops relaying its bytes to the primary), and the peer is then killed. The
client hears UNKNOWN (in doubt). The primary's next pipeline used to cut that append from
its own spool (its confirmed frontier had never moved) and continue the journal from the
lower offset with other bytes, while the killed peer kept the old bytes as *confirmed*:
once restarted and assigned the journal again, it served them where the others serve the
later appends. The rule now: a new pipeline never cuts below a confirmation this broker
sent. So the journal never continues below the append in doubt, and every broker reads the
same bytes at every offset, the append in doubt exactly once or nowhere.

Real broker processes on a real etcd; each broker advertises a `TcpProxy` in front of it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.broker.fragment import frontier_log
from pygazette.protocol.fragment_name import parse_fragment_path
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, ClusterBroker, append_once, read_range
from tests.support.etcd_process import EtcdProcess
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

JOURNAL = "in-doubt/journal"


def _record(name: str) -> bytes:
    return f"{name}:".encode() + b"." * 100 + b"\n"


def _confirmed(broker: ClusterBroker) -> int:
    """The broker's confirmed frontier of the journal, as its frontier log records it."""
    path = broker.data_dir / "spools" / frontier_log.FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return -1
    return frontier_log.parse_records(data)[0].get(JOURNAL, -1)


class ProxiedCluster:
    def __init__(self, cluster: Cluster, proxies: dict[str, TcpProxy]) -> None:
        self.cluster = cluster
        self.proxies = proxies

    def others(self, *brokers: ClusterBroker) -> list[ClusterBroker]:
        return [b for b in self.cluster.brokers if b not in brokers]

    async def append_until_ok(
        self, broker: ClusterBroker, data: bytes, within: float = 60.0
    ) -> pb.AppendResponse:
        deadline = time.monotonic() + within
        last: object = None
        while time.monotonic() < deadline:
            try:
                resp = await append_once(self.cluster.stub(broker), JOURNAL, data, within=10)
            except grpc.aio.AioRpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            else:
                if resp.status == pb.OK:
                    return resp
                last = pb.Status.Name(resp.status)
            await asyncio.sleep(0.2)
        raise AssertionError(
            f"append of {data[:12]!r} never succeeded (last: {last})\n{self.cluster.log_tail()}"
        )


async def _read_local(cluster: Cluster, broker: ClusterBroker, within: float = 30) -> bytes:
    """The journal from offset 0 to the write head, as `broker` itself serves it
    (`do_not_proxy`: its own spools' content, and the URL of each persisted fragment it
    picks, read here from the shared file store); read again while it doesn't hold the
    journal, or the read ends early (a route change)."""
    deadline = time.monotonic() + within
    out = bytearray()
    while True:
        status = pb.OK
        async for resp in cluster.stub(broker).Read(
            pb.ReadRequest(journal=JOURNAL, offset=len(out), block=False, do_not_proxy=True),
            timeout=within,
        ):
            if resp.content:
                assert resp.offset == len(out)
                out += resp.content
            elif resp.fragment_url:
                assert resp.fragment_url.startswith("file:///"), resp.fragment_url
                data = (cluster.file_root / resp.fragment_url[len("file:///") :]).read_bytes()
                frag = resp.fragment
                assert frag.begin <= len(out) == resp.offset < frag.end
                out += data[len(out) - frag.begin :]
            elif resp.status != pb.OK:
                status = resp.status
                break
        if status == pb.OFFSET_NOT_YET_AVAILABLE:
            return bytes(out)
        assert time.monotonic() < deadline, (
            f"{broker.member_key} never served the journal ({pb.Status.Name(status)})"
        )
        if status != pb.OK:
            await asyncio.sleep(0.1)


@pytest.fixture
async def proxied(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> AsyncIterator[ProxiedCluster]:
    cluster = Cluster(tmp_path, etcd, etcd_root)
    proxies: dict[str, TcpProxy] = {}
    try:
        for i in range(3):
            b = cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
            proxy = proxies[b.suffix] = TcpProxy(b.port)
            # Peers reach it (and its Replicate streams answer them) through the proxy.
            b.extra_args += ["--advertise", proxy.url]
        await cluster.start()
        yield ProxiedCluster(cluster, proxies)
    finally:
        await cluster.close()
        for proxy in proxies.values():
            proxy.close()


async def test_a_self_confirmed_append_whose_ack_was_lost_is_never_written_over(
    proxied: ProxiedCluster,
) -> None:
    cluster = proxied.cluster
    spec = journal_spec(JOURNAL, replication=2)
    assert (await apply_specs(cluster.stub(cluster.brokers[0]), spec)).status == pb.OK
    await cluster.wait_ready([JOURNAL], 2)
    acked: list[tuple[bytes, pb.AppendResponse]] = []
    # Two appends: the second rolls the spool holding the journal's first write, so that
    # the append in doubt needs no round before its commit.
    for name in ("first", "second"):
        data = _record(name)
        acked.append((data, await proxied.append_until_ok(cluster.brokers[0], data)))
    primary = cluster.primary_of(JOURNAL)
    assert primary is not None
    [peer] = [b for b in cluster.members_of(JOURNAL) if b is not primary]
    [third] = proxied.others(primary, peer)

    # The append in doubt: the peer commits and confirms it; its acknowledgement is lost.
    doubtful = _record("doubtful")
    x = acked[-1][1].commit.end
    y = x + len(doubtful)
    proxied.proxies[peer.suffix].blackhole()
    pending = asyncio.create_task(
        append_once(cluster.stub(primary), JOURNAL, doubtful, within=60)
    )
    deadline = time.monotonic() + 30
    while _confirmed(peer) < y:
        assert not pending.done(), pending
        assert time.monotonic() < deadline, f"the peer never confirmed [{x}, {y})"
        await asyncio.sleep(0.01)
    assert _confirmed(peer) == y
    peer.kill()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await pending
    assert err.value.code() == grpc.StatusCode.UNKNOWN, err.value
    proxied.proxies[peer.suffix].reset()  # Relays normally again (for the restart).

    # The journal goes on without the peer (the third broker takes its place).
    data = _record("after-kill")
    after_kill = await proxied.append_until_ok(primary, data)
    acked.append((data, after_kill))

    # The peer comes back, and is assigned the journal again once the third broker leaves;
    # its proxy refuses the primary for now, so the primary's pipeline can't roll the
    # peer's spool yet: the peer serves reads from what it recovered.
    proxied.proxies[peer.suffix].cut()
    await asyncio.to_thread(peer.start, 60.0)
    await cluster.wait_for(lambda: cluster.is_member(peer), "the peer rejoins")
    await asyncio.to_thread(third.stop, 60.0)
    await cluster.wait_for(
        lambda: set(cluster.members_of(JOURNAL)) == {primary, peer},
        "the journal is assigned to the primary and the restarted peer",
    )
    # Each member serves what it holds, and where both serve an offset they serve the
    # same byte.
    ours, theirs = await _read_local(cluster, primary), await _read_local(cluster, peer)
    common = min(len(ours), len(theirs))
    assert ours[:common] == theirs[:common], (
        f"{primary.member_key} reads {ours!r}, {peer.member_key} reads {theirs!r}"
    )
    proxied.proxies[peer.suffix].restore()
    await cluster.wait_ready([JOURNAL], 2)

    data = _record("after-rejoin")
    acked.append((data, await proxied.append_until_ok(primary, data)))

    # Every member serves the same bytes at every offset (each from what it holds), and
    # so does a read proxied to the primary.
    content, head = await read_range(cluster.stub(peer), JOURNAL)
    for b in (primary, peer):
        local = await _read_local(cluster, b)
        assert local == content, f"{b.member_key} reads {local!r}, the primary {content!r}"
    # The append in doubt is there exactly once, where it was committed, or nowhere.
    assert content.count(b"doubtful:") <= 1
    if b"doubtful:" in content:
        assert content[x:y] == doubtful
    # Every acknowledged append is where its commit said.
    assert head == len(content) == acked[-1][1].commit.end
    for data, resp in acked:
        assert content[resp.commit.begin : resp.commit.end] == data
    # The journal never went on below an offset the peer held confirmed.
    assert after_kill.commit.begin >= y, (
        f"the next append was written at {after_kill.commit.begin}, below {y}, which the "
        f"killed peer held confirmed"
    )

    # No two fragments in the store disagree where they overlap.
    frags: list[tuple[int, int, bytes]] = []
    for path in (cluster.file_root / JOURNAL).rglob("*"):
        if path.is_file():
            frag = parse_fragment_path(JOURNAL, str(path.relative_to(cluster.file_root / JOURNAL)))
            frags.append((frag.begin, frag.end, path.read_bytes()))
    for b1, e1, c1 in frags:
        for b2, e2, c2 in frags:
            lo, hi = max(b1, b2), min(e1, e2)
            if lo < hi:
                assert c1[lo - b1 : hi - b1] == c2[lo - b2 : hi - b2], (b1, e1, b2, e2)
