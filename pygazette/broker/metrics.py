"""The broker's Prometheus metrics.

Gazette's names where Gazette has them: `gazette_write_head`{journal} (set by a journal's
primary after each append), the spool lifecycle counters (`gazette_spool_commits_total`,
`…_commit_bytes_total`, `…_rollbacks_total`, `…_rollback_bytes_total`, `…_completed_total`,
`…_persisted_total`, counted by every replica as Gazette counts them) and
`gazette_store_put_bytes_total`{store,encoding}. And what an operator needs that Gazette
lacks, as `pygazette_…`: append and read sizes and latencies per journal, and — read from the
broker's state when scraped (`BrokerCollector`), so they cost nothing on hot paths — spool
backlog and health per store and the journals this broker serves.

Hot paths pay one or two counter increments per append, commit or read chunk, never per
byte. Per-journal series are bounded: `JournalLabels` hands out at most MAX_JOURNAL_LABELS
distinct journal label values per process at once and maps every later journal to `_other`;
labelled children are cached per journal. A journal that leaves the broker (deleted, or
served elsewhere now) takes its series, cached children and label value with it
(`forget_journal`), so a broker whose journals come and go holds only those it serves, and
later journals get label values of their own again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from pygazette.broker.fragment.persister import Persister
    from pygazette.protocol.pb import protocol_pb2 as pb

# Gazette exposes no `_created` series; neither do we.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Distinct journal label values of the per-journal histograms; later journals are `_other`.
MAX_JOURNAL_LABELS = 200
OTHER_JOURNALS = "_other"

SIZE_BUCKETS = tuple(float(1 << shift) for shift in range(8, 28, 2))  # 256 B … 64 MiB.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip

WRITE_HEAD = Gauge(
    "gazette_write_head",
    "Current write head of the journal (i.e., next byte offset to be written).",
    ["journal"],
)
SPOOL_COMMITS = Counter(
    "gazette_spool_commits", "Total number of commits of journal fragment spools."
)
SPOOL_COMMIT_BYTES = Counter(
    "gazette_spool_commit_bytes", "Total number of bytes committed to journal fragment spools."
)
SPOOL_ROLLBACKS = Counter(
    "gazette_spool_rollbacks", "Total number of rollbacks of journal fragment spools."
)
SPOOL_ROLLBACK_BYTES = Counter(
    "gazette_spool_rollback_bytes",
    "Total number of bytes rolled-back from journal fragment spools.",
)
SPOOL_COMPLETED = Counter(
    "gazette_spool_completed",
    "Total number of journal fragment spools which have been completed, and are ready for "
    "persisting.",
)
SPOOL_PERSISTED = Counter(
    "gazette_spool_persisted",
    "Total number of journal fragment spools which were persisted (by this server, or by "
    "another and then verified by this server).",
)
STORE_PUT_BYTES = Counter(
    "gazette_store_put_bytes", "Total number of bytes put to the store", ["store", "encoding"]
)

APPEND_BYTES = Histogram(
    "pygazette_append_bytes",
    "Bytes of each append committed by this broker as the journal's primary.",
    ["journal"],
    buckets=SIZE_BUCKETS,
)
APPEND_SECONDS = Histogram(
    "pygazette_append_duration_seconds",
    "Seconds from an Append RPC's start to its commit, for appends this broker served as primary.",
    ["journal"],
    buckets=LATENCY_BUCKETS,
)
READ_BYTES = Histogram(
    "pygazette_read_bytes",
    "Content bytes of each Read RPC served by this broker (observed when the read ends).",
    ["journal"],
    buckets=SIZE_BUCKETS,
)
READ_SECONDS = Histogram(
    "pygazette_read_duration_seconds",
    "Seconds each Read RPC served by this broker lasted (blocking reads last until the "
    "client ends them).",
    ["journal"],
    buckets=LATENCY_BUCKETS,
)
READ_CONTENT_BYTES = Counter(
    "pygazette_read_content_bytes",
    "Content bytes served by this broker's Read RPCs, counted as they are sent.",
    ["journal"],
)
STORE_LISTING_SKIPPED = Counter(
    "pygazette_store_listing_skipped_objects",
    "Objects of journals' fragment store listings that are not fragments (their names do not "
    "parse as fragment names), left out of the listings: each counted once, when a listing "
    "first finds it.",
)
INVALID_RESPONSES = Counter(
    "pygazette_broker_invalid_responses_total",
    "Responses this broker received from its peers that break Gazette's protocol rules "
    "(each breaks the replication pipeline it came on), by RPC.",
    ["rpc"],
)


class JournalLabels:
    """Bounded journal label values: the first `limit` journals keep their names."""

    def __init__(self, limit: int = MAX_JOURNAL_LABELS) -> None:
        self.limit = limit
        self._names: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, journal: str) -> str:
        if journal in self._names:
            return journal
        with self._lock:
            if journal in self._names:
                return journal
            if len(self._names) < self.limit:
                self._names.add(journal)
                return journal
        return OTHER_JOURNALS

    def release(self, journal: str) -> bool:
        """Give `journal`'s label value back (it left the broker); whether it had one."""
        with self._lock:
            if journal not in self._names:
                return False
            self._names.discard(journal)
            return True


