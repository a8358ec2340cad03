"""The interface every system under test implements for bench/peers.py: start its servers,
create a log (journal, topic, stream), publish messages until all are acknowledged, read
them back from the start, and tail a log while a paced publisher sends to it.

A message is a JSON object (a dict) with an integer field "n", its index in the workload.
Publishers encode it (pygazette's Publisher does so itself; peers with orjson) and
consumers decode it, so every system pays the same JSON cost on both sides.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

Message = dict[str, Any]
OnMessage = Callable[[Message], None]
StopTail = Callable[[], Awaitable[None]]


class System(abc.ABC):
    """One system under test, in one configuration (e.g. Kafka with three brokers)."""

    #: Short name used as the key of its figures, e.g. "kafka-3".
    name: str = ""

    def prepare(self) -> str | None:
        """Make the system runnable here (e.g. fetch its jars, time-boxed); returns why it
        cannot run (a server binary is missing), or None."""
        return None

    def server_pids(self) -> list[int]:
        """The process IDs of every server process of the system running now (brokers,
        etcd, controllers): the benchmark charges each workload their CPU."""
        return []

    @abc.abstractmethod
    def settings(self) -> dict[str, Any]:
        """Server version, client, durability and batching settings, for the JSON output."""

    @abc.abstractmethod
    async def start(self, tmp: Path) -> None:
        """Start the servers (data under `tmp`) and connect the clients."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Close the clients and stop every process started."""

    @abc.abstractmethod
    async def create(self, log: str, large: bool) -> None:
        """Create an empty log; `large`: it holds 1 MiB records."""

    @abc.abstractmethod
    async def publish(self, log: str, msgs: Sequence[Message]) -> None:
        """Publish every message as fast as the client allows; return once all are
        acknowledged by the server with the system's durability setting."""

    async def prepare_consume(self, log: str) -> None:
        """Before `consume` is timed: set up what a reader already has when it starts
        reading (a connected client). pygazette's, NATS' and Redis' clients are connected
        already; Kafka's consumer is a new client of its own."""
        return None

    @abc.abstractmethod
    async def consume(self, log: str, count: int) -> int:
        """Read `count` messages from the start of the log, decoding each; returns the
        bytes of message content read."""

    @abc.abstractmethod
    async def tail(self, log: str, on_message: OnMessage) -> StopTail:
        """Start a consumer of the log from its beginning, calling `on_message` with each
        decoded message as soon as it is delivered; returns a function that stops it."""

    @abc.abstractmethod
    async def send(self, log: str, msg: Message) -> None:
        """Publish one message without waiting for its acknowledgement (latency
        workload: the consumer's delivery time is what is measured)."""

    @abc.abstractmethod
    async def flush(self, log: str) -> None:
        """Wait until every message sent is acknowledged."""
