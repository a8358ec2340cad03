"""`/metrics` and the health endpoints of a real broker process (`serve --http-port`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from pygazette.broker.metrics import OTHER_JOURNALS, JournalLabels
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, list_once, read_all
from tests.support.broker_process import BrokerProcess
from tests.support.http_scrape import get, scrape, scrape_text, value, wait_status
from tests.support.ports import free_port


@pytest.fixture
def http_broker(tmp_path: Path) -> Iterator[tuple[BrokerProcess, str]]:
    http_port = free_port()
    proc = BrokerProcess(tmp_path / "data", extra_args=["--http-port", str(http_port)])
    proc.start()
    base = f"http://127.0.0.1:{http_port}"
    try:
        wait_status(base + "/debug/ready")
        yield proc, base
    finally:
        proc.kill()


@pytest.fixture
async def stub(http_broker: tuple[BrokerProcess, str]) -> AsyncIterator[pb_grpc.JournalStub]:
    async with grpc.aio.insecure_channel(http_broker[0].address) as channel:
        yield pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]


async def test_health_endpoints(http_broker: tuple[BrokerProcess, str]) -> None:
    _, base = http_broker
    assert get(base + "/debug/ready") == (200, b"ready\n")
    assert get(base + "/debug/live") == (200, b"ok\n")


async def test_metrics_after_a_workload(
    http_broker: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    _, base = http_broker
    journal = "metrics/workload"
    assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK
    before = await asyncio.to_thread(scrape, base)

    sizes = [1, 100, 4096, 70_000, 300_000, 7]  # K appends, N bytes.
    for size in sizes:
        resp = await append(stub, journal, b"x" * size)
        assert resp.status == pb.OK
    content, _ = await read_all(stub, journal)
    assert len(content) == sum(sizes)

    text = await asyncio.to_thread(scrape_text, base)
    after = await asyncio.to_thread(scrape, base)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    k, n = len(sizes), sum(sizes)
    assert value(after, "gazette_write_head", journal=journal) == n
    assert moved("gazette_spool_commits_total") == k
    assert moved("gazette_spool_commit_bytes_total") == n
    assert moved("pygazette_append_bytes_count", journal=journal) == k
    assert moved("pygazette_append_bytes_sum", journal=journal) == n
    assert moved("pygazette_append_duration_seconds_count", journal=journal) == k
    assert moved("pygazette_read_content_bytes_total", journal=journal) == n
    assert moved("pygazette_read_bytes_count", journal=journal) == 1

    # Gazette's RPC counters, named exactly as Gazette names them (`…_totals`, no `_total`
    # appended); the parser reports counter samples with `_total` added.
    assert "# TYPE gazette_journal_server_started_totals counter\n" in text
    assert 'gazette_journal_server_started_totals{operation="Append"} ' in text
    assert "gazette_journal_server_started_totals_total" not in text
    started, completed = (
        "gazette_journal_server_started_totals_total",
        "gazette_journal_server_completed_totals_total",
    )
    assert moved(started, operation="Append") == k
    assert moved(completed, operation="Append", status="ok") == k
    assert moved(started, operation="Read") == 1
    assert moved(completed, operation="Read", status="ok") == 1

    # State read when scraped, and the process collector.
    assert value(after, "pygazette_broker_journals", role="primary") == 1
    # The store's first health check runs in the background (0 while pending).
    for _ in range(600):
        if value(after, "pygazette_store_healthy", store="file:///") == 1:
            break
        await asyncio.sleep(0.05)
        after = await asyncio.to_thread(scrape, base)
    assert value(after, "pygazette_store_healthy", store="file:///") == 1
    assert value(after, "process_resident_memory_bytes") > 0
    assert value(after, "process_open_fds") > 0
    assert "gazette_spool_commits_created" not in text  # Gazette has no `_created` series.


async def test_rollbacks_and_refusals_are_counted(
    http_broker: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    _, base = http_broker
    journal = "metrics/rollback"
    assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK
    before = await asyncio.to_thread(scrape, base)
    # A stream ending without its commit chunk rolls the append back.
    with pytest.raises(grpc.aio.AioRpcError):
        await append(stub, journal, b"y" * 1000, commit=False)
    missing = await stub.Read(pb.ReadRequest(journal="metrics/missing")).read()
    assert missing.status == pb.JOURNAL_NOT_FOUND
    # The server counts an RPC once its handler has returned, which may be a moment after
    # the client saw its outcome: scrape until both RPCs are counted.
    after = await asyncio.to_thread(scrape, base)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    completed = "gazette_journal_server_completed_totals_total"
    for _ in range(100):
        if moved(completed, operation="Append", status="<error>") and moved(
            completed, operation="Read", status="JOURNAL_NOT_FOUND"
        ):
            break
        await asyncio.sleep(0.05)
        after = await asyncio.to_thread(scrape, base)

    assert moved("gazette_spool_rollbacks_total") == 1
    assert moved("gazette_spool_rollback_bytes_total") == 1000
    assert moved("gazette_spool_commits_total") == 0
    assert (
        moved("gazette_journal_server_completed_totals_total", operation="Append", status="<error>")
        == 1
    )
    assert (
        moved(
            "gazette_journal_server_completed_totals_total",
            operation="Read",
            status="JOURNAL_NOT_FOUND",
        )
        == 1
    )
    # An unknown journal adds no per-journal series.
    assert value(after, "pygazette_read_bytes_count", journal="metrics/missing") == 0


async def test_rpc_statuses_are_counted_as_gazette_counts_them(
    http_broker: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    """Gazette labels a completed Read (and ListFragments, Replicate) with its journal's
    resolution status (JOURNAL_NOT_FOUND, SUSPENDED, ...), not with whatever its response
    said: a read at the write head (OFFSET_NOT_YET_AVAILABLE, how every non-blocking read to
    the head ends) is "ok", and so is a blocking read its client cancelled (Gazette suppresses
    the cancellation). List, Apply and FragmentStoreHealth are "ok" unless they failed
    (ETCD_TRANSACTION_FAILED is an answer). Counted otherwise, the everyday reads of
    consumers and batch jobs looked like errors next to Gazette's."""
    _, base = http_broker
    journal = "metrics/statuses"
    assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK
    assert (await append(stub, journal, b"0123456789")).status == pb.OK
    before = await asyncio.to_thread(scrape, base)

    at_head = await stub.Read(pb.ReadRequest(journal=journal, offset=10)).read()
    assert at_head.status == pb.OFFSET_NOT_YET_AVAILABLE
    blocking = stub.Read(pb.ReadRequest(journal=journal, offset=10, block=True))
    waiting = asyncio.ensure_future(blocking.read())
    stale = pb.ApplyRequest(
        changes=[pb.ApplyRequest.Change(upsert=journal_spec(journal), expect_mod_revision=1)]
    )
    assert (await stub.Apply(stale)).status == pb.ETCD_TRANSACTION_FAILED

    completed = "gazette_journal_server_completed_totals_total"

    def moved(after: dict[Any, float], **labels: str) -> float:
        return value(after, completed, **labels) - value(before, completed, **labels)

    async def wait_counted(reads: int) -> dict[Any, float]:
        for _ in range(200):
            after = await asyncio.to_thread(scrape, base)
            counted = sum(
                v - value(before, name, **dict(labels))
                for (name, labels), v in after.items()
                if name == completed and ("operation", "Read") in labels
            )
            if counted == reads:
                return after
            await asyncio.sleep(0.05)
        raise AssertionError(f"{reads} reads were not counted")

    await wait_counted(1)
    blocking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    after = await wait_counted(2)
    assert moved(after, operation="Read", status="ok") == 2
    assert moved(after, operation="Apply", status="ok") == 1


