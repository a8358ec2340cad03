"""A consumer process: its configuration, start-up, serving and shutdown (`run_consumer`).
The command line around it (`pygazette consumer serve`, an application's own `run(app)`) is
`pygazette.cli.run_consumer`.

A consumer process joins the consumer group under its etcd prefix (a ConsumerSpec under a
lease at `<prefix>/members/<zone>#<id>`), takes part in allocating shards (the oldest member
leads), runs the shards assigned to it (`replica.ShardReplica`) and serves the `consumer.Shard`
service on its port, answering for any shard (proxying to the shard's primary when needed).
Without `--etcd` it runs alone on an embedded keyspace under its data directory.

If the lease is lost (etcd unreachable for a TTL, or the process frozen past it), the
process stops every shard at once — another process may already be primary — and exits
with an error for its supervisor to restart it. SIGINT/SIGTERM stop it cleanly: the
ConsumerSpec is marked exiting so shards move to other members first.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import logging
import os
import shutil
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import grpc.aio

from pygazette.allocator.allocator import Allocator, ObservedState
from pygazette.allocator.session import MemberSession, mark_exiting, membership_ended
from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.auth.request_guard import RequestGuard
from pygazette.auth.server_interceptor import AuthServerInterceptor
from pygazette.auth.tls import ClientTLS, ServerTLS, server_credentials
from pygazette.client.routed_client import RoutedJournalClient
from pygazette.consumer.application import Application
from pygazette.consumer.local_session import LocalSession, clear_failed_assignments
from pygazette.consumer.replica import SHARDS_DIR, ConsumerContext, ShardReplica
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.keyspace import Keyspace, KeyValue
from pygazette.keyspace.layout import KeyLayout
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import consumer_pb2_grpc as cpb_grpc
from pygazette.protocol.response_checks import ResponseCheckInterceptor, response_checks_enabled

if TYPE_CHECKING:
    from pygazette.consumer.resolver import StatusReporter

log = logging.getLogger(__name__)

__all__ = [
    "ConsumerConfig",
    "ConsumerProcess",
    "SideServer",
    "run_consumer",
    "tune_gc",
]

DEFAULT_CONSUMER_PREFIX = "/gazette/consumers"


class ConsumerFailed(Exception):
    """The process can no longer act as a member of its consumer group."""


@dataclass(slots=True)
class ConsumerConfig:
    app: Application
    broker: str = "http://localhost:8080"
    etcd_url: str = ""  # Empty: an embedded keyspace under data_dir.
    etcd_prefix: str = DEFAULT_CONSUMER_PREFIX + "/app"
    host: str = "127.0.0.1"
    port: int = 8081
    advertise: str = ""
    zone: str = "local"
    id: str = ""
    data_dir: Path = Path("./consumer-data")
    shard_limit: int = 1024
    lease_ttl: float = 20.0
    drain_timeout: float = 30.0
    hints_interval: float = 5.0
    # The HTTP port (/metrics, /debug/ready, /debug/live; 0: none) and its address (default:
    # `host`).
    http_port: int = 0
    http_address: str = ""
    # Origins the HTTP port's JSON API allows in CORS contexts (--allow-origin).
    allow_origins: tuple[str, ...] = ()
    # TLS of the Shard gRPC port (mTLS with a CA), towards https:// peers (proxied Stats),
    # brokers and etcd; None: plaintext (or system roots for https:// URLs).
    tls: ServerTLS | None = None
    peer_tls: ClientTLS | None = None
    broker_tls: ClientTLS | None = None
    etcd_tls: ClientTLS | None = None
    # Gazette-style --auth-keys: verify Shard RPCs, and sign this process's RPCs to brokers
    # and to peers (proxied Stats). Empty: no authorization.
    auth_keys: str = ""


def default_member_id(port: int) -> str:
    """A process's member ID (its ProcessSpec.ID suffix) when none is given."""
    return f"{socket.gethostname()}-{port}"


