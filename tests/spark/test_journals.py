"""Journal look-ups of the Spark source against a real broker: write heads, where a journal
listed but not served (yet) is an error only where the caller needs it."""

from __future__ import annotations

import pytest

from pygazette.client import SyncJournalClient
from pygazette.protocol.errors import JournalNotFound
from pygazette.spark import journals as jn
from pygazette.spark import runtime
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import append_each
from tests.support.spark_session import create_journals, journal_spec


def test_write_heads_leave_out_absent_journals_only_where_allowed(
    spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    served, absent = prefix + "served", prefix + "not-served"
    create_journals(gz, journal_spec(served))
    append_each(gz, served, [b"one\n", b"two\n"])

    # A stream's newly discovered journal may be listed before a broker serves it: it is
    # left out of this micro-batch (and discovered by the next).
    heads = runtime.call(
        spark_broker.url,
        lambda c: jn.write_heads(c, [served, absent], absent_ok=frozenset({absent})),
    )
    assert heads == {served: 8}
    # A journal the query already reads must be served: its absence is an error.
    with pytest.raises(JournalNotFound, match=absent):
        runtime.call(spark_broker.url, lambda c: jn.write_heads(c, [served, absent]))
