"""The fence a request passes before a member resolves it (brokers' journals, consumers' shards).

A request may require a keyspace revision: one it names itself, or the revision of the Header a
peer resolved it with before proxying it here. Such a proxy Header must also name this etcd
cluster and (when it names one) this process. `pass_request_fence` checks both, then waits for
the local keyspace mirror to reach the revision, and raises `ResolveError` where the request
can't be resolved here. Gazette's broker and consumer resolvers apply the same fence.
"""

from __future__ import annotations

from pygazette.keyspace.keyspace import Keyspace
from pygazette.protocol.pb import protocol_pb2 as pb

__all__ = ["REVISION_WAIT_SECONDS", "ResolveError", "pass_request_fence", "same_process"]

# The longest a request waits for the keyspace to reach a revision it requires.
REVISION_WAIT_SECONDS = 30.0


class ResolveError(Exception):
    """The request can't be resolved here (wrong cluster or process, or shutting down)."""


def same_process(a: pb.ProcessSpec.ID, b: pb.ProcessSpec.ID) -> bool:
    return a.zone == b.zone and a.suffix == b.suffix


async def pass_request_fence(
    keyspace: Keyspace,
    local_id: pb.ProcessSpec.ID,
    min_revision: int = 0,
    proxy_header: pb.Header | None = None,
) -> None:
    """Check a proxied request's Header against this cluster and process (`local_id`), and
    wait (up to REVISION_WAIT_SECONDS) for the keyspace to reach the revision the request
    requires: `min_revision`, or the proxy Header's if that is greater."""
    if proxy_header is not None:
        etcd = proxy_header.etcd
        ours = keyspace.identity.cluster_id
        if etcd.cluster_id and etcd.cluster_id != ours:
            raise ResolveError(
                f"request etcd cluster ID doesn't match ours ({etcd.cluster_id} vs {ours})"
            )
        pid = proxy_header.process_id
        if (pid.zone or pid.suffix) and not same_process(pid, local_id):
            raise ResolveError(
                f"request process ID doesn't match ours ({pid.zone}#{pid.suffix} vs "
                f"{local_id.zone}#{local_id.suffix})"
            )
        min_revision = max(min_revision, etcd.revision)
    if min_revision > keyspace.revision:
        try:
            await keyspace.wait_for_store_revision(min_revision, REVISION_WAIT_SECONDS)
        except TimeoutError:
            raise ResolveError(
                f"keyspace didn't reach revision {min_revision} (at {keyspace.revision})"
            ) from None
