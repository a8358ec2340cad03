"""Fixtures of the interoperability tests: Gazette's own broker (with etcd) and pygazette's.

The Gazette programs are built once from the Go module proxy (interop/build-binaries); etcd
runs once per session and every Gazette broker gets its own etcd prefix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import (
    EtcdServer,
    GazetteBinaries,
    GazetteBroker,
    gazette_binaries,
)

# Both brokers under comparison go by the same process id, so that listings match verbatim.
BROKER_ID = "interop-broker"


_BINARIES = pytest.StashKey[GazetteBinaries]()
# A test's figures travel in its report's user properties, under this name: under xdist
# (`make interop` runs two workers) reports are what reaches the process that prints them.
_FIGURES_PROPERTY = "interop_figures"
_figures: dict[str, Any] = {}  # Collected from the reports, in the process printing them.


@pytest.fixture
def interop_figures(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Figures a test measured (the Go soak's, stream-sum's), printed at the end of the run."""
    figures: dict[str, Any] = {}
    yield figures
    if figures:
        request.node.user_properties.append((_FIGURES_PROPERTY, figures))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        for name, value in report.user_properties:
            if name == _FIGURES_PROPERTY:
                _figures.update(value)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _figures:
        terminalreporter.section("interop figures")
        terminalreporter.write_line(json.dumps(_figures, indent=2))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build the Gazette programs before any test runs (once; minutes on a fresh machine),
    so that the build counts against no test's timeout."""
    here = Path(__file__).parent
    if any(here in item.path.parents for item in items):
        config.stash[_BINARIES] = gazette_binaries()


@pytest.fixture(scope="session")
def binaries(pytestconfig: pytest.Config) -> GazetteBinaries:
    return pytestconfig.stash.get(_BINARIES, None) or gazette_binaries()


@pytest.fixture(scope="session")
def etcd(
    binaries: GazetteBinaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EtcdServer]:
    server = EtcdServer(binaries.etcd, tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def gazette(binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path) -> Iterator[GazetteBroker]:
    broker = GazetteBroker(binaries.gazette, etcd, tmp_path / "gazette", broker_id=BROKER_ID)
    broker.start()
    try:
        yield broker
    finally:
        # A lone Gazette broker never finishes a graceful exit (it waits to hand its journals
        # to another broker), so it is killed.
        broker.kill()


@pytest.fixture
def pygazette(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "pygazette" / "data", extra_args=["--id", BROKER_ID])
    broker.data_dir.parent.mkdir(parents=True, exist_ok=True)
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()
