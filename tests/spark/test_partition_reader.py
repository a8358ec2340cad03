"""Executor-side reads against real brokers, without Spark: direct fragment reads, the
fall-back to brokers, splits at record boundaries and data loss found while reading."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pygazette.client import SyncJournalClient
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.spark import journals as jn
from pygazette.spark import runtime
from pygazette.spark.framing import Framing
from pygazette.spark.partition_reader import DataLossError, read_partition
from pygazette.spark.planning import GazettePartition, plan
from pygazette.spark.schema import default_schema, layout
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import (
    append_each,
    fragment_path,
    json_records,
    wait_for,
    wait_persisted,
)
from tests.support.spark_session import create_journals, journal_spec

LINES = layout(default_schema(Framing.LINES), Framing.LINES)


@pytest.fixture
def own_broker(broker: BrokerProcess) -> Iterator[tuple[BrokerProcess, SyncJournalClient]]:
    with SyncJournalClient(broker.url) as client:
        yield broker, client


def planned(
    url: str, journal: str, framing: Framing, min_partitions: int | None = None
) -> tuple[list[GazettePartition], list[jn.FragmentInfo]]:
    async def go(c: object) -> tuple[int, list[jn.FragmentInfo]]:
        head = await jn.write_head(c, journal)  # type: ignore[arg-type]
        return head, await jn.fragments(c, journal)  # type: ignore[arg-type]

    head, listing = runtime.call(url, go)  # type: ignore[arg-type]
    parts, losses = plan(
        {journal: (0, head)},
        {journal: listing},
        framing,
        min_partitions=min_partitions,
        streaming=True,
    )
    assert not losses
    return parts, listing


def rows(
    url: str, parts: list[GazettePartition], fail: bool = True, file_root: Path | None = None
) -> list[tuple[int, bytes]]:
    out = []
    root = None if file_root is None else str(file_root)
    for part in parts:
        for batch in read_partition(url, part, LINES, fail, root):
            out.extend(
                zip(
                    batch.column("offset").to_pylist(),
                    batch.column("value").to_pylist(),
                    strict=True,
                )
            )
    return out


def expected_lines(records: list[bytes]) -> list[tuple[int, bytes]]:
    out, offset = [], 0
    for r in records:
        out.append((offset, r.rstrip(b"\n")))
        offset += len(r)
    return out


def test_persisted_fragments_are_read_directly_without_brokers(
    own_broker: tuple[BrokerProcess, SyncJournalClient],
) -> None:
    broker, client = own_broker
    j = "spark/reader/direct"
    create_journals(client, journal_spec(j, codec=pb.ZSTANDARD, fragment_length=1024))
    records = json_records(0, 120, pad=20)
    appends = [b"".join(records[i : i + 30]) for i in range(0, 120, 30)]
    append_each(client, j, appends)
    wait_persisted(client, j, sum(map(len, appends)))
    parts, listing = planned(broker.url, j, Framing.LINES, min_partitions=5)
    assert all(f.url.startswith("file://") for f in listing)
    broker.kill()  # Only the fragment files remain, under the broker's file root.
    assert rows(broker.url, parts, file_root=broker.file_root) == expected_lines(records)


def test_unreachable_fragment_urls_fall_back_to_brokers_and_splits_keep_records_whole(
    spark_broker: BrokerProcess, gz: SyncJournalClient
) -> None:
    j = "spark/reader/fallback"
    create_journals(gz, journal_spec(j, fragment_length=1024))
    records = json_records(0, 200, pad=13)
    appends = [b"".join(records[i : i + 50]) for i in range(0, 200, 50)]
    append_each(gz, j, appends)
    wait_persisted(gz, j, sum(map(len, appends)))
    parts, _ = planned(spark_broker.url, j, Framing.LINES, min_partitions=7)
    broken = []
    for part in parts:
        pieces = []
        for p in part.pieces:
            assert p.fragment is not None
            frag = p.fragment.__class__(
                p.fragment.journal,
                p.fragment.begin,
                p.fragment.end,
                p.fragment.mod_time,
                "file:///nonexistent/fragment",  # Not reachable from this "executor".
                p.fragment.spec,
            )
            pieces.append(p.__class__(**{**_fields(p), "fragment": frag}))
        broken.append(GazettePartition(pieces))
    assert len([p for part in broken for p in part.pieces]) >= 7
    got = rows(spark_broker.url, broken, file_root=spark_broker.file_root)
    assert got == expected_lines(records)


def _fields(piece: object) -> dict[str, object]:
    return {name: getattr(piece, name) for name in piece.__slots__}  # type: ignore[attr-defined]


def test_data_removed_after_planning_is_a_data_loss(
    own_broker: tuple[BrokerProcess, SyncJournalClient],
) -> None:
    broker, client = own_broker
    j = "spark/reader/loss"
    create_journals(client, journal_spec(j, fragment_length=1024))
    records = json_records(0, 90, pad=30)
    appends = [b"".join(records[i : i + 30]) for i in range(0, 90, 30)]
    append_each(client, j, appends)
    frags = wait_persisted(client, j, sum(map(len, appends)))
    parts, listing = planned(broker.url, j, Framing.LINES)
    # Remove the middle fragment's file; make the others old enough for the broker to skip
    # the hole (Gazette only jumps over holes next to fragments older than six hours).
    files = {f.begin: fragment_path(broker.file_root, f.url) for f in listing}
    middle = sorted(files)[1]
    files[middle].unlink()
    old = time.time() - 7 * 3600
    for begin, path in files.items():
        if begin != middle:
            os.utime(path, (old, old))
    wait_for(
        lambda: middle not in {f.spec.begin for f in client.list_all_fragments(j)},
        what="the broker to notice the removed fragment",
    )
    # The plan still points at the removed file: the reader falls back to the broker,
    # which reports the hole.
    with pytest.raises(DataLossError, match=r"offsets \[\d+, \d+\)"):
        rows(broker.url, parts, file_root=broker.file_root)
    kept = rows(broker.url, parts, fail=False, file_root=broker.file_root)
    lost = {r[0] for r in expected_lines(records) if frags[1].begin <= r[0] < frags[1].end}
    assert kept == [r for r in expected_lines(records) if r[0] not in lost]
    assert [json.loads(v)["n"] for _, v in kept] == list(range(30)) + list(range(60, 90))
