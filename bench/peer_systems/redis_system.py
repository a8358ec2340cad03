"""Redis Streams under the peer benchmark: one `redis-server` with `appendonly yes` and
`appendfsync everysec` (its usual durable setting) in a temporary directory, a stream per
log, through `redis-py`'s asyncio client.

Publishing pipelines XADDs (1000 small or 8 large messages per round trip, no MULTI),
reading pages through XRANGE (1000 entries per call), tailing blocks on XREAD. Redis
acknowledges an XADD once it is in memory and the AOF buffer; the AOF is written on each
event-loop turn and fsynced every second.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from peer_systems.processes import ServerProcess, start_server
from peer_systems.system import Message, OnMessage, StopTail, System

FIELD = b"m"
PIPELINE_SMALL = 1000
PIPELINE_LARGE = 8


class RedisSystem(System):
    name = "redis"

    def __init__(self) -> None:
        self.proc: ServerProcess | None = None
        self.port = 0
        self.client: Any = None
        self.large: dict[str, bool] = {}

    def prepare(self) -> str | None:
        if shutil.which("redis-server") is None:
            return "redis-server is not installed (.ci/install-system-deps installs it)"
        try:
            import redis  # noqa: F401
        except ImportError:
            return "redis (redis-py) is not installed (pip install -e '.[dev]')"
        return None

    def server_pids(self) -> list[int]:
        proc = self.proc.proc if self.proc is not None else None
        return [proc.pid] if proc is not None and proc.poll() is None else []

    def settings(self) -> dict[str, Any]:
        import redis

        version = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        return {
            "servers": 1,
            "version": version,
            "replication": 1,
            "durability": "appendonly yes, appendfsync everysec",
            "client": f"redis-py {redis.__version__} (asyncio); pipelined XADD "
            f"({PIPELINE_SMALL} small / {PIPELINE_LARGE} large per round trip), "
            "XRANGE pages, XREAD BLOCK",
            "compression": "none",
        }

    async def start(self, tmp: Path) -> None:
        import redis.asyncio as aredis

        binary = shutil.which("redis-server")
        assert binary is not None
        (tmp / "redis").mkdir()

        def server(port: int) -> ServerProcess:
            return ServerProcess(
                self.name,
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(tmp / "redis"),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                    "--save",
                    "",
                    "--protected-mode",
                    "no",
                ],
                tmp / "redis.log",
            )

        self.proc, self.port = await asyncio.to_thread(start_server, server)
        self.client = aredis.Redis(host="127.0.0.1", port=self.port)
        await self.client.ping()

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        if self.proc is not None:
            await asyncio.to_thread(self.proc.stop)

    async def create(self, log: str, large: bool) -> None:
        self.large[log] = large
        await self.client.delete(log)

    async def publish(self, log: str, msgs: Sequence[Message]) -> None:
        step = PIPELINE_LARGE if self.large[log] else PIPELINE_SMALL
        dumps = orjson.dumps
        for i in range(0, len(msgs), step):
            pipe = self.client.pipeline(transaction=False)
            for m in msgs[i : i + step]:
                pipe.xadd(log, {FIELD: dumps(m)})
            await pipe.execute()

    async def consume(self, log: str, count: int) -> int:
        n = nbytes = 0
        start: bytes | str = "-"
        loads = orjson.loads
        while n < count:
            entries = await self.client.xrange(log, min=start, count=1000)
            if not entries:
                raise RuntimeError(f"{self.name}: read {n} messages of {count}")
            for _id, fields in entries:
                data = fields[FIELD]
                loads(data)
                nbytes += len(data)
            n += len(entries)
            start = b"(" + entries[-1][0]
        return nbytes

    async def tail(self, log: str, on_message: OnMessage) -> StopTail:
        import redis.asyncio as aredis

        reader = aredis.Redis(host="127.0.0.1", port=self.port)
        loads = orjson.loads

        stopping = asyncio.Event()

        async def run() -> None:
            last: bytes | str = "0"
            while not stopping.is_set():
                # A short block, and a flag to stop: redis-py does not take a cancellation
                # of a blocked XREAD well.
                resp: Any = await reader.xread({log: last}, count=1000, block=100)
                for _stream, entries in resp:
                    for entry_id, fields in entries:
                        on_message(loads(fields[FIELD]))
                        last = entry_id

        task = asyncio.create_task(run())

        async def stop() -> None:
            stopping.set()
            await task
            await reader.aclose()

        return stop

    async def send(self, log: str, msg: Message) -> None:
        # The XADD's reply is its acknowledgement: a Redis producer awaits it (one round
        # trip on loopback, far shorter than the pacing interval).
        await self.client.xadd(log, {FIELD: orjson.dumps(msg)})

    async def flush(self, log: str) -> None:
        return None
