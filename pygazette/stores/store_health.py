"""Fragment store health: Gazette's periodic store check, and a monitor of every store in use.

A check exercises what a broker and its readers need of a store, as Gazette's does: PUT
`.test/health-check` under the store, GET it back and compare, LIST `.test/` and find it,
sign a GET URL and, for http(s) URLs, fetch it. A store is healthy after a passing check,
unhealthy (with the check's error) after a failing one, and "not yet checked" before its
first check. Checks repeat every HEALTHY_INTERVAL while passing; after a failure they retry
on a short backoff (capped at MAX_RETRY_INTERVAL, where Gazette waits up to 100s), so a
recovered store is noticed within seconds. Failing store operations elsewhere (a put that
did not go through) ask for a check right away instead of waiting for the schedule.

The monitor checks every store somebody asked about, including any URL a client names in a
FragmentStoreHealth request. A store nobody asked about for IDLE_SWEEP_SECONDS is swept:
its checks stop and its shared client is dropped, as Gazette's store registry sweeps unused
stores, so asking about many URLs cannot pile up checkers. Asking again starts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from pygazette.stores.store import FragmentStore, StoreError, StoreRegistry

log = logging.getLogger(__name__)

HEALTH_CHECK_PATH = ".test/health-check"
HEALTH_CHECK_CONTENT = b"health-check\n"
HEALTHY_INTERVAL = 30 * 60.0
MAX_RETRY_INTERVAL = 10.0
CHECK_TIMEOUT = 60.0
_RETRY_INTERVALS = (0.0, 0.1, 1.0, 1.0, 5.0, 5.0, MAX_RETRY_INTERVAL)
IDLE_SWEEP_SECONDS = 10 * 60.0

FIRST_CHECK_PENDING = "first health check hasn't completed yet"


async def run_check(store: FragmentStore, scratch_dir: Path | None = None) -> None:
    """One health check of `store`; raises StoreError saying which step failed."""
    local = await asyncio.to_thread(_write_probe, scratch_dir)
    try:
        await store.put_file(HEALTH_CHECK_PATH, local)
    except StoreError as exc:
        raise StoreError(f"health check PUT failed: {exc}") from exc
    finally:
        await asyncio.to_thread(shutil.rmtree, local.parent, True)
    try:
        got = await store.get(HEALTH_CHECK_PATH)
    except StoreError as exc:
        raise StoreError(f"health check GET failed: {exc}") from exc
    if got != HEALTH_CHECK_CONTENT:
        raise StoreError(f"health check content mismatch: got {got[:64]!r}")
    try:
        listed = await store.list_files(".test/")
    except StoreError as exc:
        raise StoreError(f"health check LIST failed: {exc}") from exc
    if not any(f.path == "health-check" for f in listed):
        raise StoreError("health check LIST did not find the test file")
    try:
        url = await store.signed_url(HEALTH_CHECK_PATH, 300)
    except StoreError as exc:
        raise StoreError(f"health check signing failed: {exc}") from exc
    if url.startswith(("http://", "https://")):
        body = await asyncio.to_thread(_fetch, url)
        if body != HEALTH_CHECK_CONTENT:
            raise StoreError(f"health check fetch of the signed URL got {body[:64]!r}")


def _write_probe(scratch_dir: Path | None) -> Path:
    if scratch_dir is not None:
        scratch_dir.mkdir(parents=True, exist_ok=True)
    local = Path(tempfile.mkdtemp(dir=scratch_dir, prefix="health-")) / "health-check"
    local.write_bytes(HEALTH_CHECK_CONTENT)
    return local


def _fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as exc:
        exc.close()
        raise StoreError(f"health check fetch of the signed URL: HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise StoreError(f"health check fetch of the signed URL failed: {exc}") from exc


class StoreHealth:
    """The health of one store URL, kept current by a background check loop."""

    def __init__(self, url: str, registry: StoreRegistry, scratch_dir: Path | None) -> None:
        self.url = url
        self._registry = registry
        self._scratch_dir = scratch_dir
        self.error: str | None = FIRST_CHECK_PENDING
        self.checked_at = 0.0
        self._changed = asyncio.Event()
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failures = 0

    @property
    def healthy(self) -> bool:
        return self.error is None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"store-health:{self.url}")

    def cancel(self) -> None:
        """Stop checking, without waiting for a check in flight to wind down."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def check_soon(self) -> None:
        """Something failed against this store: check it now rather than on schedule."""
        self._kick.set()

    async def wait_change(self, max_wait: float | None = None) -> None:
        """Return after the next check completes (or after `max_wait` seconds)."""
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max_wait):
                await changed.wait()

    async def first_status(self, max_wait: float | None = None) -> str | None:
        """The store's error (None: healthy), awaiting its first check if need be."""
        if self.error == FIRST_CHECK_PENDING:
            await self.wait_change(max_wait)
        return self.error

    async def check(self) -> str | None:
        """Run one check now and record it; returns the error (None: healthy)."""
        try:
            store = self._registry.get(self.url)
            async with asyncio.timeout(CHECK_TIMEOUT):
                await run_check(store, self._scratch_dir)
            error = None
        except StoreError as exc:
            error = str(exc)
        except TimeoutError:
            error = f"health check timed out after {CHECK_TIMEOUT:.0f}s"
        except OSError as exc:
            error = f"health check failed: {exc}"
        self._record(error)
        return error

    def _record(self, error: str | None) -> None:
        was = self.error
        self.error = error
        self.checked_at = time.time()
        if error is None:
            if was is not None:
                log.info("store health check succeeded", extra={"store": self.url})
            self._failures = 0
        else:
            log.warning("store health check failed", extra={"store": self.url, "error": error})
            self._failures += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _next_interval(self) -> float:
        if self.error is None:
            interval = HEALTHY_INTERVAL
        else:
            interval = _RETRY_INTERVALS[min(self._failures, len(_RETRY_INTERVALS)) - 1]
        return interval * (1 + (random.random() - 0.5) * 0.4)  # +/- 20% jitter.

    async def _loop(self) -> None:
        # asyncio.timeout, never wait_for, in loops that are stopped by cancelling them: on
        # Python 3.11 wait_for drops a cancellation that races the inner wait's completion,
        # and the loop goes on into a 30-minute wait that stop() then awaits.
        while True:
            self._kick.clear()
            await self.check()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_interval()):
                    await self._kick.wait()