class ConsumerProcess:
    def __init__(self, config: ConsumerConfig) -> None:
        self.config = config
        if not config.id:
            config.id = default_member_id(config.port)
        scheme = "https" if config.tls is not None else "http"
        self.endpoint = config.advertise or f"{scheme}://{config.host}:{config.port}"
        self.spec = cpb.ConsumerSpec(shard_limit=config.shard_limit)
        self.spec.process_spec.id.zone = config.zone
        self.spec.process_spec.id.suffix = config.id
        self.spec.process_spec.endpoint = self.endpoint
        self._server: grpc.aio.Server | None = None
        self._allocator_task: asyncio.Task[None] | None = None
        self._lock_fd = -1
        self.keyspace: Keyspace
        self.session: MemberSession | LocalSession

    def _lock_data_dir(self) -> None:
        """One process per data directory (its shards' local stores live there)."""
        self._lock_fd = os.open(self.config.data_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise OSError(
                f"another consumer is using data directory {self.config.data_dir}"
            ) from None

    async def start(self) -> None:
        # Imported here: `pygazette --help` and the journal commands need none of it.
        from pygazette.consumer.key_space import ShardDecoder
        from pygazette.consumer.resolver import ShardResolver
        from pygazette.consumer.shard_client import ShardPeers
        from pygazette.consumer.shard_service import ShardService

        cfg = self.config
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        # Shards' local stores an earlier process left (killed, or stopped mid-recovery) are
        # of no use: a replica recovers its shard from the recovery log into a directory
        # made afresh, under a name that changes with each assignment.
        stale = cfg.data_dir / SHARDS_DIR
        if stale.is_dir():
            await asyncio.to_thread(shutil.rmtree, stale, True)
        self.layout = KeyLayout(cfg.etcd_prefix)
        self.member_key = self.layout.member_key(cfg.zone, cfg.id)
        if cfg.etcd_url:
            etcd = EtcdKeyspace(cfg.etcd_url, cfg.etcd_prefix, tls=cfg.etcd_tls)
            await etcd.open()
            self.keyspace = etcd
            self.session = MemberSession(
                etcd, self.member_key, self.spec.SerializeToString(), cfg.lease_ttl
            )
        else:
            self.keyspace = EmbeddedKeyspace(cfg.data_dir / "keyspace.json")
            self.session = LocalSession(
                self.keyspace, self.member_key, self.spec.SerializeToString()
            )
        auth = KeyedAuth(cfg.auth_keys) if cfg.auth_keys else None
        # Reads (each primary shard's blocking read of each source) go straight to the
        # journal's primary broker, as Gazette's consumers' do, rather than through a proxy.
        self.client = RoutedJournalClient(cfg.broker, tls=cfg.broker_tls, auth=auth)
        self.decoder = ShardDecoder(self.layout)
        self.observed = ObservedState(self.keyspace, self.layout, self.decoder, self.member_key)
        self.context = ConsumerContext(
            app=cfg.app,
            client=self.client,
            keyspace=self.keyspace,
            data_dir=cfg.data_dir,
            lease_check=lambda: self.session.lease_alive(margin=1.0),
            hints_interval=cfg.hints_interval,
        )
        self.resolver = ShardResolver(
            self.keyspace,
            self.layout,
            self.observed,
            self.member_key,
            self._new_replica,
            process_spec=self.spec.process_spec,
        )
        self.resolver.lease_alive = lambda: self.session.lease_alive()
        self.service = ShardService(
            self.resolver,
            self.keyspace,
            self.layout,
            peers=ShardPeers(tls=cfg.peer_tls, auth=auth),
        )
        self._server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 0),  # A second process on the port fails to start.
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20),
            ],
            # The request guard first (outermost): see pygazette/auth/request_guard.py.
            interceptors=[
                RequestGuard(),
                *([AuthServerInterceptor(auth)] if auth is not None else []),
                # Under PYGAZETTE_CHECK_RESPONSES=1, every response is checked before it is sent.
                *([ResponseCheckInterceptor()] if response_checks_enabled() else []),
            ],
        )
        cpb_grpc.add_ShardServicer_to_server(  # type: ignore[no-untyped-call]
            self.service, self._server
        )
        if cfg.tls is not None:
            bound = self._server.add_secure_port(
                f"{cfg.host}:{cfg.port}", server_credentials(cfg.tls)
            )
        else:
            bound = self._server.add_insecure_port(f"{cfg.host}:{cfg.port}")
        if bound == 0:
            raise OSError(f"cannot listen on {cfg.host}:{cfg.port}")
        await self._server.start()
        await self.session.start()
        if isinstance(self.session, LocalSession):
            failed = await clear_failed_assignments(
                self.keyspace, self.layout, self.decoder, cfg.zone, cfg.id
            )
            if failed:
                log.info("starting shards that failed before afresh", extra={"shards": failed})
        self.resolver.start()
        self._allocator_task = asyncio.create_task(
            Allocator(self.keyspace, self.observed).run(), name="allocator"
        )
        log.info(
            "consumer serving",
            extra={"endpoint": self.endpoint, "member": self.member_key, "broker": cfg.broker},
        )

    def _new_replica(
        self, spec: cpb.ShardSpec, assignment: KeyValue, report: StatusReporter
    ) -> ShardReplica:
        return ShardReplica(self.context, spec, assignment, report)

    async def ended(self) -> None:
        """Return once the allocator finished (drained); raise ConsumerFailed if membership
        was lost."""
        assert self._allocator_task is not None
        failure = await membership_ended(self.session.lost, self._allocator_task)
        if failure is not None:
            raise ConsumerFailed(failure)

    async def drain(self) -> None:
        """Mark this member exiting and wait (bounded) for its shards to move elsewhere."""
        if self.session.lost.is_set() or isinstance(self.session, LocalSession):
            return
        spec = cpb.ConsumerSpec()
        spec.CopyFrom(self.spec)
        spec.exiting = True  # Its shards move to other members.
        deadline = time.monotonic() + self.config.drain_timeout
        if not await mark_exiting(self.session, spec.SerializeToString(), deadline, "consumer"):
            return
        while time.monotonic() < deadline:
            state = self.observed.current
            if state.local_member < 0 or not state.local_items:
                return
            if state.shed_capacity[state.local_member] == 0:
                return  # Nowhere to move them.
            with contextlib.suppress(TimeoutError):
                await self.keyspace.wait_for_change(
                    self.keyspace.revision, deadline - time.monotonic()
                )

    async def stop(self, *, failed: bool = False) -> None:
        """Stop serving. `failed`: membership was lost (the lease expired), so no shard can
        commit again: shards are stopped at once rather than given time to finish."""
        if failed:
            self.context.stop_timeout = 0.0
        if self._allocator_task is not None:
            self._allocator_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._allocator_task
        await self.resolver.stop()
        if self._server is not None:
            await self._server.stop(2.0)
            await self.service.close()
        # Revoked whenever it may still be alive, a failed member's too (its key deleted by
        # hand): its assignments go with it and its shards move at once, as Gazette's
        # session closes its lease when its tasks end. One known lost is left alone.
        await self.session.close(revoke=True)
        await self.client.close()
        await self.keyspace.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        log.info("consumer stopped")

    # Observability: what /debug/ready says, and the metrics of the shards held here.
    not_ready: str | None = "starting"  # None once started (joined its group).

    def ready_reason(self) -> str | None:
        """None when serving: joined, and every local shard's recovery settled (it is
        primary, standby or failed, not still idle or backfilling); else why not."""
        if self.not_ready is not None:
            return self.not_ready
        unsettled = (cpb.ReplicaStatus.IDLE, cpb.ReplicaStatus.BACKFILL)
        pending = sum(1 for r in self.resolver.replicas.values() if r.status.code in unsettled)
        return f"{pending} shard(s) recovering" if pending else None

    def local_replicas(self) -> dict[str, Any]:
        resolver = getattr(self, "resolver", None)
        return dict(resolver.replicas) if resolver is not None else {}


