"""`per_loop.PerLoop`: a broker's shared schedulers (the flush timer, the store refresher),
one per running event loop, are let go of with their loop once it is closed."""

from __future__ import annotations

import asyncio
import gc
import weakref

from pygazette.broker.flush_timer import FlushTimer
from pygazette.broker.fragment.refresher import Refresher


class _Journal:
    """A replica as the flush timer sees it, never due in this test."""

    def flush_check(self, now: float) -> float | None:
        return None


def test_the_schedulers_of_a_closed_loop_are_let_go_of() -> None:
    """Each loop's flush timer and refresher run tasks, which hold the loop: weakly keyed by
    loop alone, a closed loop was never collected, and with it its schedulers and every
    replica still on them (their spools' files open), for the life of the process: one set
    per test of a test session. Those of closed loops go once another loop takes its own."""
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    journals: list[weakref.ref[_Journal]] = []

    async def serve() -> None:
        journal = _Journal()
        FlushTimer.of_running_loop().set(journal, 1e12)  # Never stopped: left on the timer.
        Refresher.of_running_loop()._start()
        loops.append(weakref.ref(asyncio.get_running_loop()))
        journals.append(weakref.ref(journal))
        await asyncio.sleep(0)

    for _ in range(3):
        asyncio.run(serve())
    gc.collect()
    # The last loop's are kept until a next loop takes its own; the others are gone.
    assert [ref() is None for ref in loops] == [True, True, False]
    assert [ref() is None for ref in journals] == [True, True, False]
