"""The FragmentStoreHealth RPC: the health of one fragment store, as this broker sees it.

Like Gazette's, it starts checking a store it was not yet watching, waits for that first
check (bounded by FIRST_CHECK_WAIT_SECONDS, or the RPC's deadline), and answers OK or
FRAGMENT_STORE_UNHEALTHY with the check's error.
"""

from __future__ import annotations

from pygazette.broker.resolver import Resolver
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores.store_health import FIRST_CHECK_PENDING, StoreHealthMonitor

FIRST_CHECK_WAIT_SECONDS = 60.0


async def serve_fragment_store_health(
    req: pb.FragmentStoreHealthRequest, resolver: Resolver, monitor: StoreHealthMonitor
) -> pb.FragmentStoreHealthResponse:
    resp = pb.FragmentStoreHealthResponse(status=pb.OK, header=resolver.header(routed=False))
    health = monitor.get(req.fragment_store)
    error = await health.first_status(FIRST_CHECK_WAIT_SECONDS)
    if error == FIRST_CHECK_PENDING:
        error = f"{FIRST_CHECK_PENDING} (after {FIRST_CHECK_WAIT_SECONDS:.0f}s)"
    if error is not None:
        resp.status = pb.FRAGMENT_STORE_UNHEALTHY
        resp.store_health_error = error
    return resp
