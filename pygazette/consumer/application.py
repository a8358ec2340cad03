"""`Application`: what a user writes to run a stateful, exactly-once stream processor.

An application is any object with these methods (each may be a plain function or a
coroutine function):

- `new_store(shard, recorder) -> Store`: the shard's store. `recorder` is the shard's
  recovery-log Recorder (None when the shard has no `recovery_log_prefix`); stores that
  keep local files (SQLiteStore, JSONFileStore) record them through it.
- `consume_message(shard, store, envelope, publisher)`: process one committed message of
  a source journal. Publish outputs with `publisher.publish_uncommitted(...)`: they become
  readable once the transaction commits.
- `finalize_txn(shard, store, publisher)`: the transaction is about to commit; flush state
  held in memory into the store and publish what remains.

Optional:

- `new_framing(journal_spec) -> Framing | None`: how to decode a source journal's
  messages (default: the framing of the journal's `content-type` label).
- `begin_txn(shard, store)`: a transaction begins (its first message is ready).
- `finish_txn(shard, store, error)`: the transaction was handed to the store to commit (or
  failed with `error`; a transaction abandoned because the shard stops gets a
  CancelledError). Every `begin_txn` is followed by one `finish_txn`, as Gazette pairs them.

Raising from any callback fails the shard (its ReplicaStatus becomes FAILED with the
error); nothing of the failed transaction is committed.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pygazette.message.envelope import Envelope
from pygazette.message.publisher import Publisher

if TYPE_CHECKING:
    from pygazette.consumer.recoverylog.recorder import Recorder
    from pygazette.consumer.shard_api import Shard
    from pygazette.consumer.store import Store

__all__ = ["Application", "maybe_await"]

T = TypeVar("T")


class Application(Protocol):
    def new_store(self, shard: Shard, recorder: Recorder | None) -> Store | Awaitable[Store]:
        ...

    def consume_message(
        self, shard: Shard, store: Any, envelope: Envelope, publisher: Publisher
    ) -> Awaitable[None] | None:
        ...

    def finalize_txn(
        self, shard: Shard, store: Any, publisher: Publisher
    ) -> Awaitable[None] | None:
        ...


async def maybe_await(value: T | Awaitable[T]) -> T:
    """The value of a callback that may be a plain function or a coroutine function."""
    if inspect.isawaitable(value):
        return await value
    return value
