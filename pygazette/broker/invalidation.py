"""Waiting on a journal while its resolution may be invalidated.

A resolution (`cluster_resolver.Resolution`) holds while the journal's assignments stay as
they were; when they change, its `invalidated` event is set, and whoever waits on the
journal's locks or listings under it must resolve again rather than go on.
"""

from __future__ import annotations

import asyncio
from typing import Any


def _abandon(acquire: asyncio.Future[Any], lock: asyncio.Lock) -> None:
    """Give up a pending `lock.acquire()`, releasing the lock if it is granted anyway."""

    def release_if_granted(f: asyncio.Future[Any]) -> None:
        if not f.cancelled() and f.exception() is None:
            lock.release()

    if acquire.done():
        release_if_granted(acquire)
    else:
        acquire.cancel()
        acquire.add_done_callback(release_if_granted)


async def acquire_or_invalidated(lock: asyncio.Lock, invalidated: asyncio.Event | None) -> bool:
    """Take `lock`, unless `invalidated` is set first (then return False, not holding it).

    Cancellation-safe: if the caller is cancelled, the lock is not left held.
    """
    if invalidated is None:
        await lock.acquire()
        return True
    if invalidated.is_set():
        return False
    if not lock.locked() and not lock._waiters:
        # Free, and nobody waits for it: taken at once, without suspending (so without the
        # two tasks the contended case needs to watch `invalidated` meanwhile).
        await lock.acquire()
        return True
    acquire = asyncio.ensure_future(lock.acquire())
    wait = asyncio.ensure_future(invalidated.wait())
    try:
        await asyncio.wait([acquire, wait], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        wait.cancel()
        _abandon(acquire, lock)
        raise
    wait.cancel()
    if not acquire.done() or invalidated.is_set():
        _abandon(acquire, lock)
        return False
    return not acquire.cancelled() and acquire.exception() is None
