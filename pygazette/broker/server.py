"""A broker process: configuration, start-up (recovery included) and graceful shutdown.

Without `etcd_url` the broker runs single-node on an embedded keyspace; with it, it joins
the cluster on that etcd (`cluster_member`).

Data directory layout:
  keyspace.json   the embedded keyspace (journal specs), single-node mode
  spools/         crash-safe spools, one directory per journal
  fragments/      the default root of `file://` stores
  scratch/        compression scratch files
  LOCK            held while a broker runs, so two never share a data directory
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
from prometheus_client.metrics_core import Metric

from pygazette.allocator.metrics import AllocatorCollector, LeaseCollector
from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.auth.request_guard import RequestGuard
from pygazette.auth.server_interceptor import AuthServerInterceptor
from pygazette.auth.tls import ClientTLS, ServerTLS, server_credentials
from pygazette.broker.append_service import AppendLimits
from pygazette.broker.cluster_member import ClusterConfig, ClusterMember
from pygazette.broker.fragment.persister import DEFAULT_BACKLOG_LIMIT, Persister
from pygazette.broker.fragment.retention import DEFAULT_ENFORCE_INTERVAL_SECONDS, RetentionEnforcer
from pygazette.broker.journal_service import JournalService
from pygazette.broker.metrics import BrokerCollector
from pygazette.broker.peer_append_service import PeerJournalService
from pygazette.broker.resolver import BrokerIdentity, Resolver
from pygazette.broker.retention_service import RetentionService
from pygazette.broker.rpc_metrics import RpcCounters, RpcMetricsInterceptor
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import DEFAULT_ROOT, Keyspace
from pygazette.keyspace.metrics import KeyspaceCollector
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import peer_pb2_grpc as ppb_grpc
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.pb import retention_pb2_grpc as rpb_grpc
from pygazette.protocol.response_checks import ResponseCheckInterceptor, response_checks_enabled
from pygazette.protocol.validation import validate_process_id
from pygazette.stores.store import StoreRegistry

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20
# Gazette's default: a client must stream at least 64 KiB/s while it holds a journal.
DEFAULT_MIN_APPEND_RATE = 1 << 16


@dataclass(slots=True)
class BrokerConfig:
    data_dir: Path
    port: int = 8080
    host: str = "127.0.0.1"
    file_root: Path | None = None
    sync: bool = False
    min_append_rate: int = DEFAULT_MIN_APPEND_RATE
    max_append_rate: int = 0
    zone: str = "local"
    broker_id: str = ""
    advertise_url: str = ""
    # Bytes of closed spools awaiting one store before appends to its journals are refused.
    spool_backlog_limit: int = DEFAULT_BACKLOG_LIMIT
    # Seconds between retention passes over every journal (0: prune only on demand).
    retention_interval: float = DEFAULT_ENFORCE_INTERVAL_SECONDS
    # Cluster mode (an etcd URL); the rest applies only then.
    etcd_url: str = ""
    etcd_prefix: str = DEFAULT_ROOT
    lease_ttl: float = 20.0
    journal_limit: int = 1024
    drain_timeout: float = 60.0
    # Suspend journals left idle (Gazette's --broker.auto-suspend; `pulser`).
    auto_suspend: bool = False
    # TLS of the gRPC port (mTLS when it has a CA); None: plaintext.
    tls: ServerTLS | None = None
    # What this broker trusts and presents towards `https://` peers, and towards etcd.
    peer_tls: ClientTLS | None = None
    etcd_tls: ClientTLS | None = None
    # Gazette's --auth-keys: base64 HMAC keys (the first signs, any verifies; `AA==` lets
    # requests without a token through). Empty: no authorization.
    auth_keys: str = ""


class BrokerAlreadyRunning(RuntimeError):
    pass


class SideServer(Protocol):
    """A server started and stopped with the broker (its HTTP port: metrics, health, the
    journal gateway; built by the CLI, which may depend on layers the broker must not)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def default_broker_id() -> str:
    """The host name, if Gazette accepts it as a process ID suffix, else a name built from it.

    Gazette's clients validate every response Header, and a suffix must be a token of 4 to
    128 characters: a short host name such as "vm" would make every response invalid to them.
    """
    host = socket.gethostname()
    try:
        validate_process_id(pb.ProcessSpec.ID(zone="local", suffix=host))
        return host
    except ValidationError:
        cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in host)
        return f"pygazette-{cleaned}"[:128]


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.file_root = (config.file_root or self.data_dir / "fragments").resolve()
        self._lock_fd = -1
        self._server: grpc.aio.Server | None = None
        self.port = config.port
        self.member: ClusterMember | None = None
        # Observability: Journal RPC counters, what `/debug/ready` says (None: serving) and
        # metrics read from the broker's state when scraped (`collect`).
        self.rpc_counters = RpcCounters()
        self.ready_reason: str | None = "starting"
        self._collectors: list[Any] = []
        self.endpoint = ""
        self._side: SideServer | None = None
        self.side_server: Callable[[Broker], SideServer] | None = None

    def collect(self) -> Iterator[Metric]:
        """Metrics read from this broker's state (a prometheus-client collector)."""
        for collector in self._collectors:
            yield from collector.collect()

    def _served_journals(self) -> Iterator[tuple[str, bool]]:
        clustered = self.member is not None
        for name, replica in list(self.resolver.replicas.items()):
            yield name, replica.primary or not clustered

    def _add_collectors(self) -> None:
        self._collectors = [
            BrokerCollector(self.persister, self._served_journals),
            KeyspaceCollector(self.keyspace),
        ]
        member = self.member
        if member is not None:
            self._collectors += [
                AllocatorCollector(member.observed, lambda: getattr(member, "allocator", None)),
                LeaseCollector(lambda: member.session),
            ]

    async def start(self) -> None:
        cfg = self.config
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.file_root.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()

        self.stores = StoreRegistry(self.file_root)
        self.persister = Persister(
            self.stores, self.data_dir / "scratch", backlog_limit=cfg.spool_backlog_limit
        )
        options: list[tuple[str, int]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
        if cfg.etcd_url:
            # Peers ping their Replicate streams every few seconds to notice a dead peer.
            options += [
                ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
                ("grpc.http2.max_ping_strikes", 0),
            ]
        # Wrappers around every RPC handler (request checks, authorization, RPC metrics, and
        # under PYGAZETTE_CHECK_RESPONSES=1 response checks), outermost first.
        interceptors: list[grpc.aio.ServerInterceptor[Any, Any]] = [RequestGuard()]
        # Verifies every RPC's token, and signs this broker's own RPCs to peers.
        self.auth = KeyedAuth(cfg.auth_keys) if cfg.auth_keys else None
        if self.auth is not None:
            interceptors.append(AuthServerInterceptor(self.auth))
        interceptors.append(RpcMetricsInterceptor(self.rpc_counters))
        if response_checks_enabled():
            # Innermost: every response a handler answers is checked before it is sent.
            interceptors.append(ResponseCheckInterceptor())
        self._server = grpc.aio.server(options=options, interceptors=interceptors)
        self.port = self._listen(self._server)
        scheme = "https" if cfg.tls is not None else "http"
        endpoint = cfg.advertise_url or f"{scheme}://{cfg.host}:{self.port}"
        identity = BrokerIdentity(cfg.zone, cfg.broker_id or default_broker_id(), endpoint)
        self.endpoint = endpoint
        if self.side_server is not None:
            self._side = self.side_server(self)
            await self._side.start()  # Live (and saying "starting") while spools recover.
        limits = AppendLimits(cfg.min_append_rate, cfg.max_append_rate)
        if cfg.etcd_url:
            await self._start_clustered(identity, limits)
        else:
            self.keyspace: Keyspace = EmbeddedKeyspace(self.data_dir / "keyspace.json")
            self.resolver = Resolver(
                self.keyspace,
                identity,
                spool_root=self.data_dir / "spools",
                stores=self.stores,
                persister=self.persister,
                sync=cfg.sync,
            )
            pb_grpc.add_JournalServicer_to_server(  # type: ignore[no-untyped-call]
                JournalService(self.resolver, self.stores, limits), self._server
            )
            self._add_retention()
            self.persister.start()
            self.resolver.start()  # Recovers spools left by an earlier run.
            self.retention.start()
            await self._server.start()
        self._add_collectors()
        self.ready_reason = None
        log.info("broker serving", extra={"endpoint": endpoint, "data_dir": str(self.data_dir)})

    async def _start_clustered(self, identity: BrokerIdentity, limits: AppendLimits) -> None:
        cfg = self.config
        assert self._server is not None
        self.member = ClusterMember(
            ClusterConfig(
                cfg.etcd_url,
                cfg.etcd_prefix,
                cfg.lease_ttl,
                cfg.journal_limit,
                cfg.drain_timeout,
                peer_tls=cfg.peer_tls,
                peer_auth=self.auth,
                etcd_tls=cfg.etcd_tls,
                auto_suspend=cfg.auto_suspend,
            ),
            identity=identity,
            spool_root=self.data_dir / "spools",
            stores=self.stores,
            persister=self.persister,
            limits=limits,
            sync=cfg.sync,
        )
        await self.member.open()
        self.keyspace = self.member.keyspace
        self.resolver = self.member.resolver
        pb_grpc.add_JournalServicer_to_server(  # type: ignore[no-untyped-call]
            JournalService(self.resolver, self.stores, limits, self.member.services), self._server
        )
        ppb_grpc.add_PeerJournalServicer_to_server(  # type: ignore[no-untyped-call]
            PeerJournalService(self.member.services.appends), self._server
        )
        self._add_retention()
        self.persister.start()
        self.retention.start()
        await self._server.start()  # Peers can reach us before we are assigned anything.
        await self.member.join()

    def _listen(self, server: grpc.aio.Server) -> int:
        """Bind the gRPC port; the bound port number (for `port` 0, the one picked)."""
        cfg = self.config
        if cfg.tls is not None:
            port = server.add_secure_port(f"{cfg.host}:{cfg.port}", server_credentials(cfg.tls))
        else:
            port = server.add_insecure_port(f"{cfg.host}:{cfg.port}")
        if port == 0:
            raise OSError(f"cannot listen on {cfg.host}:{cfg.port}")
        return port

    def _add_retention(self) -> None:
        """The Retention service (`journals prune`) and the periodic retention pass."""
        assert self._server is not None
        member = self.member
        rpb_grpc.add_RetentionServicer_to_server(  # type: ignore[no-untyped-call]
            RetentionService(
                self.resolver, self.stores, peers=member.peers if member is not None else None
            ),
            self._server,
        )
        self.retention = RetentionEnforcer(
            self.resolver,
            self.stores,
            self.config.retention_interval,
            peers=member.peers if member is not None else None,
            endpoint_of=member.resolver.endpoint_of if member is not None else None,
        )

    def _lock_data_dir(self) -> None:
        self._lock_fd = os.open(self.data_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise BrokerAlreadyRunning(
                f"another broker is using data directory {self.data_dir}"
            ) from None

    async def stop(
        self, grace: float = 5.0, *, failed: bool = False, persist_within: float | None = None
    ) -> None:
        """Stop serving, then persist open spools (bounded by `grace` seconds, or by
        `persist_within` if longer).

        In cluster mode, replicas stop first (so peers' streams end), then the server, and
        the lease is revoked, unless it was lost (`failed`: membership was lost, its lease or
        its key).
        """
        self.ready_reason = "stopping"
        if self._side is not None:
            await self._side.stop()
            self._side = None
        await self.retention.stop()
        if self.member is not None:
            self.member.stop_serving()
            if self._server is not None:
                await self._server.stop(grace)
            await self.member.leave(graceful=not failed)
        else:
            self.resolver.stop_serving()
            if self._server is not None:
                await self._server.stop(grace)
            await self.resolver.stop()
        self.persister.exit()  # Spools a store refuses go to the next store (as Gazette's).
        try:
            async with asyncio.timeout(max(grace, persist_within or 0.0)):
                await self.persister.wait_idle()
        except TimeoutError:
            log.warning("shutdown before every spool persisted; they persist on restart")
        await self.persister.stop()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        log.info("broker stopped")

    async def wait(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()


async def run_broker(
    config: BrokerConfig, side_server: Callable[[Broker], SideServer] | None = None
) -> None:
    """Serve until SIGINT or SIGTERM, then shut down cleanly.

    In cluster mode, a signal first drains this broker's journals to its peers; and the
    broker also stops on its own if it loses its membership (raising MemberFailed).
    `side_server` builds a server started and stopped with the broker (its HTTP port).
    """
    broker = Broker(config)
    broker.side_server = side_server
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if broker.member is None:
        await stop.wait()
        await broker.stop()
        return
    member = broker.member
    ended = asyncio.ensure_future(member.ended())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([ended, stopping], return_when=asyncio.FIRST_COMPLETED)
    if stopping.done() and not ended.done():
        broker.ready_reason = "draining"
        # Membership may fail while the journals move (the lease lost, the key deleted):
        # then the broker leaves at once, as Gazette's, not at the end of the drain.
        draining = asyncio.ensure_future(member.drain())
        await asyncio.wait([draining, ended], return_when=asyncio.FIRST_COMPLETED)
        if not draining.done():
            draining.cancel()
            await asyncio.wait([draining])
        elif not ended.done() and member.session.lost.is_set():
            await asyncio.wait([ended])  # The drain gave up as membership ended: failed.
    if ended.done() and ended.exception() is not None:
        stopping.cancel()
        log.error("leaving the cluster", extra={"error": str(ended.exception())})
        await broker.stop(failed=True)
        raise ended.exception()  # type: ignore[misc]
    ended.cancel()
    stopping.cancel()
    # Spools of journals that moved away may be held nowhere else (a journal of replication
    # 1, the broker scaled in for good): as Gazette's, wait for them to persist, here for up
    # to the drain timeout (a store that is out longer leaves them to a restart).
    await broker.stop(persist_within=config.drain_timeout)
