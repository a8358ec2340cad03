"""A server's HTTP port (`--http-port`): an aiohttp server for `/metrics`, `/debug/live`,
`/debug/ready`, Gazette's JSON API under `/v1/` (`json_api`: journals on a broker, shards on a
consumer) and, on a broker, the journal gateway on every other path (on a consumer, Go's
ServeMux's answers: an unclean path redirected, else 404 page not found).

Given an `ssl.SSLContext` (the server's TLS material; it asks for and verifies client
certificates when the server runs mTLS) it serves HTTPS.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterable

from aiohttp import web

from pygazette.client.journal_client import JournalClient
from pygazette.gateway.exposition import MetricsExposition
from pygazette.gateway.health import Readiness, health_routes
from pygazette.gateway.journal_gateway import JournalGateway
from pygazette.gateway.json_api import JsonApi, clean_path, redirect

log = logging.getLogger(__name__)

# On shutdown, how long open requests (blocking reads) may take to finish before they are
# cancelled.
SHUTDOWN_TIMEOUT = 1.0


async def _not_found(request: web.Request) -> web.Response:
    """Any other path, as Go's ServeMux answers it: an unclean one redirected to its clean
    form, else http.NotFound."""
    clean = clean_path(request.path)
    if clean != request.path:
        return redirect(request, clean)
    return web.Response(
        status=404, text="404 page not found\n", headers={"X-Content-Type-Options": "nosniff"}
    )


class HttpServer:
    def __init__(
        self,
        routes: Iterable[web.RouteDef],
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.app = web.Application()
        self.app.add_routes(list(routes))
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None
        self.port = 0

    @classmethod
    def for_server(
        cls,
        *,
        readiness: Readiness,
        metrics: MetricsExposition,
        journal_client: JournalClient | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_append_bytes: int = 0,
        json_api: JsonApi | None = None,
    ) -> HttpServer:
        """Health and metrics; with `json_api`, the JSON API under /v1/; with `journal_client`,
        the journal gateway on every other path."""
        routes = [*health_routes(readiness), *metrics.routes()]
        if json_api is not None:
            routes += json_api.routes()  # Before the journal gateway's catch-all.
        if journal_client is not None:
            routes += JournalGateway(journal_client, max_append_bytes=max_append_bytes).routes()
        else:
            routes.append(web.route("*", "/{path:.*}", _not_found))
        return cls(routes, ssl_context=ssl_context)

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); the bound port."""
        # handler_cancellation: a client going away cancels its request's handler, as Go's
        # net/http cancels the request's context (Gazette's gateway reads and appends under
        # it). Without it, a blocking GET whose client left held its Read RPC open until the
        # journal's next append, for ever on an idle journal.
        runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_TIMEOUT,
            handler_cancellation=True,
        )
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=self.ssl_context)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                self.port = int(address[1])
                break
        log.info("http serving", extra={"address": f"{self.scheme}://{host}:{self.port}"})
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
