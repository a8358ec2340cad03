"""Fixtures of the broker tests: a framed-snappy reader built from Gazette's snappy library."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broker.fragment_helpers import build_snappycat


@pytest.fixture(scope="session")
def snappycat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = build_snappycat(tmp_path_factory.mktemp("snappycat"))
    if exe is None:
        pytest.skip("Go and the golang/snappy module are needed for the framed-snappy reader")
    return exe
