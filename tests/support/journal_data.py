"""Test journals: specs, writing records, and waiting for their fragments to persist."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pygazette.client import SyncJournalClient
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb


def json_records(first: int, count: int, *, pad: int = 0) -> list[bytes]:
    """JSON lines {"n": i, "user": "u<i % 7>", "pad": "..."}."""
    return [
        json.dumps({"n": i, "user": f"u{i % 7}", "pad": "x" * pad}).encode() + b"\n"
        for i in range(first, first + count)
    ]


def append_each(client: SyncJournalClient, journal: str, appends: Iterable[bytes]) -> list[int]:
    """Append each item atomically; returns the begin offset of each append."""
    return [client.append(journal, data).commit.begin for data in appends]


def persisted(client: SyncJournalClient, journal: str) -> list[pb.Fragment]:
    return [f.spec for f in client.list_all_fragments(journal) if f.spec.backing_store]


def wait_for(predicate: object, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll `predicate()` until it is true (brokers persist and refresh in the background)."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def wait_persisted(client: SyncJournalClient, journal: str, upto: int) -> list[pb.Fragment]:
    """Wait until persisted fragments cover the journal up to offset `upto`."""
    wait_for(
        lambda: max((f.end for f in persisted(client, journal)), default=0) >= upto,
        what=f"{journal} persisted up to {upto}",
    )
    return persisted(client, journal)


def fragment_path(file_root: Path, url: str) -> Path:
    """The file of a `file://` fragment URL, signed relative to the broker's file root."""
    assert url.startswith("file://"), url
    return file_root / unquote(urlsplit(url).path).lstrip("/")


def small_journal_spec(name: str, content_type: str = "application/x-ndjson") -> pb.JournalSpec:
    """A replication-1 journal of `content_type` in the broker's file store: 1 MiB snappy
    fragments, listed every second (what the consumer tests create their journals with)."""
    spec = pb.JournalSpec(
        name=name, replication=1, labels=label_set({"content-type": content_type})
    )
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 1
    return spec