class StoreHealthMonitor:
    """One StoreHealth per store URL in use; checking starts on first use."""

    def __init__(
        self,
        registry: StoreRegistry,
        scratch_dir: Path | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.scratch_dir = scratch_dir
        self._health: dict[str, StoreHealth] = {}
        self._used: dict[str, float] = {}  # When each store was last asked about.
        self._clock = clock
        self._next_sweep = clock() + IDLE_SWEEP_SECONDS

    def get(self, url: str) -> StoreHealth:
        now = self._clock()
        if now >= self._next_sweep:
            self._sweep(now)
        self._used[url] = now
        health = self._health.get(url)
        if health is None:
            health = self._health[url] = StoreHealth(url, self.registry, self.scratch_dir)
            health.start()
        return health

    def _sweep(self, now: float) -> None:
        """Stop checking stores nobody asked about for IDLE_SWEEP_SECONDS."""
        self._next_sweep = now + IDLE_SWEEP_SECONDS / 10
        for url, used in list(self._used.items()):
            if now - used > IDLE_SWEEP_SECONDS:
                del self._used[url]
                self._health.pop(url).cancel()
                self.registry.forget(url)
                log.debug("swept idle store", extra={"store": url})

    def known(self) -> list[StoreHealth]:
        return list(self._health.values())

    async def stop(self) -> None:
        for health in list(self._health.values()):
            await health.stop()
        self._health.clear()
        self._used.clear()
