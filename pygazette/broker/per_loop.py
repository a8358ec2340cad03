"""One instance of a class per running event loop (a broker's shared schedulers: the store
refresher, the flush timer), made on first use and let go of once its loop is closed.

An instance's tasks (and events, once waited on) hold their loop, so a weak key alone would
never let a loop that used one go: those of closed loops are dropped as a new loop takes
its own (tests run one loop after another; a broker, one loop for its life)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> T:
        """The instance of the running event loop."""
        loop = asyncio.get_running_loop()
        got = self._by_loop.get(loop)
        if got is None:
            for closed in [old for old in self._by_loop if old.is_closed()]:
                del self._by_loop[closed]
            got = self._by_loop[loop] = self._factory()
        return got
