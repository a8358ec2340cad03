"""`/metrics` (and `/debug/metrics`, Gazette's path): the process's Prometheus metrics in the
text exposition format (0.0.4).

It renders prometheus-client's default registry (every module-level metric, and the process,
platform and GC collectors: CPU seconds, resident memory, open file descriptors…), then the
`collectors` a server hands in (metrics read from its state when scraped), then preformatted
`texts` (families prometheus-client cannot name as Gazette does, such as
`gazette_journal_server_started_totals`). Collection runs on the server's event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from aiohttp import web
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


class _Chained:
    """The default registry followed by extra collectors, as one collector."""

    def __init__(self, collectors: Sequence[Collector]) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        for collector in self.collectors:
            yield from collector.collect()


class MetricsExposition:
    def __init__(
        self,
        collectors: Iterable[Collector] = (),
        texts: Iterable[Callable[[], str]] = (),
    ) -> None:
        self._chained = _Chained(list(collectors))
        self.texts = list(texts)

    def render(self) -> bytes:
        parts = [generate_latest(self._chained)]  # type: ignore[arg-type]
        parts += [text().encode() for text in self.texts]
        return b"".join(parts)

    def routes(self) -> list[web.RouteDef]:
        async def metrics(_request: web.Request) -> web.Response:
            body = self.render()
            resp = web.Response(body=body)
            resp.headers["Content-Type"] = CONTENT_TYPE_PLAIN_0_0_4
            return resp

        # Also where Gazette's servers have them, for scrapers configured for Gazette.
        return [web.get("/metrics", metrics), web.get("/debug/metrics", metrics)]
