"""Which shard failures a replica recovers from in place, and which leave it FAILED.

Gazette marks a shard FAILED on any error and leaves it so until an operator removes the
assignment (`gazctl shards unassign --failed`). Most errors a busy cluster throws at a
shard are not the application's fault, though: etcd restarting (the lease becomes uncertain,
so the shard refuses to commit), a broker failing over mid-append (an in-doubt recovery log
write, which fails the recorder), the fragment store being unreachable, a full disk under
the store. For each of these, the fix is the one a process restart would apply: play the
recovery log again and resume from the last committed checkpoint. `is_transient` says when
a failure is of that kind; the replica then restarts itself, with backoff, rather than
stopping for good (see `replica.ShardReplica`).

Errors the application raises, messages that don't decode, a corrupt recovery log and bad
configuration are not transient: retrying cannot fix them, so they still fail the shard.
The classification is by type, not by origin: an application callback that itself raises
TimeoutError, an ENOSPC OSError or a gRPC UNAVAILABLE is retried the same way (with backoff,
logged and counted each time), never FAILED.
"""

from __future__ import annotations

import errno

import apsw
import grpc
import grpc.aio

from pygazette.client.append_service import AppendServiceError, DependencyFailed
from pygazette.consumer.memory_store import EarlierCommitFailed
from pygazette.consumer.recoverylog import RecorderFailed, RecorderFenced
from pygazette.consumer.store import StoreFenced
from pygazette.keyspace.keyspace import KeyspaceUnavailable
from pygazette.protocol.errors import FragmentStoreUnhealthy

__all__ = ["is_transient"]

# Failures of the infrastructure under a shard: retrying after the log is played again can
# succeed. StoreFenced covers LeaseLost (the lease may have expired: the shard refused to
# commit) and a recovery log taken over by another author (assignments decide who is
# primary: if it is still this replica, it takes the log back).
_TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    StoreFenced,
    RecorderFenced,
    RecorderFailed,
    KeyspaceUnavailable,
    FragmentStoreUnhealthy,
    TimeoutError,
    apsw.FullError,
)
# Failures that only say something else failed first: transient if their cause is.
_WRAPPERS: tuple[type[BaseException], ...] = (
    DependencyFailed,
    AppendServiceError,
    EarlierCommitFailed,
)
_TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNKNOWN,  # An append whose outcome is in doubt.
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,  # A broker's full disk.
        # A call the server dropped: gRPC cancels calls that an overloaded server left
        # unanswered for 30 s (a caller's own cancellation raises CancelledError instead).
        grpc.StatusCode.CANCELLED,
    }
)
_TRANSIENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_transient(exc: BaseException) -> bool:
    """Whether a shard that failed with `exc` should recover in place (see module doc).

    Follows explicit causes (`raise ... from`) through wrappers, never implicit context:
    an application error raised while handling a transient one is still the
    application's."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, BaseExceptionGroup):
            return all(is_transient(e) for e in cur.exceptions)
        if isinstance(cur, _TRANSIENT_TYPES):
            return True
        if isinstance(cur, grpc.aio.AioRpcError):
            return cur.code() in _TRANSIENT_CODES
        if isinstance(cur, OSError) and cur.errno in _TRANSIENT_ERRNOS:
            return True
        if not isinstance(cur, _WRAPPERS):
            return False
        cur = cur.__cause__
    return False
