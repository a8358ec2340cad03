"""bench/fragments.py compares the persister with raw compression per CPU second too: the
persister compresses fragments on several threads at once and the raw baseline one buffer on
one thread, so their wall-time ratio could read above 1 without either being faster."""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from fragments import best_of_with_cpu  # noqa: E402


def test_waiting_costs_wall_time_not_cpu() -> None:
    wall, cpu = best_of_with_cpu(2, lambda: time.sleep(0.05))
    assert wall >= 0.05
    assert cpu < 0.02


def test_cpu_of_every_thread_is_counted() -> None:
    data = b"x" * (16 << 20)

    def work() -> None:
        for _ in range(4):
            hashlib.sha1(data).digest()  # Releases the GIL: threads run at once.

    def on_two_threads() -> None:
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    _, one = best_of_with_cpu(1, work)
    _, two = best_of_with_cpu(1, on_two_threads)
    assert two > 1.5 * one
