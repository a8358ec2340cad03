"""The Spark sink's register fences on Gazette's broker: each write commits once there too.

The sink's exactly-once appends (`pygazette.spark.exactly_once`) rely on Gazette's register
semantics: an append's `check_registers` against the journal's registers, `union_registers`
replacing a label's value, `subtract_registers`, and a REGISTER_MISMATCH answer carrying the
registers. The same sequences of fenced appends run against Gazette's broker and pygazette's
and must end with the same content and registers.
"""

from __future__ import annotations

import asyncio
import io
import time

import pytest

from pygazette.client import (
    JournalClient,
    append,
    apply_journals,
    list_all_fragments,
    read_journal,
)
from pygazette.protocol.errors import GazetteError
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import GazetteBroker

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install '.[spark]')")

from pygazette.spark import exactly_once as eo
from pygazette.spark.exactly_once import Fence, fenced_append


def spec(name: str) -> pb.JournalSpec:
    s = pb.JournalSpec(name=name, replication=1)
    s.fragment.length = 1 << 20
    s.fragment.compression_codec = pb.SNAPPY  # type: ignore[assignment]
    s.fragment.stores.append("file:///")
    s.fragment.refresh_interval.seconds = 1
    return s


async def sequences(url: str) -> list[object]:
    """Fenced appends of streams and batch writes: retries, zombies, races, expiry, other
    queries; what each did, the journals' content and their sink registers."""
    seen: list[object] = []
    started = int(time.time())
    async with JournalClient(url) as client:
        names = [f"spark/fence/{k}" for k in ("stream", "race", "batch")]
        await apply_journals(
            client, [pb.ApplyRequest.Change(upsert=spec(n), expect_mod_revision=0) for n in names]
        )

        async def fenced(journal: str, data: bytes, fence: Fence, *, forget: bool = True) -> bool:
            if forget:
                eo._registers.clear()  # As a task of another process.
            for attempt in range(50):
                try:
                    outcome = await fenced_append(client, journal, io.BytesIO(data), fence)
                    return outcome.appended
                except Exception as exc:  # A journal just created may not be served yet.
                    if attempt == 49 or "NO_JOURNAL_PRIMARY_BROKER" not in repr(exc):
                        raise
                    await asyncio.sleep(0.1)
            raise AssertionError("unreachable")

        stream, race, batch = names
        q = [Fence.for_stream("w", 0, b, "query-a") for b in range(6)]
        seen.append(await fenced(stream, b"b0\n", q[0]))
        seen.append(await fenced(stream, b"b0\n", q[0]))  # A retry: skipped.
        seen.append(await fenced(stream, b"p1\n", Fence.for_stream("w", 1, 0, "query-a")))
        seen.append(await fenced(stream, b"b1\n", q[1], forget=False))
        seen.append(await fenced(stream, b"b5\n", q[5]))
        seen.append(await fenced(stream, b"b3\n", q[3]))  # A zombie: skipped.
        # Another query under the same writer id: its batch 0 is written.
        seen.append(await fenced(stream, b"n0\n", Fence.for_stream("w", 0, 0, "query-b")))

        fence = Fence.for_stream("w", 7, 3, "query-a")
        eo._registers.clear()
        outcomes = await asyncio.gather(
            *(fenced_append(client, race, io.BytesIO(b"row\n"), fence) for _ in range(6))
        )
        seen.append(sum(o.appended for o in outcomes))

        def batch_fence(run: str, rows: str, partition: int = 0) -> Fence:
            return Fence.for_batch("nightly", partition, run, rows)

        seen.append(await fenced(batch, b"a\n", batch_fence("run1", "rows-a")))
        seen.append(await fenced(batch, b"a\n", batch_fence("run1", "rows-a")))
        seen.append(await fenced(batch, b"a\n", batch_fence("run2", "rows-a")))
        seen.append(await fenced(batch, b"b\n", batch_fence("run3", "rows-b")))
        # An expired batch label is dropped by a later sink append.
        stale = Fence.for_batch("old", 0).name
        old = int(time.time()) - eo.BATCH_LABEL_TTL_SECONDS - 60
        await append(client, batch, b"-\n", union_registers=label_set({stale: f"{old}.r.x"}))
        seen.append(await fenced(batch, b"c\n", batch_fence("run4", "rows-c", 1)))
        seen.append(await fenced(batch, b"d\n", batch_fence("run5", "rows-d", 2), forget=False))

        for journal in names:
            content = b"".join([c async for c in read_journal(client, journal)])
            seen.append(content)
            resp = await append(client, journal, b"")  # Nothing appended: the registers.
            labels = []
            for label in resp.registers.labels:
                value = label.value
                if label.name.startswith(eo.BATCH_LABEL):
                    # <commit time>.<run>.<rows>: the time differs between the two runs
                    # (a second may tick between them); it must be this run's, not copied.
                    at, _, value = value.partition(".")
                    assert started - 1 <= int(at) <= time.time() + 1, label
                labels.append((label.name, value))
            seen.append(sorted(labels))
    return seen


