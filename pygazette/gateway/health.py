"""Health for orchestrators: `/debug/live` and `/debug/ready`.

Liveness is answering at all: the handler runs on the server's event loop, so a 200 says the
loop turns. Readiness is the server's own say: a `Readiness` callable returns None when the
process serves (a broker recovered its spools and joined its cluster; a consumer joined its
group and its shards settled), else why not — "starting", "draining", … — which `/debug/ready`
answers with a 503.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

# None: ready. Otherwise why the process is not (yet, or any more) ready.
Readiness = Callable[[], str | None]


class ReadyState:
    """A settable readiness: "starting" until `ready()`, then ready until `draining()`."""

    def __init__(self) -> None:
        self.reason: str | None = "starting"

    def ready(self) -> None:
        self.reason = None

    def not_ready(self, reason: str) -> None:
        self.reason = reason

    def __call__(self) -> str | None:
        return self.reason


def health_routes(readiness: Readiness) -> list[web.RouteDef]:
    async def live(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def ready(_request: web.Request) -> web.Response:
        reason = readiness()
        if reason is None:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=f"not ready: {reason}\n")

    return [web.get("/debug/live", live), web.get("/debug/ready", ready)]