async def test_store_put_bytes_are_labelled_as_gazettes(
    http_broker: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    """gazette_store_put_bytes_total{store,encoding}: a fragment put with no content encoding
    is labelled encoding="none", as Gazette labels it (ActiveStore.Put), so that a query or
    dashboard made for Gazette's series finds them."""
    _, base = http_broker
    journal = "metrics/persisted"
    # Fragments of at most 1 KiB: each append of 1,500 bytes rolls the spool, which is persisted.
    assert (await apply_specs(stub, journal_spec(journal, length=1024))).status == pb.OK
    before = await asyncio.to_thread(scrape, base)
    for _ in range(3):
        assert (await append(stub, journal, b"p" * 1500)).status == pb.OK
    name = "gazette_store_put_bytes_total"
    for _ in range(200):
        after = await asyncio.to_thread(scrape, base)
        put = {
            dict(labels)["encoding"]: v - before.get((n, labels), 0.0)
            for (n, labels), v in after.items()
            if n == name and ("store", "file:///") in labels
        }
        if sum(put.values()) >= 3000:
            break
        await asyncio.sleep(0.05)
    assert put.get("none", 0) >= 3000, put
    assert set(put) == {"none"}, put


async def test_a_deleted_journal_takes_its_series_with_it(
    http_broker: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    # Journals that come and go (a Spark job's per-run journals): each deleted journal left
    # its write head gauge, its append and read histograms and the broker's cached children
    # of them, for as long as the broker ran; and once MAX_JOURNAL_LABELS journals had been
    # seen, deleted or not, every later journal's appends and reads were only `_other`.
    _, base = http_broker
    names = [f"metrics/run-{i}" for i in range(3)]
    for name in names:
        assert (await apply_specs(stub, journal_spec(name))).status == pb.OK
        assert (await append(stub, name, b"x" * 10)).status == pb.OK
        assert (await read_all(stub, name))[0] == b"x" * 10
    samples = await asyncio.to_thread(scrape, base)
    for name in names:
        assert value(samples, "gazette_write_head", journal=name) == 10
        assert value(samples, "pygazette_read_bytes_count", journal=name) == 1

    listing = await list_once(stub, pb.ListRequest())
    changes = [
        pb.ApplyRequest.Change(delete=j.spec.name, expect_mod_revision=j.mod_revision)
        for j in listing.journals
        if j.spec.name in names
    ]
    assert (await stub.Apply(pb.ApplyRequest(changes=changes))).status == pb.OK
    for _ in range(600):
        text = await asyncio.to_thread(scrape_text, base)
        if 'journal="metrics/run-' not in text:
            break
        await asyncio.sleep(0.05)
    assert 'journal="metrics/run-' not in text

    # A journal of a deleted one's name starts its series afresh.
    assert (await apply_specs(stub, journal_spec(names[0]))).status == pb.OK
    resp = await append(stub, names[0], b"y" * 5)
    assert resp.status == pb.OK
    samples = await asyncio.to_thread(scrape, base)
    assert value(samples, "gazette_write_head", journal=names[0]) == resp.commit.end
    assert value(samples, "pygazette_append_bytes_count", journal=names[0]) == 1


def test_a_journal_label_value_goes_back_when_its_journal_leaves() -> None:
    labels = JournalLabels(limit=2)
    assert (labels("a"), labels("b"), labels("c")) == ("a", "b", OTHER_JOURNALS)
    assert labels.release("a")
    assert not labels.release("c")  # It had none.
    assert (labels("c"), labels("d")) == ("c", OTHER_JOURNALS)
