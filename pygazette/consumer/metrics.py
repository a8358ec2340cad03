"""The consumer's Prometheus metrics.

Gazette's names, read from the local shards when scraped (`ShardCollector`), so transactions
cost nothing extra: `gazette_shard_up`{shard,status} (1 per local shard, with its replica
status), `gazette_shard_transactions_total`, `gazette_shard_read_messages_total`,
`gazette_shard_read_bytes_total`{shard} (committed transactions of a primary, since it became
primary here) and `gazette_shard_read_head`{shard,journal} (the offset through which committed
transactions read each source). Counted as they happen: `gazette_recoverylog_recovered_bytes_total`
(bytes read from recovery logs, per chunk) and pygazette's own
`pygazette_shard_transaction_duration_seconds` (from a transaction's first message to its
commit being handed to the store; one observation per transaction) and
`pygazette_shard_recoveries_total`{shard} (replicas recovered again in place after a
transient failure: see `transient_failure`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pygazette.protocol.pb import consumer_pb2 as cpb

disable_created_metrics()  # type: ignore[no-untyped-call]

RECOVERED_BYTES = Counter(
    "gazette_recoverylog_recovered_bytes",
    "Cumulative number of bytes recovered to local disk from recovery logs.",
)
TXN_SECONDS = Histogram(
    "pygazette_shard_transaction_duration_seconds",
    "Seconds from a consumer transaction's first message to its commit.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
RECOVERIES = Counter(
    "pygazette_shard_recoveries",
    "Times a shard replica recovered again in place after a transient failure.",
    labelnames=["shard"],
)


def _status_name(code: int) -> str:
    try:
        return cpb.ReplicaStatus.Code.Name(code)
    except ValueError:
        return str(code)


class ShardCollector:
    """Metrics of the shards this process holds: `replicas` maps shard ID → its replica
    (with `status()` and, for primaries, a `progress_state` Progress)."""

    def __init__(self, replicas: Callable[[], Mapping[str, Any]]) -> None:
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gazette_shard_up",
            "Indicates the processing status of a shard by this consumer.",
            labels=["shard", "status"],
        )
        txns = CounterMetricFamily(
            "gazette_shard_transactions", "Total number of consumer transactions.", labels=["shard"]
        )
        messages = CounterMetricFamily(
            "gazette_shard_read_messages",
            "Total number of messages processed by completed consumer transactions.",
            labels=["shard"],
        )
        nbytes = CounterMetricFamily(
            "gazette_shard_read_bytes",
            "Total byte-length of messages processed by completed consumer transactions.",
            labels=["shard"],
        )
        head = GaugeMetricFamily(
            "gazette_shard_read_head",
            "Current read head of the consumer (i.e., next journal byte offset to be read).",
            labels=["shard", "journal"],
        )
        for shard, replica in sorted(self.replicas().items()):
            up.add_metric([shard, _status_name(replica.status.code)], 1.0)
            progress = getattr(replica, "progress_state", None)
            if progress is None:
                continue
            txns.add_metric([shard], progress.transactions)
            messages.add_metric([shard], progress.messages)
            nbytes.add_metric([shard], progress.bytes)
            for journal, offset in sorted(progress.read_through.items()):
                head.add_metric([shard, journal], offset)
        yield from (up, txns, messages, nbytes, head)
