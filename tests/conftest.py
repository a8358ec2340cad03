"""Shared fixtures: a real broker subprocess per test that asks for one, a local S3
server (`moto_server`) for the session, and one etcd for the session with a key root per
test. Servers check their responses (PYGAZETTE_CHECK_RESPONSES=1, set for the whole run)."""

from __future__ import annotations

import asyncio
import inspect
import os

# Before anything imports grpc: a test worker runs gRPC threads (in-process servers, clients,
# Spark's loop) and forks children (PySpark's Java gateway through preexec_fn, servers started
# as another user). With gRPC's fork support on (its default), a fork while other threads are
# in a call skips gRPC's fork handlers and the child can crash in gRPC's poller before it execs
# (CI saw initdb die of SIGSEGV). grpc.aio does not support fork anyway; children only exec.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.broker_process import BrokerProcess
from tests.support.etcd_process import EtcdProcess, etcd_binary
from tests.support.s3_server import S3Server, export_credentials, restore_environment

# Every server the tests start (in-process, or a subprocess inheriting this environment) checks
# each response with Gazette's rules before sending it, and fails the RPC if one breaks a rule
# (pygazette.protocol.response_checks): any invariant a test drives a server into fails it.
os.environ["PYGAZETTE_CHECK_RESPONSES"] = "1"

# Property tests check properties, not speed: on a shared 2-core machine a single example
# can take longer than Hypothesis's default 200 ms deadline without anything being wrong.
settings.register_profile("pygazette", deadline=None)
settings.load_profile("pygazette")


# grpc.aio ends an RPC cancelled on the client (a reader closed, a channel closed) a moment
# later: gRPC's core hands the call's final status to the loop that made it, through one
# poller shared by every event loop of the process. A test's loop closed before then leaves
# that delivery to another loop still running (the Spark runtime's, a sync client's), which
# fails it: "Event loop is closed", logged from that loop during some later test. So an async
# test's loop closes only once the RPCs it cancelled have ended (each task below ends when
# its call's status arrives: milliseconds after the cancellation, or never for a call still
# open on a channel left open, hence the bound).
GRPC_CALLS_END_SECONDS = 2.0


def _grpc_calls_ending() -> list[asyncio.Task[object]]:
    return [
        t
        for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "") == "_AioCall._handle_status_once_received"
    ]


@pytest.fixture
async def _grpc_calls_ended() -> AsyncIterator[None]:
    yield
    if ending := _grpc_calls_ending():
        _done, still = await asyncio.wait(ending, timeout=GRPC_CALLS_END_SECONDS)
        if still:
            warnings.warn(
                f"{len(still)} gRPC call(s) still open as the test's event loop closes: "
                "close their channels (or servers) first",
                stacklevel=1,
            )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Async tests tear `_grpc_calls_ended` down last, just before their loop closes."""
    for item in items:
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj):
            if "_grpc_calls_ended" not in item.fixturenames:
                item.fixturenames.insert(0, "_grpc_calls_ended")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "broker-data")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A local S3-compatible server for the session; tests make their own buckets."""
    server = S3Server(tmp_path_factory.mktemp("s3"))
    saved = export_credentials()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        restore_environment(saved)


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One etcd for the whole run; tests isolate themselves under their own key roots."""
    if etcd_binary() is None:
        pytest.fail("etcd is not installed; run .ci/install-system-deps")
    proc = EtcdProcess(tmp_path_factory.mktemp("etcd") / "data")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def etcd_root(request: pytest.FixtureRequest) -> str:
    """A key root of this test's own, so tests sharing the etcd never see each other."""
    return f"/test-{uuid.uuid4().hex[:12]}/gazette/cluster"
