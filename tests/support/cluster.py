"""A cluster of real broker processes on one real etcd, for integration and fault tests.

Brokers share a `file://` fragment store root (as brokers on several machines would share
a bucket), each has its own data directory, zone and ID, and all use a short lease TTL so
failures are noticed quickly. An observer mirrors the cluster's keyspace to wait on
conditions (a journal's route, membership) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

import grpc
import grpc.aio

from pygazette.auth.authorizer import Authorizer
from pygazette.auth.client_interceptor import auth_interceptors
from pygazette.auth.tls import ClientTLS, channel_credentials
from pygazette.broker.allocation import assignments_advertise, route_of
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.layout import KeyDecodeError, KeyLayout, decode_route
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.support.broker_process import BrokerProcess
from tests.support.etcd_process import EtcdProcess

LEASE_TTL = "3s"


class ClusterBroker(BrokerProcess):
    def __init__(self, cluster: Cluster, zone: str, suffix: str) -> None:
        self.zone = zone
        self.suffix = suffix
        self.cluster = cluster
        # The --etcd flags are added at each start (`command`): etcd's port is known then,
        # and reading it no earlier leaves etcd free to move off a taken port as it starts.
        args = [
            "--etcd-prefix",
            cluster.root,
            "--zone",
            zone,
            "--id",
            suffix,
            "--lease-ttl",
            cluster.lease_ttl,
            "--drain-timeout",
            "20s",
        ]
        if cluster.shared_store:
            args += ["--file-root", str(cluster.file_root)]
        args += cluster.broker_args
        super().__init__(
            cluster.tmp / f"data-{suffix}",
            extra_args=args,
            env={"PYGAZETTE_LOG_LEVEL": "info", **cluster.broker_env},
            tls=cluster.tls,
        )

    def command(self, port: int) -> list[str]:
        return [*super().command(port), *self.cluster.etcd.client_flags]

    @property
    def member_key(self) -> str:
        return f"{self.zone}#{self.suffix}"


class Cluster:
    def __init__(
        self,
        tmp: Path,
        etcd: EtcdProcess,
        root: str,
        *,
        lease_ttl: str = LEASE_TTL,
        shared_store: bool = True,
        broker_args: Sequence[str] = (),
        tls: ClientTLS | None = None,
        auth: Authorizer | None = None,
        broker_env: Mapping[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.broker_env = dict(broker_env or {})  # More environment of every broker.
        self.auth = auth  # Signs the RPCs of `stub` (brokers serving with --auth-keys).
        self.etcd = etcd
        self.root = root
        self.lease_ttl = lease_ttl
        # Without a shared store each broker keeps `file:///` under its own data directory.
        self.shared_store = shared_store
        # More `serve` flags of every broker (e.g. TLS), and what clients of TLS brokers
        # trust and present (`stub`, readiness checks); None: brokers serve plaintext.
        self.broker_args = list(broker_args)
        self.tls = tls
        self.file_root = tmp / "store"
        self.file_root.mkdir(parents=True, exist_ok=True)
        self.layout = KeyLayout(root)
        self.brokers: list[ClusterBroker] = []
        self.ks: EtcdKeyspace | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}

    # Processes.
    def add(self, zone: str, suffix: str) -> ClusterBroker:
        broker = ClusterBroker(self, zone, suffix)
        self.brokers.append(broker)
        return broker

    async def start(self, *brokers: ClusterBroker) -> None:
        """Start brokers (all if none given) and wait until each has joined."""
        targets = list(brokers) or self.brokers
        for b in targets:
            await asyncio.to_thread(b.start, 60.0)
        await self.observe()
        for b in targets:
            await self.wait_for(lambda b=b: self.is_member(b), f"{b.member_key} joins", 60)

    async def observe(self) -> EtcdKeyspace:
        if self.ks is None:
            self.ks = EtcdKeyspace(self.etcd.url, self.root, tls=self.etcd.client_tls)
            await self.ks.open()
        return self.ks

    async def close(self) -> None:
        for b in self.brokers:
            with contextlib.suppress(Exception):
                b.thaw()
            b.kill()
        for ch in self._channels.values():
            await ch.close(None)
        if self.ks is not None:
            await self.ks.close()

    def log_tail(self) -> str:
        return "\n".join(f"--- {b.member_key}:\n{b.log()[-3000:]}" for b in self.brokers)

    # Clients.
    def stub(self, broker: ClusterBroker) -> pb_grpc.JournalStub:
        ch = self._channels.get(broker.address)
        if ch is None:
            options = [
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 500),
            ]
            if self.tls is not None:
                credentials = channel_credentials(self.tls)
                ch = grpc.aio.secure_channel(
                    broker.address,
                    credentials,
                    options=options,
                    interceptors=auth_interceptors(self.auth),
                )
            else:
                ch = grpc.aio.insecure_channel(
                    broker.address, options=options, interceptors=auth_interceptors(self.auth)
                )
            self._channels[broker.address] = ch
        return pb_grpc.JournalStub(ch)  # type: ignore[no-untyped-call]

    def running(self) -> list[ClusterBroker]:
        return [b for b in self.brokers if b.running()]

    # Keyspace conditions.
    def is_member(self, broker: ClusterBroker) -> bool:
        assert self.ks is not None
        return self.ks.get(self.layout.member_key(broker.zone, broker.suffix)) is not None

    def route(self, journal: str) -> tuple[pb.Route, bool]:
        """The journal's route and whether every assignment advertises it."""
        assert self.ks is not None
        kvs = self.ks.range(self.layout.item_assignments_prefix(journal))
        group = []
        from pygazette.allocator.state import Assignment

        for kv in kvs:
            try:
                key = self.layout.parse_assignment_key(kv.key)
            except KeyDecodeError:
                continue
            group.append(Assignment(key.item, key.zone, key.suffix, key.slot, kv))
        return route_of(group), bool(group) and assignments_advertise(route_of(group), group)

    def primary_of(self, journal: str) -> ClusterBroker | None:
        route, _ = self.route(journal)
        if route.primary < 0:
            return None
        m = route.members[route.primary]
        for b in self.brokers:
            if (b.zone, b.suffix) == (m.zone, m.suffix):
                return b
        return None

    def members_of(self, journal: str) -> list[ClusterBroker]:
        route, _ = self.route(journal)
        ids = {(m.zone, m.suffix) for m in route.members}
        return [b for b in self.brokers if (b.zone, b.suffix) in ids]

    def ready(self, journal: str, replication: int) -> bool:
        route, consistent = self.route(journal)
        return consistent and len(route.members) == replication and route.primary >= 0

    async def wait_for(self, cond: Callable[[], bool], what: str, within: float = 60.0) -> None:
        ks = await self.observe()
        try:
            async with asyncio.timeout(within):
                while not cond():
                    await ks.wait_for_change(ks.revision)
        except TimeoutError:
            raise AssertionError(f"timed out waiting until {what}\n{self.log_tail()}") from None

    async def wait_ready(
        self, journals: Sequence[str], replication: int, within: float = 60
    ) -> None:
        await self.wait_for(
            lambda: all(self.ready(j, replication) for j in journals),
            f"{list(journals)} have {replication} consistent replicas",
            within,
        )

    def advertised(self, journal: str) -> list[pb.Route]:
        assert self.ks is not None
        return [
            decode_route(kv) for kv in self.ks.range(self.layout.item_assignments_prefix(journal))
        ]


