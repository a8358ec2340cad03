"""Append flow control: maximum append rates (token buckets) and the minimum client rate.

A journal's pipeline is exclusive while an append streams, so a slow or stalled client would
block every other writer. `MinRatePolicer` bounds how long that can last: a client must keep
sending at least `min_rate` bytes per second, with one second of slack and at most one
second of banked credit, or its append is aborted. Time the broker itself spends throttling
(for a maximum rate) is not charged to the client.

The broker's own stalls aren't charged either (`next_policed`): when the timer that would
abort a client fires late because the event loop was busy (a broker under load, or blocked),
the lateness is excused and the client gets that much longer; only a timer that fires on
time aborts it. A busy broker otherwise failed prompt clients whose chunks sat in its own
queues (bench/scale.py's failed first appends at 5,000 journals).

`RateLimiter` is a journal's token bucket (its max_append_rate, capped by the broker's
--max-append-rate, as Gazette's); a chunk that has to wait for it is counted as delayed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")

# A policing timer firing later than this was held up by the event loop, not the client.
LOOP_STALL_SECONDS = 0.05
# At most this much loop stall is excused while waiting for one chunk.
MAX_STALL_EXCUSE_SECONDS = 10.0


class FlowControlUnderflow(Exception):
    """The client did not sustain the minimum append rate."""

    def __init__(self, min_rate: int) -> None:
        super().__init__(
            f"client stream didn't sustain the minimum append data rate ({min_rate} bytes/s)"
        )


class RateLimiter:
    """A journal's maximum append rate: a token bucket of `rate` bytes per second, as Gazette's
    appendFlowControl keeps it: one second of burst at its first use, and unused rate banked
    up to BANK_SECONDS. `wanted` is the journal's own max_append_rate, which the broker's
    --max-append-rate caps (`capped`)."""

    BANK_SECONDS = 10.0  # Gazette's flowControlBankFactor.

    def __init__(self, rate: int) -> None:
        self.wanted = rate
        self.rate = rate
        self._tokens = 0.0
        self._stamp: float | None = None  # None: never used.

    def set_rate(self, rate: int) -> None:
        self.wanted = rate
        self._set(rate)

    def _set(self, rate: int) -> None:
        self.rate = rate
        self._tokens = min(self._tokens, rate * self.BANK_SECONDS)

    def capped(self, cap: int) -> RateLimiter:
        """This limiter with its rate upper-bounded by `cap` (0: none), as Gazette bounds a
        journal's MaxAppendRate by --broker.max-append-rate; a journal without a rate of its
        own (0) stays unlimited, as in Gazette."""
        rate = cap if cap and cap < self.wanted else self.wanted
        if rate != self.rate:
            self._set(rate)
        return self

    def delay_for(self, n: int) -> float:
        """Take `n` bytes of tokens; return how long to wait before sending them (0 = none)."""
        rate = self.rate
        if rate <= 0:
            return 0.0
        now = time.monotonic()
        if self._stamp is None:
            self._tokens = float(rate)  # Gazette's initial burst of one second.
        else:
            self._tokens = min(rate * self.BANK_SECONDS, self._tokens + (now - self._stamp) * rate)
        self._stamp = now
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / rate


async def throttle(limiters: list[RateLimiter], n: int) -> float:
    """Pass `n` bytes through every limiter; returns the seconds spent waiting."""
    delay = max((lim.delay_for(n) for lim in limiters), default=0.0)
    if delay > 0:
        await asyncio.sleep(delay)
    return delay


class MinRatePolicer:
    """Tracks how far a client is behind `min_rate`; tells how long it may still stall."""

    SLACK_SECONDS = 1.0
    CREDIT_SECONDS = 1.0

    def __init__(self, min_rate: int, slack_seconds: float = SLACK_SECONDS) -> None:
        self.min_rate = min_rate
        self.slack_seconds = slack_seconds  # How far behind the client may fall.
        self._debt = 0.0  # Bytes owed; negative is banked credit.
        self._stamp = time.monotonic()

    def _accrue(self) -> None:
        now = time.monotonic()
        self._debt += (now - self._stamp) * self.min_rate
        self._stamp = now

    def received(self, n: int) -> None:
        self._accrue()
        self._debt = max(self._debt - n, -self.CREDIT_SECONDS * self.min_rate)
        if self._debt > self.slack_seconds * self.min_rate:
            raise FlowControlUnderflow(self.min_rate)

    def excuse(self, seconds: float) -> None:
        """Don't charge the client for `seconds` the broker spent (e.g. throttling)."""
        self._stamp += seconds

    def timeout(self) -> float | None:
        """Seconds the client may still take to deliver its next chunk (None: unpoliced)."""
        if self.min_rate <= 0:
            return None
        self._accrue()
        return max(0.0, (self.slack_seconds * self.min_rate - self._debt) / self.min_rate)


async def next_policed(it: AsyncIterator[T], policer: MinRatePolicer) -> T | None:
    """The client's next request (None at the end of its stream), or FlowControlUnderflow
    once it has taken longer than the policer allows. Time the event loop was stalled past
    the deadline is excused (see the module docstring)."""
    try:
        async with asyncio.timeout(None) as scope:
            deadline = _Deadline(scope, policer)
            try:
                return await anext(it)
            finally:
                deadline.cancel()
    except StopAsyncIteration:
        return None
    except TimeoutError:
        raise FlowControlUnderflow(policer.min_rate) from None


class _Deadline:
    """Expires `scope` when the policer's allowance runs out, excusing loop stalls."""

    __slots__ = ("_excused", "_handle", "_loop", "_policer", "_scope", "_when")

    def __init__(self, scope: asyncio.Timeout, policer: MinRatePolicer) -> None:
        self._loop = asyncio.get_running_loop()
        self._scope = scope
        self._policer = policer
        self._excused = 0.0
        self._when = 0.0
        self._handle: asyncio.TimerHandle | None = None
        limit = policer.timeout()
        if limit is not None:
            self._arm(limit)

    def _arm(self, limit: float) -> None:
        self._when = self._loop.time() + limit
        self._handle = self._loop.call_at(self._when, self._fire)

    def _fire(self) -> None:
        lag = self._loop.time() - self._when
        if lag > LOOP_STALL_SECONDS and self._excused < MAX_STALL_EXCUSE_SECONDS:
            self._excused += lag
            self._policer.excuse(lag)
            self._arm(self._policer.timeout() or 0.0)
            return
        self._handle = None
        self._scope.reschedule(self._loop.time())

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
