"""Store health monitor: stores nobody asks about are swept, asked-about ones stay checked."""

from __future__ import annotations

from pathlib import Path

from pygazette.stores.store import StoreRegistry
from pygazette.stores.store_health import IDLE_SWEEP_SECONDS, StoreHealthMonitor


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_idle_stores_are_swept_and_asking_again_starts_afresh(tmp_path: Path) -> None:
    registry = StoreRegistry(tmp_path / "root")
    for name in ("idle", "busy"):
        (tmp_path / "root" / name).mkdir(parents=True)
    clock = _Clock()
    monitor = StoreHealthMonitor(registry, clock=clock)
    try:
        idle = monitor.get("file:///idle/")
        busy = monitor.get("file:///busy/")
        assert await idle.first_status(10) is None  # Real checks against the file store.
        assert await busy.first_status(10) is None
        registry.get("file:///idle/")

        clock.now += IDLE_SWEEP_SECONDS * 0.6
        assert monitor.get("file:///busy/") is busy  # Asked about: stays.
        clock.now += IDLE_SWEEP_SECONDS * 0.6  # Past the idle limit for idle/ only.
        assert monitor.get("file:///busy/") is busy
        assert [h.url for h in monitor.known()] == ["file:///busy/"]
        assert idle._task is None  # Its checks stopped.
        assert "file:///idle/" not in registry._stores  # Its shared client dropped.

        again = monitor.get("file:///idle/")
        assert again is not idle
        assert await again.first_status(10) is None
    finally:
        await monitor.stop()


async def test_many_asked_about_urls_do_not_pile_up(tmp_path: Path) -> None:
    clock = _Clock()
    monitor = StoreHealthMonitor(StoreRegistry(tmp_path / "root"), clock=clock)
    try:
        for i in range(50):
            monitor.get(f"file:///probe-{i}/")
        assert len(monitor.known()) == 50
        clock.now += IDLE_SWEEP_SECONDS + 1
        monitor.get("file:///kept/")
        assert [h.url for h in monitor.known()] == ["file:///kept/"]
    finally:
        await monitor.stop()