# Raw RPC helpers that fail over between brokers.


async def append_once(
    stub: pb_grpc.JournalStub,
    journal: str,
    data: bytes,
    within: float = 20.0,
    chunk: int = 1 << 16,
) -> pb.AppendResponse:
    async def requests() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=journal)
        for i in range(0, len(data), chunk):
            yield pb.AppendRequest(content=data[i : i + chunk])
        yield pb.AppendRequest()

    resp: pb.AppendResponse = await stub.Append(requests(), timeout=within)
    return resp


async def read_range(
    stub: pb_grpc.JournalStub, journal: str, offset: int = 0, end: int = 0, within: float = 30.0
) -> tuple[bytes, int]:
    """Content from `offset` up to the write head (non-blocking); and the head."""
    out = bytearray()
    head = 0
    async for resp in stub.Read(
        pb.ReadRequest(journal=journal, offset=offset, block=False, end_offset=end),
        timeout=within,
        wait_for_ready=True,  # The broker may have just restarted.
    ):
        if resp.content:
            assert resp.offset == offset + len(out), (resp.offset, offset, len(out))
            out += resp.content
        else:
            if resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
                head = resp.write_head
                break
            assert resp.status == pb.OK, pb.Status.Name(resp.status)
            head = max(head, resp.write_head)
    return bytes(out), head
