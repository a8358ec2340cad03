"""Waiting on a journal while its resolution may be invalidated.

A resolution (`cluster_resolver.Resolution`) holds while the journal's assignments stay as
they were; when they change, its `invalidated` event is set, and whoever waits on the
journal's locks or listings under it must resolve again rather than go on.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from pygazette.broker.fragment.fragment_index import FragmentIndex


class Listed(Protocol):
    """A journal's replica as far as its first store listing goes (`replica.Replica`)."""

    index: FragmentIndex

    async def await_first_listing(self) -> str: ...


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


async def first_listing_or_invalidated(
    replica: Listed, invalidated: asyncio.Event | None
) -> str | None:
    """`replica.await_first_listing()`'s result ("" once listed, else why it can't be), or
    None if `invalidated` was set first (the replica stopped, or its assignments changed:
    no listing of it may ever come again, so resolve the journal again rather than wait)."""
    if replica.index.first_refresh_done.is_set():
        return ""
    listing = asyncio.ensure_future(replica.await_first_listing())
    if invalidated is None:
        return await listing
    inval = asyncio.ensure_future(invalidated.wait())
    try:
        await asyncio.wait([listing, inval], return_when=asyncio.FIRST_COMPLETED)
    finally:
        listing.cancel()
        inval.cancel()
    if listing.done() and not listing.cancelled():
        return listing.result()
    return None
