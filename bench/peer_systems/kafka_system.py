"""Apache Kafka 4.x in KRaft mode under the peer benchmark: one broker, or three with
replication factor 3 and `min.insync.replicas=2`; every node is broker and controller.

The broker jars come from Maven Central (bench/kafka/pom.xml, `mvn
dependency:copy-dependencies`) into a cache outside the repository
(`~/.cache/pygazette/kafka/<version>`, or $PYGAZETTE_KAFKA_JARS) and run with `java -cp`.
The client is `confluent-kafka` (librdkafka): producers with `acks=all` and the client's
default batching (`linger.ms=5`) for throughput, `linger.ms=0` for the latency workload;
consumers `assign` the partition from the beginning (no group rebalance to wait for) with
`fetch.wait.max.ms=10` (the default, 500, holds an empty fetch for half a second).
Kafka acknowledges once the in-sync replicas have the batch in their page cache (no fsync,
Kafka's default): the same durability class as pygazette's default.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from peer_systems.processes import ServerPort, ServerProcess, start_retrying
from peer_systems.system import Message, OnMessage, StopTail, System

KAFKA_VERSION = "4.1.1"
POM = Path(__file__).resolve().parent.parent / "kafka" / "pom.xml"
MAX_MESSAGE = 16 << 20
FETCH_TIMEOUT = 300.0  # Seconds `mvn` may take to fill the jar cache.
JVM_OPTS = [
    "-Xms768m",
    "-Xmx768m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
]


def jar_dir() -> Path:
    env = os.environ.get("PYGAZETTE_KAFKA_JARS")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "pygazette" / "kafka" / KAFKA_VERSION


def fetch_jars(target: Path, timeout: float = FETCH_TIMEOUT) -> str | None:
    """Fill `target` with the broker's jars through mvn; why it could not, or None."""
    if any(target.glob(f"kafka_2.13-{KAFKA_VERSION}.jar")):
        return None
    mvn = shutil.which("mvn")
    if mvn is None:
        return f"no Kafka jars in {target} and no mvn to fetch them"
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        done = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(POM),
                f"-Dkafka.version={KAFKA_VERSION}",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={partial}",
                "dependency:copy-dependencies",
            ],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"mvn did not fetch the Kafka jars within {timeout:.0f}s"
    if done.returncode != 0:
        return "mvn could not fetch the Kafka jars: " + done.stdout.decode()[-500:]
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return None


