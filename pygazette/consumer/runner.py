"""Running a consumer process: `pygazette consumer serve --app module:factory …`, or
`run(app)` from an application's own `__main__`.

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
import importlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import grpc
import grpc.aio

from pygazette.allocator.allocator import Allocator, MemberKeyMissing, ObservedState
from pygazette.allocator.session import MemberSession
from pygazette.auth.configured import AUTH_KEYS_ENV
from pygazette.auth.keyed_auth import KeyedAuth, parse_auth_keys
from pygazette.auth.request_guard import RequestGuard
from pygazette.auth.server_interceptor import AuthServerInterceptor
from pygazette.auth.tls import ClientTLS, ServerTLS, TLSConfigError, server_credentials
from pygazette.auth.tls_flags import (
    client_tls_flags,
    client_tls_from_flags,
    server_tls_flags,
    server_tls_from_flags,
)
from pygazette.client.journal_client import JournalClient
from pygazette.consumer.application import Application
from pygazette.consumer.local_session import LocalSession
from pygazette.consumer.replica import ConsumerContext, ShardReplica
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.keyspace import Keyspace, KeyValue
from pygazette.keyspace.layout import KeyLayout
from pygazette.log_format import configure_from_options, log_options
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.go_duration import parse_seconds
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import consumer_pb2_grpc as cpb_grpc

if TYPE_CHECKING:
    from pygazette.consumer.resolver import StatusReporter

log = logging.getLogger(__name__)

__all__ = [
    "ConsumerConfig",
    "ConsumerProcess",
    "load_app",
    "run",
    "run_consumer",
    "serve",
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
    # TLS of the Shard gRPC port (mTLS with a CA), towards https:// peers (proxied Stats),
    # brokers and etcd; None: plaintext (or system roots for https:// URLs).
    tls: ServerTLS | None = None
    peer_tls: ClientTLS | None = None
    broker_tls: ClientTLS | None = None
    etcd_tls: ClientTLS | None = None
    # Gazette-style --auth-keys: verify Shard RPCs, and sign this process's RPCs to brokers
    # and to peers (proxied Stats). Empty: no authorization.
    auth_keys: str = ""


def load_app(spec: str) -> Application:
    """An application from `package.module:factory` (a class or function called with no
    arguments, or an object used as is)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(f"expected package.module:factory, got {spec!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # Apps next to the working directory, as `python -m` finds them.
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name}: {exc}") from exc
    try:
        factory: Any = getattr(module, attr)
    except AttributeError:
        raise click.BadParameter(f"{module_name} has no attribute {attr!r}") from None
    if isinstance(factory, type) or (
        callable(factory) and not hasattr(factory, "consume_message")
    ):
        app = factory()  # A class, or a factory function.
    else:
        app = factory  # An application object.
    for method in ("new_store", "consume_message", "finalize_txn"):
        if not callable(getattr(app, method, None)):
            raise click.BadParameter(f"{spec}: the application has no {method}() method")
    return app  # type: ignore[no-any-return]


