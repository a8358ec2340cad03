"""What the chaos driver observed: acknowledged appends, availability, anomalies.

Every acknowledged append the driver makes (and every one a chunker logs) is recorded with
its journal, `[begin, end)` and the SHA-1 the broker committed, for the final read-back.
Every successful append, empty ones included, marks its journal available at that moment:
the longest time between two of them, while the driver kept trying, is the journal's
longest unavailability window. The largest acknowledged end per journal is what any later
read's write head must reach.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# Unavailability windows at least this long are listed, with when they began.
LONG_WINDOW = 10.0


@dataclass(frozen=True, slots=True)
class Ack:
    journal: str
    begin: int
    end: int
    sha1: str  # Hex, as the broker committed it.


@dataclass
class Record:
    started: float = field(default_factory=time.monotonic)
    acks: list[Ack] = field(default_factory=list)
    acked_end: dict[str, int] = field(default_factory=dict)
    last_ok: dict[str, float] = field(default_factory=dict)
    max_gap: dict[str, float] = field(default_factory=dict)
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)  # Long ones (LONG_WINDOW).

    def available(self, journal: str, end: int, at: float | None = None) -> None:
        """An append to `journal` succeeded with the write head at `end`."""
        now = time.monotonic() if at is None else at
        last = self.last_ok.get(journal, self.started)
        self.max_gap[journal] = max(self.max_gap.get(journal, 0.0), now - last)
        if now - last >= LONG_WINDOW:
            self.windows.append(
                {
                    "journal": journal,
                    "from_t": round(last - self.started, 1),
                    "seconds": round(now - last, 1),
                }
            )
        self.last_ok[journal] = now
        if end < self.acked_end.get(journal, 0):
            self.anomaly("append acknowledged below an earlier one", journal=journal, end=end)
        self.acked_end[journal] = max(self.acked_end.get(journal, 0), end)

    def acknowledged(self, ack: Ack) -> None:
        self.acks.append(ack)
        self.available(ack.journal, ack.end)

    def anomaly(self, what: str, **details: Any) -> None:
        t = round(time.monotonic() - self.started, 2)
        self.anomalies.append({"what": what, "t": t, **details})

    def close_windows(self) -> None:
        """Count the time since each journal's last success as a window too."""
        now = time.monotonic()
        for journal, last in self.last_ok.items():
            self.max_gap[journal] = max(self.max_gap.get(journal, 0.0), now - last)
