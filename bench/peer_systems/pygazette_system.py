"""pygazette under the peer benchmark: one `pygazette serve` (replication 1, embedded
keyspace), or three brokers on a real etcd with journals at replication 3.

Publishing goes through an `AppendService` and a `Publisher` (`publish_committed_many`
in batches, as a producer of many messages would), reading through `ReadCommitted`. The
clients talk to the journal's primary, as Kafka's talk to a partition's leader. Brokers
run with their default `--no-sync` (an acknowledged append survives a broker process
crash, not a power loss: the same class as Kafka's default and Redis' `everysec`).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from peer_systems.processes import (
    ServerPort,
    ServerProcess,
    listens_on,
    start_retrying,
    start_server,
)
from peer_systems.system import Message, OnMessage, StopTail, System
from pygazette.client import AppendService, JournalClient, apply_journals
from pygazette.message import Publisher, ReadCommitted
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb

CONTENT_TYPE = "application/x-ndjson"
BATCH = 1000  # Messages per publish_committed_many call.
MiB = 1 << 20


def journal_spec(name: str, replication: int) -> pb.JournalSpec:
    spec = pb.JournalSpec(
        name=name,
        replication=replication,
        labels=label_set({"bench": "peers", "content-type": CONTENT_TYPE}),
    )
    spec.fragment.length = 512 * MiB  # Gazette's default.
    spec.fragment.compression_codec = pb.NONE  # The peers don't compress either.
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 300
    return spec


class PygazetteSystem(System):
    def __init__(self, replication: int) -> None:
        assert replication in (1, 3)
        self.replication = replication
        self.name = f"pygazette-r{replication}"
        self.procs: list[ServerProcess] = []
        self.addresses: list[str] = []
        self.admin: JournalClient | None = None
        self.clients: dict[str, JournalClient] = {}  # By journal: a client of its primary.
        self.service: AppendService | None = None
        self.publisher: Publisher | None = None
        self.large: dict[str, bool] = {}

    def prepare(self) -> str | None:
        if self.replication > 1 and shutil.which("etcd") is None:
            return "etcd is not installed (.ci/install-system-deps installs it)"
        return None

    def server_pids(self) -> list[int]:
        return [p.proc.pid for p in self.procs if p.proc is not None and p.proc.poll() is None]

    def settings(self) -> dict[str, Any]:
        return {
            "servers": 1 if self.replication == 1 else 3,
            "replication": self.replication,
            "coordination": "embedded keyspace" if self.replication == 1 else "etcd",
            "durability": "acknowledged when every replica's spool holds it (no fsync: "
            "`serve --no-sync`, the default)",
            "client": "pygazette AppendService + Publisher.publish_committed_many "
            f"({BATCH} per call); ReadCommitted",
            "compression": "none",
        }

    async def start(self, tmp: Path) -> None:
        base = [sys.executable, "-m", "pygazette.cli.main", "serve"]
        if self.replication == 1:

            def single(port: int) -> ServerProcess:
                return ServerProcess(
                    self.name,
                    [*base, "--port", str(port), "--data-dir", str(tmp / "data")],
                    tmp / "broker.log",
                )

            proc, port = await asyncio.to_thread(start_server, single)
            self.procs.append(proc)
            self.addresses.append(f"127.0.0.1:{port}")
        else:
            etcd_url = await asyncio.to_thread(self._start_etcd, tmp)

            def member(i: int, zone: str) -> Callable[[int], ServerProcess]:
                def make(port: int) -> ServerProcess:
                    return ServerProcess(
                        f"{self.name}-broker-{i}",
                        [
                            *base,
                            "--etcd",
                            etcd_url,
                            "--zone",
                            zone,
                            "--id",
                            f"broker-{i}",
                            "--port",
                            str(port),
                            "--data-dir",
                            str(tmp / f"data-{i}"),
                            "--file-root",
                            str(tmp / "store"),
                            "--lease-ttl",
                            "5s",
                        ],
                        tmp / f"broker-{i}.log",
                    )

                return make

            started = await asyncio.gather(
                *(
                    asyncio.to_thread(start_server, member(i, zone))
                    for i, zone in enumerate(("zone-a", "zone-b", "zone-a"), start=1)
                ),
                return_exceptions=True,
            )
            for result in started:  # Every started one, to be stopped even if one failed.
                if not isinstance(result, BaseException):
                    self.procs.append(result[0])
                    self.addresses.append(f"127.0.0.1:{result[1]}")
            for result in started:
                if isinstance(result, BaseException):
                    raise result
        self.admin = JournalClient(self.addresses[0])

    def _start_etcd(self, tmp: Path) -> str:
        binary = shutil.which("etcd")
        assert binary is not None
        client, peer = ServerPort(), ServerPort()
        return start_retrying(
            lambda: self._start_etcd_on(binary, tmp, client.peek(), peer.peek()), [client, peer]
        )

    def _start_etcd_on(self, binary: str, tmp: Path, client: int, peer: int) -> str:
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        shutil.rmtree(tmp / "etcd", ignore_errors=True)  # An earlier try's.
        proc = ServerProcess(
            "etcd",
            [
                binary,
                "--name=bench",
                f"--data-dir={tmp / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=bench={peer_url}",
                "--log-level=warn",
            ],
            tmp / "etcd.log",
        )
        proc.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                proc.check_running()
            except BaseException:
                proc.stop(5.0)
                raise
            assert proc.proc is not None
            if not listens_on(proc.proc.pid, client):  # Not another etcd on the port.
                time.sleep(0.05)
                continue
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                    if b'"true"' in resp.read():
                        self.procs.append(proc)
                        return url
            except OSError:
                time.sleep(0.05)
        error = proc.not_ready("did not become healthy")
        proc.stop(5.0)
        raise error

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.close(cancel=True)
        for client in {id(c): c for c in self.clients.values()}.values():
            await client.close()
        if self.admin is not None:
            await self.admin.close()
        for proc in reversed(self.procs):
            await asyncio.to_thread(proc.stop, 5.0)

    async def create(self, log: str, large: bool) -> None:
        assert self.admin is not None
        name = f"bench/peers/{log}"
        self.large[log] = large
        await apply_journals(
            self.admin,
            [
                pb.ApplyRequest.Change(
                    upsert=journal_spec(name, self.replication), expect_mod_revision=0
                )
            ],
        )
        primary = await self._wait_ready(name)
        client = JournalClient(primary)
        self.clients[log] = client
        # One AppendService/Publisher per journal's primary (every workload has its own).
        if self.service is not None:
            await self.service.close()
        self.service = AppendService(client)
        self.publisher = Publisher(self.service)

    async def _wait_ready(self, name: str) -> str:
        """The journal's primary address, once it has a full route and takes appends."""
        assert self.admin is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            async for resp in self.admin.rpc_list(
                pb.ListRequest(selector=pb.LabelSelector()), timeout=10
            ):
                for j in resp.journals:
                    route = j.route
                    if (
                        j.spec.name == name
                        and len(route.members) == self.replication
                        and route.primary >= 0
                    ):
                        address = route.endpoints[route.primary].removeprefix("http://")
                        if await self._appends(address, name):
                            return address
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{name} is not ready")

    @staticmethod
    async def _appends(address: str, name: str) -> bool:
        async with JournalClient(address) as client:

            async def reqs() -> Any:
                yield pb.AppendRequest(journal=name)
                yield pb.AppendRequest()

            try:
                resp = await client.stub.Append(reqs(), timeout=10)
            except Exception:  # not ready yet
                return False
            return bool(resp.status == pb.OK)

    def _mapping(self, log: str) -> Any:
        target = (f"bench/peers/{log}", CONTENT_TYPE)
        return lambda _msg: target

    async def publish(self, log: str, msgs: Sequence[Message]) -> None:
        assert self.publisher is not None and self.service is not None
        mapping = self._mapping(log)
        many = self.publisher.publish_committed_many
        step = 1 if self.large[log] else BATCH
        for i in range(0, len(msgs), step):
            many(mapping, msgs[i : i + step])
            await asyncio.sleep(0)  # Let the dispatchers run.
        await self.service.wait_all()

    async def consume(self, log: str, count: int) -> int:
        client = self.clients[log]
        n = nbytes = 0
        async with ReadCommitted(client, f"bench/peers/{log}") as it:
            while n < count:
                try:
                    batch = await it.next_batch()
                except StopAsyncIteration:
                    break
                n += len(batch)
                for env in batch:
                    nbytes += env.end - env.begin
        if n != count:
            raise RuntimeError(f"{self.name}: read {n} messages of {count}")
        return nbytes

    async def tail(self, log: str, on_message: OnMessage) -> StopTail:
        client = self.clients[log]
        it = ReadCommitted(client, f"bench/peers/{log}", block=True)

        async def run() -> None:
            while True:
                for env in await it.next_batch():
                    on_message(env.message)

        task = asyncio.create_task(run())

        async def stop() -> None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            await it.aclose()

        return stop

    async def send(self, log: str, msg: Message) -> None:
        assert self.publisher is not None
        self.publisher.publish_committed(self._mapping(log), msg)

    async def flush(self, log: str) -> None:
        assert self.service is not None
        await self.service.wait_all()
