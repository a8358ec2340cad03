"""Keyspace metrics, read when scraped: the revision this process's keyspace mirror has
reached (`pygazette_keyspace_revision`), which an operator compares across processes to spot
one whose watch stalled."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from pygazette.keyspace.keyspace import Keyspace


class KeyspaceCollector:
    def __init__(self, keyspace: Keyspace) -> None:
        self.keyspace = keyspace

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "pygazette_keyspace_revision",
            "Revision of the coordination keyspace this process has applied.",
            value=self.keyspace.revision,
        )