class KafkaSystem(System):
    def __init__(self, brokers: int) -> None:
        assert brokers in (1, 3)
        self.brokers = brokers
        self.name = f"kafka-{brokers}"
        self.procs: list[ServerProcess] = []
        self.bootstrap = ""
        self.producer: Any = None
        self.latency_producer: Any = None
        self.errors: list[str] = []
        self.prepared: dict[str, Any] = {}  # Connected consumers, by topic.

    def prepare(self) -> str | None:
        if shutil.which("java") is None:
            return "java is not installed (.ci/install-system-deps installs it)"
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            return "confluent-kafka is not installed (pip install -e '.[dev]')"
        return fetch_jars(jar_dir())

    def server_pids(self) -> list[int]:
        return [p.proc.pid for p in self.procs if p.proc is not None and p.proc.poll() is None]

    def settings(self) -> dict[str, Any]:
        import confluent_kafka

        return {
            "servers": self.brokers,
            "version": KAFKA_VERSION,
            "mode": "KRaft, combined broker+controller nodes",
            "replication": self.brokers,
            "min_insync_replicas": 2 if self.brokers == 3 else 1,
            "durability": "acks=all; page cache (no fsync, Kafka's default)",
            "client": f"confluent-kafka {confluent_kafka.version()[0]} "
            f"(librdkafka {confluent_kafka.libversion()[0]}); produce() per message, "
            "linger.ms=5 (default) for throughput, 0 for latency; consumer assign() with "
            "fetch.wait.max.ms=10",
            "compression": "none",
        }

    async def start(self, tmp: Path) -> None:
        java = shutil.which("java")
        assert java is not None
        # (client, controller) ports of each broker; all move if one was taken.
        ports = [(ServerPort(), ServerPort()) for _ in range(self.brokers)]
        await asyncio.to_thread(
            start_retrying,
            lambda: self._start_brokers(java, tmp, [(c.peek(), k.peek()) for c, k in ports]),
            [p for pair in ports for p in pair],
        )
        self.bootstrap = ",".join(f"127.0.0.1:{c.number}" for c, _ in ports)
        await asyncio.to_thread(self._wait_brokers)
        self.producer = self._producer(linger_ms=5)
        self.latency_producer = self._producer(linger_ms=0)

    def _start_brokers(self, java: str, tmp: Path, ports: list[tuple[int, int]]) -> None:
        """Format and start every broker on `ports`, and wait until each listens (all stopped
        again if one fails: a retry starts the cluster afresh on other ports)."""
        classpath = str(jar_dir() / "*")
        voters = ",".join(f"{i}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports, start=1))
        cluster_id = _cluster_id()
        rf = self.brokers
        try:
            for i, (port, controller) in enumerate(ports, start=1):
                shutil.rmtree(tmp / f"kafka-{i}", ignore_errors=True)  # An earlier try's.
                props = tmp / f"kafka-{i}.properties"
                props.write_text(
                    "\n".join(
                        [
                            "process.roles=broker,controller",
                            f"node.id={i}",
                            f"controller.quorum.voters={voters}",
                            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
                            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
                            "controller.listener.names=CONTROLLER",
                            "inter.broker.listener.name=PLAINTEXT",
                            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                            f"log.dirs={tmp / f'kafka-{i}'}",
                            f"offsets.topic.replication.factor={rf}",
                            f"transaction.state.log.replication.factor={rf}",
                            f"transaction.state.log.min.isr={min(rf, 2)}",
                            f"default.replication.factor={rf}",
                            f"min.insync.replicas={min(rf, 2)}",
                            "group.initial.rebalance.delay.ms=0",
                            "auto.create.topics.enable=false",
                            f"message.max.bytes={MAX_MESSAGE}",
                            f"replica.fetch.max.bytes={MAX_MESSAGE}",
                            "",
                        ]
                    )
                )
                for _attempt in range(3):  # A JVM tool on a loaded machine: again.
                    fmt = subprocess.run(
                        [java, "-cp", classpath, "kafka.tools.StorageTool", "format", "-t",
                         cluster_id, "-c", str(props)],
                        capture_output=True,
                        check=False,
                    )  # fmt: skip
                    if fmt.returncode == 0:
                        break
                    shutil.rmtree(tmp / f"kafka-{i}", ignore_errors=True)
                else:
                    raise RuntimeError(
                        f"kafka-storage format failed (exit {fmt.returncode}):\n"
                        f"{fmt.stdout[-2000:]!r}\n{fmt.stderr[-2000:]!r}"
                    )
                proc = ServerProcess(
                    f"{self.name}-{i}",
                    [java, *JVM_OPTS, "-cp", classpath, "kafka.Kafka", str(props)],
                    tmp / f"kafka-{i}.log",
                )
                self.procs.append(proc)
                proc.start()
            for proc, (port, _) in zip(self.procs, ports, strict=True):
                proc.wait_listening(port, 120.0)
        except BaseException:
            for proc in self.procs:
                proc.stop(10.0)
            self.procs.clear()
            raise

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def _wait_brokers(self) -> None:
        admin = self._admin()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                meta = admin.list_topics(timeout=5)
                if len(meta.brokers) == self.brokers:
                    return
            except Exception:  # not up yet
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name}: brokers did not register")

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def _producer(self, linger_ms: int) -> Any:
        from confluent_kafka import Producer

        return Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "linger.ms": linger_ms,
                "message.max.bytes": MAX_MESSAGE + 4096,
                "delivery.report.only.error": True,
                "on_delivery": self._on_delivery,
            }
        )

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "max.partition.fetch.bytes": MAX_MESSAGE,
                "fetch.max.bytes": 4 * MAX_MESSAGE,
                "receive.message.max.bytes": 4 * MAX_MESSAGE + 4096,
                "fetch.wait.max.ms": 10,
            }
        )

    async def stop(self) -> None:
        for consumer in self.prepared.values():  # Of a run that failed before its read.
            await asyncio.to_thread(consumer.close)
        self.prepared.clear()
        for p in (self.producer, self.latency_producer):
            if p is not None:
                await asyncio.to_thread(p.flush, 10)
                await asyncio.to_thread(p.close)
        self.producer = self.latency_producer = None
        for proc in self.procs:  # All at once: a lone controller would wait for a quorum.
            proc.terminate()
        for proc in self.procs:
            await asyncio.to_thread(proc.stop, 15.0)

    async def create(self, log: str, large: bool) -> None:
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        admin = self._admin()
        futures = admin.create_topics(
            [NewTopic(log, num_partitions=1, replication_factor=self.brokers)],
            operation_timeout=30,
        )
        for f in futures.values():
            await asyncio.wrap_future(f)
        await asyncio.to_thread(self._wait_leader, log)

    def _wait_leader(self, topic: str) -> None:
        admin = self._admin()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            t = admin.list_topics(topic, timeout=5).topics.get(topic)
            if t is not None and t.error is None and 0 in t.partitions:
                p = t.partitions[0]
                if p.leader >= 0 and len(p.isrs) == self.brokers:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: topic {topic} has no leader")

    def _check(self) -> None:
        if self.errors:
            raise RuntimeError(f"{self.name}: {len(self.errors)} failed: {self.errors[0]}")

    async def publish(self, log: str, msgs: Sequence[Message]) -> None:
        def run() -> None:
            produce, poll, dumps = self.producer.produce, self.producer.poll, orjson.dumps
            for m in msgs:
                data = dumps(m)
                while True:
                    try:
                        produce(log, data)
                        break
                    except BufferError:
                        poll(0.005)
            self.producer.flush()

        await asyncio.to_thread(run)
        self._check()

    async def prepare_consume(self, log: str) -> None:
        def connect() -> Any:
            consumer = self._consumer()
            consumer.list_topics(log, timeout=30)  # Connected, with the topic's metadata.
            return consumer

        self.prepared[log] = await asyncio.to_thread(connect)

    async def consume(self, log: str, count: int) -> int:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        def run() -> int:
            consumer = self.prepared.pop(log, None) or self._consumer()
            consumer.assign([TopicPartition(log, 0, OFFSET_BEGINNING)])
            n = nbytes = 0
            loads = orjson.loads
            deadline = time.monotonic() + 60
            try:
                while n < count:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{self.name}: read {n} messages of {count}")
                    # consume() returns when it has num_messages or after the timeout.
                    for msg in consumer.consume(10_000, 0.05):
                        if msg.error() is not None:
                            raise RuntimeError(str(msg.error()))
                        value = msg.value()
                        loads(value)
                        nbytes += len(value)
                        n += 1
            finally:
                consumer.close()
            return nbytes

        return await asyncio.to_thread(run)

    async def tail(self, log: str, on_message: OnMessage) -> StopTail:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        stopping = threading.Event()
        consumer = self._consumer()
        consumer.assign([TopicPartition(log, 0, OFFSET_BEGINNING)])

        def run() -> None:
            loads = orjson.loads
            while not stopping.is_set():
                msg = consumer.poll(0.1)  # Returns as soon as a message is delivered.
                if msg is not None and msg.error() is None:
                    on_message(loads(msg.value()))
            consumer.close()

        thread = threading.Thread(target=run, name=f"{self.name}-tail", daemon=True)
        thread.start()

        async def stop() -> None:
            stopping.set()
            await asyncio.to_thread(thread.join)

        return stop

    async def send(self, log: str, msg: Message) -> None:
        self.latency_producer.produce(log, orjson.dumps(msg))
        self.latency_producer.poll(0)

    async def flush(self, log: str) -> None:
        await asyncio.to_thread(self.latency_producer.flush)
        self._check()


def _cluster_id() -> str:
    """A random cluster ID as Kafka makes them (`Uuid.randomUuid`): URL-safe base64 of 16
    bytes, never starting with "-", which `kafka-storage format --cluster-id` would take for
    an option (one ID in 64 did, failing the format)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
