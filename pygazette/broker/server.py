"""A broker process: configuration, start-up (recovery included) and graceful shutdown.

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
from dataclasses import dataclass
from pathlib import Path

import grpc

from pygazette.broker.append_service import AppendLimits
from pygazette.broker.flow_control import RateLimiter
from pygazette.broker.journal_service import JournalService
from pygazette.broker.persister import DEFAULT_BACKLOG_LIMIT, Persister
from pygazette.broker.resolver import BrokerIdentity, Resolver
from pygazette.broker.retention import DEFAULT_ENFORCE_INTERVAL_SECONDS, RetentionEnforcer
from pygazette.broker.retention_service import RetentionService
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.pb import retention_pb2_grpc as rpb_grpc
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


class BrokerAlreadyRunning(RuntimeError):
    pass


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

    async def start(self) -> None:
        cfg = self.config
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.file_root.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()

        self.keyspace = EmbeddedKeyspace(self.data_dir / "keyspace.json")
        self.stores = StoreRegistry(self.file_root)
        self.persister = Persister(
            self.stores, self.data_dir / "scratch", backlog_limit=cfg.spool_backlog_limit
        )
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ]
        )
        self.port = self._server.add_insecure_port(f"{cfg.host}:{cfg.port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {cfg.host}:{cfg.port}")
        endpoint = cfg.advertise_url or f"http://{cfg.host}:{self.port}"
        identity = BrokerIdentity(cfg.zone, cfg.broker_id or default_broker_id(), endpoint)
        self.resolver = Resolver(
            self.keyspace,
            identity,
            spool_root=self.data_dir / "spools",
            stores=self.stores,
            persister=self.persister,
            sync=cfg.sync,
        )
        limits = AppendLimits(cfg.min_append_rate, RateLimiter(cfg.max_append_rate))
        pb_grpc.add_JournalServicer_to_server(  # type: ignore[no-untyped-call]
            JournalService(self.resolver, self.stores, limits), self._server
        )
        rpb_grpc.add_RetentionServicer_to_server(  # type: ignore[no-untyped-call]
            RetentionService(self.resolver, self.stores), self._server
        )
        self.retention = RetentionEnforcer(self.resolver, self.stores, cfg.retention_interval)
        self.persister.start()
        self.resolver.start()  # Recovers spools left by an earlier run.
        self.retention.start()
        await self._server.start()
        log.info("broker serving", extra={"endpoint": endpoint, "data_dir": str(self.data_dir)})

    def _lock_data_dir(self) -> None:
        self._lock_fd = os.open(self.data_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise BrokerAlreadyRunning(
                f"another broker is using data directory {self.data_dir}"
            ) from None

    async def stop(self, grace: float = 5.0) -> None:
        """Stop serving, then persist open spools (bounded by `grace` seconds)."""
        if self._server is not None:
            await self._server.stop(grace)
        await self.retention.stop()
        await self.resolver.stop()
        try:
            await asyncio.wait_for(self.persister.wait_idle(), grace)
        except TimeoutError:
            log.warning("shutdown before every spool persisted; they persist on restart")
        await self.persister.stop()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    async def wait(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()


async def run_broker(config: BrokerConfig) -> None:
    """Serve until SIGINT or SIGTERM, then shut down cleanly."""
    broker = Broker(config)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.stop()
