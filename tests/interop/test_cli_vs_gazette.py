"""The `pygazette journals ...` CLI against the released Gazette broker: its tests, rerun.

The broker-backed tests of tests/cli/test_journals_cli.py run here unchanged, with their
`broker` being a Gazette broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_journals_cli import (  # noqa: F401 (collected here against Gazette)
    test_append_lines_and_read_back_byte_identical,
    test_apply_then_list_in_every_format,
    test_binary_content_round_trips,
    test_blocking_read_streams_new_content,
    test_dry_run_applies_nothing,
    test_fragments_table_and_json,
    test_garbage_yaml_is_one_line_and_applies_nothing,
    test_invalid_selector,
    test_unknown_journal_reports_the_status,
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
