"""Admission control against a real broker: budgets end at record boundaries."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.client import SyncJournalClient
from pygazette.message.fixed_framing import encode_fixed_frame
from pygazette.spark import journals as jn
from pygazette.spark import runtime
from pygazette.spark.admission import Budget, admit, split_evenly
from pygazette.spark.framing import Framing
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import append_each, json_records
from tests.support.spark_session import create_journals, journal_spec


@settings(deadline=None)
@given(
    st.integers(0, 10_000),
    st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 5_000), max_size=6),
)
def test_split_evenly_is_exact_and_capped(total: int, weights: dict[str, int]) -> None:
    shares = split_evenly(total, weights)
    assert set(shares) == set(weights)
    assert all(0 <= shares[k] <= max(0, weights[k]) for k in weights)
    assert sum(shares.values()) == min(total, sum(w for w in weights.values() if w > 0))


def records_for(framing: Framing, count: int) -> list[bytes]:
    if framing is Framing.PROTOBUF_FIXED:
        return [encode_fixed_frame(b"message-%d" % i * (1 + i % 3)) for i in range(count)]
    if framing is Framing.CSV:
        out = []
        for i in range(count):
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerow([i, f"multi\nline {i}", "x" * (i % 5)])
            out.append(buf.getvalue().encode())
        return out
    return json_records(0, count, pad=3)


@pytest.mark.parametrize(
    "framing", [Framing.LINES, Framing.CSV, Framing.PROTOBUF_FIXED, Framing.RAW]
)
def test_budgets_end_on_record_boundaries(
    spark_broker: BrokerProcess, gz: SyncJournalClient, framing: Framing
) -> None:
    a, b = f"spark/admit/{framing.value}/a", f"spark/admit/{framing.value}/b"
    create_journals(gz, journal_spec(a, fragment_length=1024), journal_spec(b))
    recs = records_for(framing, 120)
    # Appends of 10 records each: fragment ends of `a` fall on append (record) boundaries.
    append_each(gz, a, [b"".join(recs[i : i + 10]) for i in range(0, 120, 10)])
    append_each(gz, b, [b"".join(recs[:40])])
    boundaries: dict[str, set[int]] = {a: set(), b: set()}
    for j, count in ((a, 120), (b, 40)):
        offset = 0
        for i, r in enumerate(recs[:count]):
            offset += len(r)
            if framing is not Framing.RAW or (i + 1) % 10 == 0:
                boundaries[j].add(offset)  # Raw rows end at append boundaries only.
    first_row = {j: min(boundaries[j]) for j in (a, b)}
    if framing is Framing.RAW:  # The first raw row ends with the first fragment.
        first_row = {j: min(f.spec.end for f in gz.list_all_fragments(j)) for j in (a, b)}

    async def run(client: object, budget: Budget) -> tuple[dict[str, int], dict[str, int]]:
        heads = await jn.write_heads(client, [a, b])  # type: ignore[arg-type]
        listings = await jn.all_fragments(client, [a, b])  # type: ignore[arg-type]
        start = {a: 0, b: 0}
        return heads, await admit(client, framing, start, heads, listings, budget)  # type: ignore[arg-type]

    heads, everything = runtime.call(spark_broker.url, lambda c: run(c, Budget(None, None)))
    assert everything == heads
    total = sum(heads.values())
    for max_bytes in (1, 300, total // 3, total - 1):
        _, end = runtime.call(spark_broker.url, lambda c, m=max_bytes: run(c, Budget(m, None)))
        for j in (a, b):
            assert end[j] == 0 or end[j] in boundaries[j], (j, end[j])
        admitted = sum(end.values())
        assert admitted > 0  # A stream always progresses...
        if admitted > max_bytes:  # ...admitting one oversized record when nothing fits.
            assert sum(1 for j in (a, b) if end[j] > 0) == 1
            j = a if end[a] else b
            assert end[j] == first_row[j], (max_bytes, end, heads)

    if framing is not Framing.RAW:
        for max_records in (1, 7, 50, 159):
            _, end = runtime.call(
                spark_broker.url, lambda c, m=max_records: run(c, Budget(None, m))
            )
            admitted_records = sum(len([x for x in boundaries[j] if x <= end[j]]) for j in (a, b))
            assert admitted_records == max_records
        _, end = runtime.call(spark_broker.url, lambda c: run(c, Budget(2000, 30)))
        assert sum(end.values()) <= 2000 or sum(1 for v in end.values() if v) == 1
        assert sum(len([x for x in boundaries[j] if x <= end[j]]) for j in (a, b)) <= 30