def tune_gc() -> None:
    """Fewer, cheaper garbage collections for a streaming process.

    A primary decodes thousands of messages per read; with CPython's defaults they survive
    into the older generations and make full collections frequent (a fifth of a primary's
    CPU in `bench/consumer.py`). Objects alive after start-up (modules, the application)
    are frozen out of every pass, and the youngest generation is collected every 20,000
    allocations instead of 700.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)


class SideServer(Protocol):
    """A server started and stopped with the process (its HTTP port: metrics and health;
    built by the CLI, which may depend on layers the consumer must not)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def run_consumer(
    config: ConsumerConfig,
    side_server: Callable[[ConsumerProcess], SideServer | None] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (then drain and stop), or until membership is lost.

    `side_server` builds a server started before the process and stopped after it.
    """
    process = ConsumerProcess(config)
    http = side_server(process) if side_server is not None else None
    if http is not None:
        await http.start()
    await process.start()
    process.not_ready = None
    tune_gc()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ended = asyncio.ensure_future(process.ended())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([ended, stopping], return_when=asyncio.FIRST_COMPLETED)
    if stopping.done() and not ended.done():
        process.not_ready = "draining"
        # Membership may fail while the shards move (the lease lost, the key deleted): then
        # the consumer leaves at once, as Gazette's, not at the end of the drain.
        draining = asyncio.ensure_future(process.drain())
        await asyncio.wait([draining, ended], return_when=asyncio.FIRST_COMPLETED)
        if not draining.done():
            draining.cancel()
            await asyncio.wait([draining])
        elif not ended.done() and process.session.lost.is_set():
            await asyncio.wait([ended])  # The drain gave up as membership ended: failed.
    if ended.done() and ended.exception() is not None:
        stopping.cancel()
        log.error("leaving the consumer group", extra={"error": str(ended.exception())})
        process.not_ready = "stopping"
        if http is not None:
            await http.stop()
        await process.stop(failed=True)
        raise ConsumerFailed(str(ended.exception()))
    ended.cancel()
    stopping.cancel()
    process.not_ready = "stopping"
    if http is not None:
        await http.stop()
    await process.stop()