@pytest.mark.timeout(120)
def test_sink_fences_do_on_gazette_what_they_do_on_pygazette(
    gazette: GazetteBroker, pygazette: BrokerProcess
) -> None:
    theirs = asyncio.run(sequences(gazette.url))
    ours = asyncio.run(sequences(pygazette.url))
    assert theirs == ours
    assert ours[:8] == [True, False, True, True, True, False, True, 1]
    assert ours[8:14] == [True, False, False, True, True, True]


async def _labels_across_a_restart(url: str, restart: object) -> tuple[list[str], list[str]]:
    """The sink labels of a journal before and after its lone broker is killed and started
    again (`restart`), its first fragment persisted."""
    journal = "spark/fence/restart"
    s = spec(journal)
    s.fragment.length = 1024  # The first append fills a fragment, persisted at once.
    fence = Fence.for_stream("w", 0, 5, "query-a")
    async with JournalClient(url) as client:
        await apply_journals(client, [pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0)])
        eo._registers.clear()
        for _ in range(100):  # Until the journal is assigned to the broker.
            try:
                rows = io.BytesIO(b"r" * 2047 + b"\n")
                assert (await fenced_append(client, journal, rows, fence)).appended
                break
            except GazetteError as exc:
                if exc.status != pb.NO_JOURNAL_PRIMARY_BROKER:
                    raise
                await asyncio.sleep(0.1)
        before = [label.name for label in (await append(client, journal, b"")).registers.labels]
        for _ in range(300):  # Until the first fragment is persisted.
            if any(f.spec.backing_store for f in await list_all_fragments(client, journal)):
                break
            await asyncio.sleep(0.1)
    restart()  # type: ignore[operator]
    async with JournalClient(url) as client:
        for _ in range(200):
            try:
                resp = await append(client, journal, b"")
                break
            except GazetteError as exc:
                if exc.status == pb.INDEX_HAS_GREATER_OFFSET:  # Gazette: its spool is gone.
                    await append(client, journal, b"", offset=2048)  # gazctl's reset-head.
                await asyncio.sleep(0.1)
        return before, [label.name for label in resp.registers.labels]


def _restart(broker: GazetteBroker | BrokerProcess) -> None:
    broker.kill()
    broker.start()


@pytest.mark.timeout(120)
def test_sink_labels_do_not_survive_a_restart_of_gazettes_broker(gazette: GazetteBroker) -> None:
    """Why the README says the fence is lost on Gazette when a journal's brokers restart:
    Gazette holds registers in its replicas' memory only."""
    name = Fence.for_stream("w", 0, 5).name
    theirs = asyncio.run(_labels_across_a_restart(gazette.url, lambda: _restart(gazette)))
    assert theirs == ([name], [])


@pytest.mark.timeout(120)
def test_sink_labels_survive_a_restart_of_pygazettes_broker(pygazette: BrokerProcess) -> None:
    name = Fence.for_stream("w", 0, 5).name
    ours = asyncio.run(_labels_across_a_restart(pygazette.url, lambda: _restart(pygazette)))
    assert ours == ([name], [name])
