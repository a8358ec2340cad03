"""pygazette's client against the released Gazette broker: its integration tests, rerun.

The tests of tests/client/test_integration.py run here unchanged, with their `broker` being a
Gazette broker. Left out: the crash-recovery test, which kills the broker and expects
acknowledged appends to survive; a lone Gazette broker keeps unpersisted spools in temporary
files and loses them (it relies on replication instead; pygazette's spools are crash-safe).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pygazette.client import JournalClient
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.client.test_integration import (  # noqa: F401 (collected here against Gazette)
    J,
    create,
    journal_spec,
    test_a_gap_in_old_fragments_is_reported_as_one_offset_jump,
    test_a_read_skipping_to_the_head_by_mod_time_keeps_the_head_it_was_told,
    test_a_waiter_cancelled_leaves_the_async_append_it_awaited_alone,
    test_aborted_append_leaves_nothing,
    test_an_append_whose_task_is_cancelled_before_its_commit_leaves_nothing,
    test_apply_list_append_read_round_trip,
    test_apply_revisions_are_checked,
    test_blocking_read_from_the_write_head,
    test_blocking_reads_see_later_appends,
    test_do_not_proxy_reads_persisted_fragments_directly,
    test_fragments_cover_the_journal,
    test_fragments_of_a_journal_named_with_a_percent_sign_are_read_directly,
    test_large_append_is_chunked_and_reads_back,
    test_non_blocking_read_at_the_head_keeps_the_head_it_was_told,
    test_non_blocking_read_at_the_head_raises,
    test_reader_offsets_and_end_offset,
    test_retry_reader_polls_again_after_reaching_the_head,
    test_sync_client_round_trip,
    test_unknown_journal,
    test_wrong_append_offset_and_register_mismatch,
)
from tests.support.gazette_process import EtcdServer, GazetteBinaries, GazetteBroker


@pytest.fixture
def broker(binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path) -> Iterator[GazetteBroker]:
    proc = GazetteBroker(binaries.gazette, etcd, tmp_path / "gazette")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


async def wait_assigned(client: JournalClient, name: str) -> None:
    """Gazette assigns a new journal to a broker shortly after it is created."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        async for resp in client.rpc_list(pb.ListRequest()):
            if any(j.spec.name == name and j.route.primary == 0 for j in resp.journals):
                return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{name} was never assigned")


@pytest.fixture
async def client(broker: GazetteBroker) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.url) as c:
        await create(c, journal_spec())
        await wait_assigned(c, J)
        yield c