JOURNAL_LABEL = JournalLabels()


class _AppendMeters:
    """The append children of one journal, looked up once (at its first append)."""

    __slots__ = ("append_bytes", "append_seconds", "write_head")

    def __init__(self, journal: str) -> None:
        label = JOURNAL_LABEL(journal)
        self.write_head = WRITE_HEAD.labels(journal)
        self.append_bytes = APPEND_BYTES.labels(label)
        self.append_seconds = APPEND_SECONDS.labels(label)


class _ReadMeters:
    """The read children of one journal, looked up once (at its first read): a journal
    only written to creates none."""

    __slots__ = ("read_bytes", "read_content", "read_seconds")

    def __init__(self, journal: str) -> None:
        label = JOURNAL_LABEL(journal)
        self.read_bytes = READ_BYTES.labels(label)
        self.read_seconds = READ_SECONDS.labels(label)
        self.read_content = READ_CONTENT_BYTES.labels(label)


_append_meters: dict[str, _AppendMeters] = {}
_read_meters: dict[str, _ReadMeters] = {}


# The series labelled with a journal's own label value (`JOURNAL_LABEL`).
_LABELLED: tuple[Histogram | Counter, ...] = (
    APPEND_BYTES,
    APPEND_SECONDS,
    READ_BYTES,
    READ_SECONDS,
    READ_CONTENT_BYTES,
)


def forget_journal(journal: str) -> None:
    """`journal` left this broker (deleted, or served elsewhere now): drop its series (its
    write head, and its append and read series if it had a label value of its own, which
    goes back for another journal to take) and its cached children. A Read still being
    served keeps counting into children no longer exposed."""
    _append_meters.pop(journal, None)
    _read_meters.pop(journal, None)
    with contextlib.suppress(KeyError):
        WRITE_HEAD.remove(journal)
    if JOURNAL_LABEL.release(journal):
        for metric in _LABELLED:
            with contextlib.suppress(KeyError):
                metric.remove(journal)


def record_append(commit: pb.Fragment, started: float) -> None:
    """An append this broker committed as primary: `commit` is its fragment, `started` the
    `time.monotonic()` at which its RPC began."""
    meters = _append_meters.get(commit.journal)
    if meters is None:
        meters = _append_meters[commit.journal] = _AppendMeters(commit.journal)
    meters.write_head.set(commit.end)
    meters.append_bytes.observe(commit.end - commit.begin)
    meters.append_seconds.observe(time.monotonic() - started)


def record_rollback(length: int) -> None:
    """An append of `length` spooled bytes was rolled back."""
    if length:
        SPOOL_ROLLBACKS.inc()
        SPOOL_ROLLBACK_BYTES.inc(length)


def record_commit(length: int) -> None:
    """A spool committed an append of `length` bytes."""
    SPOOL_COMMITS.inc()
    SPOOL_COMMIT_BYTES.inc(length)


class ReadMeter:
    """Meters one Read RPC served locally: `add` per content chunk, `close` when it ends."""

    __slots__ = ("_meters", "_started", "bytes")

    def __init__(self, journal: str) -> None:
        meters = _read_meters.get(journal)
        if meters is None:
            meters = _read_meters[journal] = _ReadMeters(journal)
        self._meters = meters
        self._started = time.monotonic()
        self.bytes = 0

    def add(self, n: int) -> None:
        self.bytes += n
        self._meters.read_content.inc(n)

    def close(self) -> None:
        self._meters.read_bytes.observe(self.bytes)
        self._meters.read_seconds.observe(time.monotonic() - self._started)


class BrokerCollector:
    """Metrics read from a broker's state at scrape time (on its event loop).

    `journals` returns (journal, is_primary) of the journals this broker serves now;
    `lease_state` (cluster mode) returns the etcd lease state.
    """

    def __init__(
        self,
        persister: Persister,
        journals: Callable[[], Iterable[tuple[str, bool]]],
    ) -> None:
        self.persister = persister
        self.journals = journals

    def collect(self) -> Iterator[Metric]:
        backlog = GaugeMetricFamily(
            "pygazette_spool_backlog_bytes",
            "Bytes of closed spools waiting to be persisted, by store.",
            labels=["store"],
        )
        for store, size in sorted(self.persister.backlogs().items()):
            backlog.add_metric([store or "(none)"], size)
        yield backlog

        healthy = GaugeMetricFamily(
            "pygazette_store_healthy",
            "1 if the store's last health check passed, 0 if it failed or is pending.",
            labels=["store"],
        )
        known = self.persister.health.known()
        for health in known:
            healthy.add_metric([health.url], 1.0 if health.healthy else 0.0)
        yield healthy
        yield GaugeMetricFamily(
            "gazette_store_active", "Number of active fragment stores", value=len(known)
        )

        primary = replica = 0
        for _journal, is_primary in self.journals():
            if is_primary:
                primary += 1
            else:
                replica += 1
        served = GaugeMetricFamily(
            "pygazette_broker_journals",
            "Journals this broker serves, by its role in their route.",
            labels=["role"],
        )
        served.add_metric(["primary"], primary)
        served.add_metric(["replica"], replica)
        yield served