class ConsumerProcess:
    def __init__(self, config: ConsumerConfig) -> None:
        self.config = config
        if not config.id:
            config.id = f"{socket.gethostname()}-{config.port}"
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
        self.client = JournalClient(cfg.broker, tls=cfg.broker_tls, auth=auth)
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
        lost = asyncio.ensure_future(self.session.lost.wait())
        try:
            await asyncio.wait(
                [self._allocator_task, lost], return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            lost.cancel()
        if self.session.lost.is_set():
            raise ConsumerFailed("the etcd lease was lost")
        try:
            self._allocator_task.result()
        except MemberKeyMissing as exc:
            raise ConsumerFailed(str(exc)) from exc

    async def drain(self) -> None:
        """Mark this member exiting and wait (bounded) for its shards to move elsewhere."""
        if self.session.lost.is_set() or isinstance(self.session, LocalSession):
            return
        spec = cpb.ConsumerSpec()
        spec.CopyFrom(self.spec)
        spec.exiting = True  # Its shards move to other members.
        try:
            await self.session.update(spec.SerializeToString())
        except Exception as exc:
            log.warning("cannot mark this consumer exiting", extra={"error": str(exc)})
            return
        deadline = time.monotonic() + self.config.drain_timeout
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
        if self._allocator_task is not None:
            self._allocator_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._allocator_task
        await self.resolver.stop()
        if self._server is not None:
            await self._server.stop(2.0)
            await self.service.close()
        await self.session.close(revoke=not failed)
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
        pending = sum(
            1 for r in self.resolver.replicas.values() if r.status.code in unsettled
        )
        return f"{pending} shard(s) recovering" if pending else None

    def local_replicas(self) -> dict[str, Any]:
        resolver = getattr(self, "resolver", None)
        return dict(resolver.replicas) if resolver is not None else {}


async def _start_http(process: ConsumerProcess) -> Any:
    """The process's HTTP port, started (None without --http-port)."""
    cfg = process.config
    if not cfg.http_port:
        return None
    # Composed by the CLI, which may depend on the gateway (the consumer layer must not).
    from pygazette.allocator.metrics import LeaseCollector
    from pygazette.cli.http_port import consumer_http
    from pygazette.consumer.metrics import ShardCollector

    def member_session() -> MemberSession | None:
        session = getattr(process, "session", None)
        return session if isinstance(session, MemberSession) else None

    http = consumer_http(
        cfg.http_port,
        cfg.http_address,
        cfg.host,
        process.ready_reason,
        [ShardCollector(process.local_replicas), LeaseCollector(member_session)],
        tls=cfg.tls,
    )
    await http.start()
    return http


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


async def run_consumer(config: ConsumerConfig) -> None:
    """Serve until SIGINT/SIGTERM (then drain and stop), or until membership is lost."""
    process = ConsumerProcess(config)
    http = await _start_http(process)
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
    if ended.done() and ended.exception() is not None:
        stopping.cancel()
        log.error("leaving the consumer group", extra={"error": str(ended.exception())})
        process.not_ready = "stopping"
        if http is not None:
            await http.stop()
        await process.stop(failed=True)
        raise ConsumerFailed(str(ended.exception()))
    if stopping.done():
        process.not_ready = "draining"
        await process.drain()
    ended.cancel()
    stopping.cancel()
    process.not_ready = "stopping"
    if http is not None:
        await http.stop()
    await process.stop()


def _duration(ctx: click.Context, param: click.Parameter, value: object) -> float:
    """Seconds of a Go-style duration ("20s", "500ms", "1m30s"); a bare number is seconds."""
    try:
        return parse_seconds(str(value))
    except ValidationError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _options(with_app: bool) -> list[Any]:
    opts: list[Any] = []
    if with_app:
        opts.append(
            click.option(
                "--app",
                "app_spec",
                required=True,
                envvar="CONSUMER_APP",
                help="The application, as package.module:factory.",
            )
        )
    opts += [
        click.option(
            "--broker",
            default="http://localhost:8080",
            envvar="BROKER_ADDRESS",
            show_default=True,
            help="Broker to read and append journals through.",
        ),
        click.option(
            "--etcd",
            "etcd_url",
            default="",
            envvar="ETCD_ADDRESS",
            help="etcd URL; without it, an embedded keyspace under --data-dir (one process).",
        ),
        click.option(
            "--etcd-prefix",
            default="",
            envvar="CONSUMER_ETCD_PREFIX",
            help=f"Keyspace root of this consumer group [default: {DEFAULT_CONSUMER_PREFIX}/"
            "<app module>].",
        ),
        click.option("--host", default="127.0.0.1", show_default=True, help="Listen address."),
        click.option(
            "--port", type=click.IntRange(0, 65535), default=8081, show_default=True
        ),
        click.option("--advertise", default="", help="Endpoint peers reach this process at."),
        click.option("--zone", default="local", show_default=True, envvar="CONSUMER_ZONE"),
        click.option("--id", "member_id", default="", envvar="CONSUMER_ID", help="Member ID."),
        click.option(
            "--data-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=Path("./consumer-data"),
            show_default=True,
        ),
        click.option("--shard-limit", type=click.IntRange(0), default=1024, show_default=True),
        click.option("--lease-ttl", default="20s", show_default=True, callback=_duration),
        click.option(
            "--hints-interval",
            default="5s",
            show_default=True,
            callback=_duration,
            help="How often a primary stores its recorded FSM hints.",
        ),
        click.option(
            "--http-port",
            type=click.IntRange(0, 65535),
            default=0,
            show_default=True,
            envvar="CONSUMER_HTTP_PORT",
            help="Port for HTTP: /metrics, /debug/ready, /debug/live (0: off).",
        ),
        click.option(
            "--http-address",
            default="",
            help="Interface address of the HTTP port [default: --host].",
        ),
        log_options,
        server_tls_flags("CONSUMER"),
        client_tls_flags("broker", "BROKER", "brokers"),
        client_tls_flags("etcd", "ETCD", "etcd"),
        click.option(
            "--auth-keys",
            default="",
            envvar=[AUTH_KEYS_ENV, "CONSUMER_AUTH_KEYS"],
            metavar="KEYS",
            help="Base64 keys (whitespace or comma separated): verify Shard RPCs (any key) and "
            "sign this process's RPCs to brokers and peers (the first); `AA==` lets requests "
            "without a token through (also $AUTH_KEYS).",
        ),
    ]
    return opts


F = TypeVar("F", bound=Callable[..., Any])


def _with_options(with_app: bool) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        for opt in reversed(_options(with_app)):
            fn = opt(fn)
        return fn

    return decorate


def _serve(app: Application, app_name: str, **kw: Any) -> None:
    from pygazette.keyspace.keyspace import KeyspaceUnavailable

    configure_from_options(kw.get("log_level"), kw.get("log_format") or "text")
    prefix = kw["etcd_prefix"] or f"{DEFAULT_CONSUMER_PREFIX}/{app_name}"
    config = ConsumerConfig(
        app=app,
        broker=kw["broker"],
        etcd_url=kw["etcd_url"],
        etcd_prefix=prefix.rstrip("/"),
        host=kw["host"],
        port=kw["port"],
        advertise=kw["advertise"],
        zone=kw["zone"],
        id=kw["member_id"],
        data_dir=kw["data_dir"],
        shard_limit=kw["shard_limit"],
        lease_ttl=kw["lease_ttl"],
        hints_interval=kw["hints_interval"],
        http_port=kw.get("http_port") or 0,
        http_address=kw.get("http_address") or "",
        auth_keys=kw.get("auth_keys") or "",
    )
    if config.auth_keys:
        try:
            parse_auth_keys(config.auth_keys)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--auth-keys") from None
    config.tls, config.peer_tls = server_tls_from_flags(kw)
    config.broker_tls = client_tls_from_flags(kw, "broker")
    config.etcd_tls = client_tls_from_flags(kw, "etcd")
    if config.broker_tls is not None and not config.broker.startswith("https://"):
        raise click.UsageError("--broker-* TLS files need an https:// --broker URL")
    if config.etcd_tls is not None and not config.etcd_url.startswith("https://"):
        raise click.UsageError("--etcd-* TLS files need an https:// --etcd URL")
    try:
        asyncio.run(run_consumer(config))
    except (ConsumerFailed, KeyspaceUnavailable, OSError, TLSConfigError) as exc:
        raise click.ClickException(str(exc)) from None


@click.command("serve")
@_with_options(with_app=True)
def serve(app_spec: str, **kw: Any) -> None:
    """Run a consumer process of an application (package.module:factory)."""
    app = load_app(app_spec)
    _serve(app, app_spec.partition(":")[0].replace(".", "-"), **kw)


def run(app: Application, argv: Sequence[str] | None = None, *, name: str = "") -> None:
    """Serve `app` from its own `__main__`, taking the same flags as `consumer serve`."""
    app_name = name or type(app).__module__.replace(".", "-").replace("_", "-")

    @click.command()
    @_with_options(with_app=False)
    def main(**kw: Any) -> None:
        _serve(app, app_name, **kw)

    main.main(args=list(argv) if argv is not None else None, prog_name=sys.argv[0])
