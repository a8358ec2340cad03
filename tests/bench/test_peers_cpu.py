"""bench/peers.py charges each throughput workload the CPU of the system's server processes
and of the client (this process), and compares it per message / per GB; it had no CPU
figure, so on a shared machine a rate measured the neighbours as much as the system."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from peers import compare_cpu, cpu_figures, process_cpu  # noqa: E402


def test_cpu_figures_per_message_and_per_gb() -> None:
    f = cpu_figures(server=1.5, client=0.5, count=500_000, nbytes=100_000_000)
    assert f["cpu_us_per_msg"] == 4.0
    assert f["cpu_s_per_gb"] == 20.0
    assert f["server_cpu_s"] == 1.5 and f["client_cpu_s"] == 0.5


def test_compare_cpu_ratios_are_pygazette_over_peer() -> None:
    results = {
        "pygazette-r1": {"publish_small": {"cpu_us_per_msg": 3.0}},
        "kafka-1": {"publish_small": {"cpu_us_per_msg": 6.0}},
        "nats": {"skipped": "not installed"},
    }
    row = compare_cpu(results)["publish_small"]
    assert row["figures"] == {"pygazette-r1": 3.0, "kafka-1": 6.0, "nats": None}
    assert row["pygazette_over_peer"] == {"pygazette-r1": {"kafka-1": 0.5, "nats": None}}
    assert row["better"] == "lower"


def test_process_cpu_counts_reaped_children() -> None:
    """A server that forks workers (Redis' AOF rewrite) is charged their CPU once reaped."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"subprocess.run([sys.executable, '-c', {burn!r}])\n"
            "print('done', flush=True)\n"
            "time.sleep(30)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "done"
        assert process_cpu(parent.pid) >= 0.25
    finally:
        parent.kill()
        parent.wait()


def test_a_gone_process_costs_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert process_cpu(proc.pid) == 0.0


def test_latency_from_schedule_counts_the_wait_of_late_sends() -> None:
    """Coordinated omission: a message sent 50 ms late (its publisher blocked) and delivered
    1 ms after its send waited 51 ms from when it was due."""
    from peers import from_schedule

    scheduled = [i * 0.001 for i in range(100)]
    sent = [d + 0.0001 for d in scheduled]  # On time: a sleep's overshoot.
    sent[50] = scheduled[50] + 0.050
    received = [s + 0.001 for s in sent]
    figures = from_schedule(scheduled, sent, received)
    assert figures["sent_late"] == 1
    assert figures["p50_ms_from_schedule"] == 1.0
    assert figures["p99_ms_from_schedule"] == 51.0


def test_a_consumers_connection_is_set_up_before_the_read_is_timed() -> None:
    """Kafka's consumer is a new client, connecting inside the timed read, where the other
    systems' readers use clients connected already: the set-up is now untimed."""
    import asyncio
    import time
    from pathlib import Path as _Path

    from peer_systems.system import System
    from peers import throughput

    class Slow(System):
        name = "slow-connect"

        def settings(self) -> dict[str, object]:
            return {}

        async def start(self, tmp: _Path) -> None: ...

        async def stop(self) -> None: ...

        async def create(self, log: str, large: bool) -> None: ...

        async def publish(self, log: str, msgs: object) -> None: ...

        async def prepare_consume(self, log: str) -> None:
            await asyncio.sleep(0.3)  # Connecting.

        async def consume(self, log: str, count: int) -> int:
            return count * 200

        async def tail(self, log: str, on_message: object) -> object: ...

        async def send(self, log: str, msg: object) -> None: ...

        async def flush(self, log: str) -> None: ...

    msgs = [{"n": i} for i in range(1000)]
    started = time.perf_counter()
    _, consumed = asyncio.run(throughput(Slow(), "log", msgs, False, 200))  # type: ignore[arg-type]
    assert time.perf_counter() - started >= 0.3
    assert consumed["seconds"] < 0.1
