"""NATS JetStream under the peer benchmark: one `nats-server -js` with file storage in a
temporary directory, a stream per log (one subject, replicas 1), through `nats-py`.

Publishing uses `publish_async` (acknowledgements awaited together, at most the client's
default pending window in flight), reading an ordered push consumer from the start (the
client's fast path for replaying a stream). JetStream acknowledges a publish once the
message is written to the stream's file (fsync every `sync_interval`, 2 minutes by
default): the same durability class as the other systems' defaults.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from peer_systems.processes import ServerProcess, start_server
from peer_systems.system import Message, OnMessage, StopTail, System

MAX_PAYLOAD = 8 << 20


def nats_binary() -> str | None:
    # Debian installs it into /usr/sbin, which is not on every user's PATH.
    return shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin")


class NatsSystem(System):
    name = "nats"

    def __init__(self) -> None:
        self.proc: ServerProcess | None = None
        self.nc: Any = None
        self.js: Any = None
        self.futures: list[asyncio.Future[Any]] = []

    def prepare(self) -> str | None:
        if nats_binary() is None:
            return "nats-server is not installed (.ci/install-system-deps installs it)"
        try:
            import nats  # noqa: F401
        except ImportError:
            return "nats-py is not installed (pip install -e '.[dev]')"
        return None

    def server_pids(self) -> list[int]:
        proc = self.proc.proc if self.proc is not None else None
        return [proc.pid] if proc is not None and proc.poll() is None else []

    def settings(self) -> dict[str, Any]:
        binary = nats_binary()
        assert binary is not None
        version = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        return {
            "servers": 1,
            "version": version,
            "replication": 1,
            "durability": "JetStream file storage; acknowledged once written to the "
            "stream's file (fsync every sync_interval, 2 min default)",
            "client": f"nats-py {metadata.version('nats-py')}; publish_async + "
            "publish_async_completed, ordered push consumer",
            "compression": "none",
        }

    async def start(self, tmp: Path) -> None:
        import nats

        binary = nats_binary()
        assert binary is not None
        conf = tmp / "nats.conf"

        def server(port: int) -> ServerProcess:
            conf.write_text(
                f"listen: 127.0.0.1:{port}\n"
                f"max_payload: {MAX_PAYLOAD}\n"
                f'jetstream {{ store_dir: "{tmp / "jetstream"}" }}\n'
            )
            return ServerProcess(self.name, [binary, "-js", "-c", str(conf)], tmp / "nats.log")

        self.proc, port = await asyncio.to_thread(start_server, server)
        self.nc = await nats.connect(f"nats://127.0.0.1:{port}", max_reconnect_attempts=0)
        self.js = self.nc.jetstream(timeout=30)

    async def stop(self) -> None:
        if self.nc is not None:
            await self.nc.close()
        if self.proc is not None:
            await asyncio.to_thread(self.proc.stop)

    async def create(self, log: str, large: bool) -> None:
        from nats.js.api import StorageType

        await self.js.add_stream(name=log, subjects=[log], storage=StorageType.FILE)

    async def _settle(self) -> None:
        await self.js.publish_async_completed()
        futures, self.futures = self.futures, []
        for f in futures:
            f.result()  # Raises the first failed publish.

    async def publish(self, log: str, msgs: Sequence[Message]) -> None:
        publish, dumps, futures = self.js.publish_async, orjson.dumps, self.futures
        for m in msgs:
            futures.append(await publish(log, dumps(m)))
        await self._settle()

    async def consume(self, log: str, count: int) -> int:
        sub = await self.js.subscribe(log, ordered_consumer=True)
        n = nbytes = 0
        loads = orjson.loads
        try:
            while n < count:
                msg = await sub.next_msg(timeout=10)
                loads(msg.data)
                nbytes += len(msg.data)
                n += 1
        finally:
            await sub.unsubscribe()
        return nbytes

    async def tail(self, log: str, on_message: OnMessage) -> StopTail:
        loads = orjson.loads

        async def cb(msg: Any) -> None:
            on_message(loads(msg.data))

        sub = await self.js.subscribe(log, ordered_consumer=True, cb=cb)

        async def stop() -> None:
            await sub.unsubscribe()

        return stop

    async def send(self, log: str, msg: Message) -> None:
        self.futures.append(await self.js.publish_async(log, orjson.dumps(msg)))

    async def flush(self, log: str) -> None:
        await self._settle()
