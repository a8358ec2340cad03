"""The HTTP server's health and metrics endpoints, served for real on a loopback port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from pygazette.broker.rpc_metrics import RpcCounters
from pygazette.gateway.exposition import MetricsExposition
from pygazette.gateway.health import ReadyState
from pygazette.gateway.http_server import HttpServer
from tests.support.http_scrape import get


class _Answer:
    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("test_answer", "A collector handed to the server.", value=42)


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, ReadyState, RpcCounters]]:
    ready = ReadyState()
    counters = RpcCounters()
    server = HttpServer.for_server(
        readiness=ready, metrics=MetricsExposition([_Answer()], [counters.exposition])
    )
    port = await server.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", ready, counters
    finally:
        await server.stop()


async def test_readiness_follows_the_server(served: tuple[str, ReadyState, RpcCounters]) -> None:
    base, ready, _ = served
    assert await asyncio.to_thread(get, base + "/debug/live") == (200, b"ok\n")
    assert await asyncio.to_thread(get, base + "/debug/ready") == (503, b"not ready: starting\n")
    ready.ready()
    assert await asyncio.to_thread(get, base + "/debug/ready") == (200, b"ready\n")
    ready.not_ready("draining")
    assert await asyncio.to_thread(get, base + "/debug/ready") == (503, b"not ready: draining\n")
    # No journal gateway on this server: other paths are not found.
    assert (await asyncio.to_thread(get, base + "/some/journal"))[0] == 404


async def test_metrics_exposition(served: tuple[str, ReadyState, RpcCounters]) -> None:
    base, _, counters = served
    counters.start("Read")
    counters.complete("Read", 'odd "status"\n')
    status, body = await asyncio.to_thread(get, base + "/metrics")
    assert status == 200
    text = body.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["test_answer"].samples[0].value == 42
    assert families["process_open_fds"].samples[0].value > 0
    completed = families["gazette_journal_server_completed_totals"]
    assert completed.type == "counter"
    assert [(s.labels, s.value) for s in completed.samples] == [
        ({"operation": "Read", "status": 'odd "status"\n'}, 1.0)
    ]
    assert 'gazette_journal_server_started_totals{operation="Read"} 1.0\n' in text
    # Also at Gazette's path, for scrapers configured for Gazette's servers.
    status, body = await asyncio.to_thread(get, base + "/debug/metrics")
    assert status == 200
    assert {f.name for f in text_string_to_metric_families(body.decode())} == set(families)
