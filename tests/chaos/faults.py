"""The chaos suite's fault schedule: seeded, logged, one fault every 10-20 seconds.

Fault kinds, as issue 14 lists them:

- `kill`: kill -9 a broker, or the primary of a summer shard; restart it on its data
  directory a moment later.
- `sigterm`: stop a broker gracefully (SIGTERM: it drains its journals to the others and
  exits 0), and restart it on its data directory a moment later.
- `sigstop`: SIGSTOP a broker or a summer past its lease, then SIGCONT it.
- `etcd_restart`: stop etcd (SIGTERM or SIGKILL) and start it again on its data directory.
- `partition`: cut a broker off from its peers for a while, through the proxies they reach
  each other by: `in` (peers cannot reach it), `out` (it cannot reach them) or `both`.
- `store_outage`: make the fragment store unreachable for a while.

Faults are dealt from a shuffled deck (every action once per deck, so every kind comes up;
when no action left in the deck may run, one that may is picked off-deck) with a seeded
RNG. One starts every 10-20 s; a long one (partition, outage) may still run when the next
starts, which is then one that doesn't conflict with it: at most one broker is impaired at
a time, and brokers neither restart nor freeze while the store is out (a broker that
restarts during an outage cannot list its journals' fragments, and refuses their appends:
clients treat that as terminal, as Gazette's do). Every start and end is logged as a JSON
line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from tests.chaos.cluster import SHARDS, ChaosCluster
from tests.chaos.supervisor import Supervisor, start_with_retries
from tests.support.broker_process import BrokerProcess


def _exits_within(proc: BrokerProcess, seconds: float) -> int | None:
    """The exit status of `proc` if it exits within `seconds`, else None."""
    assert proc.proc is not None
    with contextlib.suppress(subprocess.TimeoutExpired):
        return proc.proc.wait(seconds)
    return None


KINDS = ("kill", "sigterm", "sigstop", "etcd_restart", "partition", "store_outage")


@dataclass(slots=True)
class Timing:
    gap: tuple[float, float] = (10.0, 20.0)  # Between the starts of two faults.
    outage: float = 30.0  # How long a partition or a store outage lasts.
    restart_delay: tuple[float, float] = (1.0, 4.0)  # A killed process stays down this long.
    past_lease: float = 3.0  # A frozen process stays frozen this long past its lease.


@dataclass(frozen=True, slots=True)
class Action:
    name: str
    kind: str
    occupies: frozenset[str]
    blocked_by: frozenset[str]


def _action(name: str, kind: str, occupies: set[str], blocked_by: set[str]) -> Action:
    return Action(name, kind, frozenset(occupies), frozenset(blocked_by))


ACTIONS = (
    _action("kill_broker", "kill", {"broker", "broker_restart"}, {"broker", "store"}),
    _action("kill_consumer", "kill", {"consumer"}, {"consumer"}),
    # Not while etcd restarts: a drain that outlasts the lease fails (as it must), which would
    # be taken for a broker failing its graceful exit.
    _action(
        "sigterm_broker",
        "sigterm",
        {"broker", "broker_restart", "etcd"},
        {"broker", "store", "etcd"},
    ),
    _action("sigstop_broker", "sigstop", {"broker", "broker_restart"}, {"broker", "store"}),
    _action("sigstop_consumer", "sigstop", {"consumer"}, {"consumer"}),
    _action("etcd_restart", "etcd_restart", {"etcd"}, {"etcd"}),
    _action("partition", "partition", {"broker"}, {"broker"}),
    _action("store_outage", "store_outage", {"store"}, {"store", "broker_restart"}),
)


class FaultSchedule:
    def __init__(
        self,
        cc: ChaosCluster,
        supervisor: Supervisor,
        seed: int,
        timing: Timing,
        log_path: Path,
        echo: TextIO = sys.stderr,
    ) -> None:
        self.cc = cc
        self.supervisor = supervisor
        self.rng = random.Random(seed)
        self.timing = timing
        self.counts: Counter[str] = Counter({k: 0 for k in KINDS})
        self.by_action: Counter[str] = Counter()
        self.active: Counter[str] = Counter()
        self.errors: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self._log = open(log_path, "a", encoding="utf-8")
        self._echo = echo

    def log(self, **event: Any) -> None:
        event = {"t": round(time.monotonic() - self.started, 2), **event}
        line = json.dumps(event, default=str)
        if not self._log.closed:
            self._log.write(line + "\n")
            self._log.flush()
        print(line, file=self._echo, flush=True)

    # The schedule.

    async def run(self, duration: float) -> None:
        """Inject faults for `duration` seconds; return once the last one is over."""
        until = time.monotonic() + duration
        deck: list[Action] = []
        tasks: set[asyncio.Task[None]] = set()
        next_at = time.monotonic() + self.rng.uniform(*self.timing.gap)
        try:
            while True:
                wait = next_at - time.monotonic()
                if next_at >= until:
                    break
                if wait > 0:
                    await asyncio.sleep(wait)
                if not deck:
                    deck = list(ACTIONS)
                    self.rng.shuffle(deck)
                action = next((a for a in deck if self._allowed(a)), None)
                if action is not None:
                    deck.remove(action)
                else:
                    # Nothing left in the deck may run now: any action that may, off-deck.
                    allowed = [a for a in ACTIONS if self._allowed(a)]
                    if not allowed:
                        next_at = time.monotonic() + 1.0  # Wait for a conflicting fault.
                        continue
                    action = self.rng.choice(allowed)
                for r in action.occupies:
                    self.active[r] += 1
                task = asyncio.create_task(self._inject(action), name=action.name)
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_at = time.monotonic() + self.rng.uniform(*self.timing.gap)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            self._log.close()

    def _allowed(self, action: Action) -> bool:
        return not any(self.active[r] for r in action.blocked_by)

    async def _inject(self, action: Action) -> None:
        run: Callable[[], Awaitable[dict[str, Any]]] = getattr(self, f"_{action.name}")
        t0 = time.monotonic()
        try:
            details = await run()
            self.counts[action.kind] += 1
            self.by_action[action.name] += 1
            self.log(
                fault=action.name,
                kind=action.kind,
                phase="end",
                seconds=round(time.monotonic() - t0, 2),
                **details,
            )
        except Exception as exc:
            self.errors.append({"fault": action.name, "error": repr(exc)})
            self.log(fault=action.name, kind=action.kind, phase="error", error=repr(exc))
        finally:
            for r in action.occupies:
                self.active[r] -= 1

    # Helpers.

    def _pick_broker(self) -> BrokerProcess:
        running = [b for b in self.cc.brokers if b.running()]
        return self.rng.choice(running or self.cc.brokers)

    async def _down_and_up(
        self, name: str, proc: BrokerProcess, lb_port: Callable[[bool], None], freeze: bool
    ) -> dict[str, Any]:
        """Kill (and restart) or freeze (and thaw) `proc`, held from the supervisor."""
        self.supervisor.held.add(name)
        lb_port(False)
        try:
            if freeze:
                seconds = self.cc.lease_ttl + self.timing.past_lease
                self.log(fault="sigstop", target=name, phase="start", seconds=seconds)
                proc.freeze()
                await asyncio.sleep(seconds)
                proc.thaw()
                # Past its lease, the process may find it lost its lease and exit (as
                # Gazette's do); then it is restarted, as part of this fault.
                exited = await asyncio.to_thread(_exits_within, proc, self.cc.lease_ttl)
                if exited is not None:
                    await asyncio.to_thread(start_with_retries, proc)
                return {"target": name, "frozen_s": seconds, "exited_after_thaw": exited}
            delay = self.rng.uniform(*self.timing.restart_delay)
            self.log(fault="kill", target=name, phase="start", restart_after=round(delay, 2))
            proc.kill()
            await asyncio.sleep(delay)
            await asyncio.to_thread(start_with_retries, proc)
            return {"target": name}
        finally:
            lb_port(True)
            self.supervisor.held.discard(name)

    # The actions.

    async def _kill_broker(self) -> dict[str, Any]:
        b = self._pick_broker()
        lb = self.cc.broker_lb
        return await self._down_and_up(b.suffix, b, lambda up: lb.mark(b.port, up=up), freeze=False)

    async def _sigterm_broker(self) -> dict[str, Any]:
        """A graceful restart: SIGTERM, the exit waited for (it must exit 0), a restart."""
        b = self._pick_broker()
        lb = self.cc.broker_lb
        self.supervisor.held.add(b.suffix)
        lb.mark(b.port, up=False)
        try:
            delay = self.rng.uniform(*self.timing.restart_delay)
            self.log(fault="sigterm", target=b.suffix, phase="start", restart_after=round(delay, 2))
            t0 = time.monotonic()
            assert b.proc is not None
            b.proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(_exits_within, b, 120.0)
            exited_s = round(time.monotonic() - t0, 2)
            if code is None:
                b.kill()
                raise AssertionError(f"{b.suffix} did not exit within 120 s of SIGTERM")
            if code != 0:
                raise AssertionError(f"{b.suffix} exited {code} on SIGTERM")
            await asyncio.sleep(delay)
            await asyncio.to_thread(start_with_retries, b)
            return {"target": b.suffix, "exited_s": exited_s}
        finally:
            lb.mark(b.port, up=True)
            self.supervisor.held.discard(b.suffix)

    async def _sigstop_broker(self) -> dict[str, Any]:
        b = self._pick_broker()
        lb = self.cc.broker_lb
        return await self._down_and_up(b.suffix, b, lambda up: lb.mark(b.port, up=up), freeze=True)

    async def _consumer_victim(self) -> tuple[Any, str]:
        shard = self.rng.choice(SHARDS)
        victim = await self.cc.primary_of(shard)
        if victim is None:
            victim = self.rng.choice([c for c in self.cc.consumers if c.running()])
            shard = ""
        return victim, shard

    async def _kill_consumer(self) -> dict[str, Any]:
        victim, shard = await self._consumer_victim()
        lb = self.cc.consumer_lb
        out = await self._down_and_up(
            victim.member_id, victim, lambda up: lb.mark(victim.port, up=up), freeze=False
        )
        return {**out, "primary_of": shard}

    async def _sigstop_consumer(self) -> dict[str, Any]:
        victim, shard = await self._consumer_victim()
        lb = self.cc.consumer_lb
        out = await self._down_and_up(
            victim.member_id, victim, lambda up: lb.mark(victim.port, up=up), freeze=True
        )
        return {**out, "primary_of": shard}

    async def _etcd_restart(self) -> dict[str, Any]:
        hard = self.rng.random() < 0.5
        self.log(fault="etcd_restart", phase="start", signal="KILL" if hard else "TERM")
        etcd = self.cc.etcd
        t0 = time.monotonic()
        if hard and etcd.proc is not None:
            etcd.proc.kill()
            etcd.proc.wait(10)
        else:
            await asyncio.to_thread(etcd.stop)
        await asyncio.to_thread(etcd.start)
        return {"signal": "KILL" if hard else "TERM", "down_s": round(time.monotonic() - t0, 2)}

    async def _partition(self) -> dict[str, Any]:
        b = self._pick_broker()
        mode = self.rng.choice(("in", "out", "both"))
        peers = self.cc.peers_of(b.suffix)
        self.log(fault="partition", target=b.suffix, mode=mode, phase="start")
        cut_in = mode in ("in", "both")
        cut_out = mode in ("out", "both")
        if cut_in:
            self.cc.proxies[b.suffix].deny(peers)
        if cut_out:
            for p in peers:
                self.cc.proxies[p].deny({b.suffix})
        try:
            await asyncio.sleep(self.timing.outage)
        finally:
            if cut_in:
                self.cc.proxies[b.suffix].allow(peers)
            if cut_out:
                for p in peers:
                    self.cc.proxies[p].allow({b.suffix})
        refused = sum(p.refused for p in self.cc.proxies.values())
        return {"target": b.suffix, "mode": mode, "refused_total": refused}

    async def _store_outage(self) -> dict[str, Any]:
        proxy = self.cc.store_proxy
        assert proxy is not None
        self.log(fault="store_outage", phase="start")
        proxy.cut()
        try:
            await asyncio.sleep(self.timing.outage)
        finally:
            proxy.restore()
        return {}
