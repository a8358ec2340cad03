"""The synchronous facade, against the scripted broker."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from pygazette.client import ProtocolViolation, SyncJournalClient
from pygazette.client import sync_client as sync_client_module
from pygazette.client.sync_client import SyncClientClosed
from pygazette.protocol.errors import JournalNotFound, WrongAppendOffset
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.client.fake_broker import (
    FakeBroker,
    Hang,
    committed,
    content,
    listed,
    listing,
    metadata,
    refused,
)
from tests.support.broker_process import BrokerProcess
from tests.support.ports import free_port

J = "a/journal"


@pytest.fixture
def sync_client(fake: FakeBroker) -> Iterator[SyncJournalClient]:
    with SyncJournalClient(fake.address) as client:
        yield client


def test_read_iterates_chunks_until_the_write_head(
    fake: FakeBroker, sync_client: SyncJournalClient
) -> None:
    fake.journal.read_scripts.extend(
        [
            [metadata(0, begin=0, end=6), content(0, b"abc"), content(3, b"def")],
            [pb.ReadResponse(status=pb.OFFSET_NOT_YET_AVAILABLE, offset=6, write_head=6)],
        ]
    )
    assert b"".join(sync_client.read(J)) == b"abcdef"


def test_read_can_stop_early(fake: FakeBroker, sync_client: SyncJournalClient) -> None:
    fake.journal.read_scripts.append([metadata(0, begin=0, end=3), content(0, b"abc"), Hang()])
    chunks = sync_client.read(J, block=True)
    assert next(chunks) == b"abc"
    chunks.close()  # type: ignore[attr-defined]
    # The facade is still usable afterwards.
    fake.journal.list_responses.append([listing(J)])
    assert [j.spec.name for j in sync_client.list_journals("name=a/journal")] == [J]


def test_append_from_a_generator_and_errors(
    fake: FakeBroker, sync_client: SyncJournalClient
) -> None:
    def lines() -> Iterator[bytes]:
        for i in range(3):
            yield b"line %d\n" % i

    fake.journal.append_responses.append(committed(J, 0, 21))
    assert sync_client.append(J, lines()).commit.end == 21
    assert fake.journal.append_calls[0].requests[1].content == b"line 0\nline 1\nline 2\n"

    fake.journal.append_responses.append(refused(pb.WRONG_APPEND_OFFSET))
    with pytest.raises(WrongAppendOffset):
        sync_client.append(J, b"x", offset=99)


def test_streaming_appender(fake: FakeBroker, sync_client: SyncJournalClient) -> None:
    with sync_client.appender(J) as app:
        app.write(b"one ")
        app.write(b"two")
    assert app.response is not None
    assert fake.journal.append_calls[0].requests[1].content == b"one two"


def test_list_and_get(fake: FakeBroker, sync_client: SyncJournalClient) -> None:
    fake.journal.list_responses.extend(
        [
            # A snapshot may arrive over several responses.
            [listing("a/one"), pb.ListResponse(journals=listed("a/two"))],
            [listing()],
            [listing(status=pb.JOURNAL_NOT_FOUND)],
            [],
        ]
    )
    assert [j.spec.name for j in sync_client.list_journals("prefix=a/")] == ["a/one", "a/two"]
    with pytest.raises(JournalNotFound, match="a/three"):
        sync_client.get_journal("a/three")
    with pytest.raises(JournalNotFound):
        sync_client.list_journals()
    with pytest.raises(ProtocolViolation):
        sync_client.list_journals()


def test_calls_from_many_threads(fake: FakeBroker, sync_client: SyncJournalClient) -> None:
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(5):
                sync_client.append(J, b"x")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(fake.journal.append_calls) == 20


def test_close_is_idempotent(fake: FakeBroker) -> None:
    client = SyncJournalClient(fake.address)
    client.close()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.list_journals()


def test_close_ends_a_read_blocked_in_another_thread(fake: FakeBroker) -> None:
    """A thread blocked in a read of a client that another thread closes gets an error: it
    was left waiting for ever on the stopped loop (or got a bare CancelledError)."""
    fake.journal.read_scripts.append([metadata(0, begin=0, end=3), content(0, b"abc"), Hang()])
    client = SyncJournalClient(fake.address)
    first = threading.Event()
    outcome: list[object] = []

    def reader() -> None:
        try:
            for _ in client.read(J, block=True):
                first.set()
            outcome.append("end")
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert first.wait(10)
    client.close()
    thread.join(10)
    assert not thread.is_alive(), "the reading thread still waits on the closed client"
    assert len(outcome) == 1 and isinstance(outcome[0], SyncClientClosed), outcome
    with pytest.raises(SyncClientClosed):
        client.list_journals()


def test_close_from_the_clients_own_loop_is_refused(fake: FakeBroker) -> None:
    """close() inside a coroutine the client runs would wait on its own loop for ever."""
    client = SyncJournalClient(fake.address)

    async def close_inside() -> None:
        client.close()

    with pytest.raises(RuntimeError, match="own event loop thread"):
        client.run(close_inside(), timeout=10)
    client.close()
    with pytest.raises(SyncClientClosed):
        client.list_journals()


def test_close_ends_a_call_whose_coroutine_outlives_the_stop_timeout(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coroutine that does not end when cancelled (an app's, run through the client) was
    left pending on the closed loop, and the thread waiting for its result waited for ever."""
    monkeypatch.setattr(sync_client_module, "_STOP_TIMEOUT_SECONDS", 0.2)
    client = SyncJournalClient(fake.address)
    started = threading.Event()
    outcome: list[object] = []

    async def stubborn() -> None:
        started.set()
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    def caller() -> None:
        try:
            client.run(stubborn())
            outcome.append("returned")
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=caller, daemon=True)
    thread.start()
    assert started.wait(10)
    client.close()
    thread.join(10)
    assert not thread.is_alive(), "the caller still waits on the closed client"
    assert len(outcome) == 1 and isinstance(outcome[0], SyncClientClosed), outcome


def test_two_threads_closing_one_append_service(fake: FakeBroker) -> None:
    """Both got past `service in services` before either removed it: the second removal
    raised ValueError."""
    client = SyncJournalClient(fake.address)
    service = client.append_service()
    both_checked = threading.Barrier(2, timeout=2)

    class CheckedTogether(list[object]):
        def __contains__(self, item: object) -> bool:
            found = super().__contains__(item)
            with contextlib.suppress(threading.BrokenBarrierError):
                both_checked.wait()  # Both threads past the check before either removes.
            return found

    client._services = CheckedTogether(client._services)  # type: ignore[assignment]
    errors: list[BaseException] = []

    def close() -> None:
        try:
            client.close_append_service(service)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=close) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
    assert service not in list(client._services)
    client.close()


_EXITS_OPEN = """
import sys
from pygazette.client import SyncJournalClient
from pygazette.protocol.pb import protocol_pb2 as pb

address, journal, flush = sys.argv[1], sys.argv[2], float(sys.argv[3])
SyncJournalClient.exit_flush_seconds = flush
client = SyncJournalClient(address)
if journal != "-":
    spec = pb.JournalSpec(name=journal, replication=1)
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 60
    client.apply_journals([pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=0)])
service = client.append_service()
for n in range(200):
    service.append(journal if journal != "-" else "no/such/broker", b"record %d\\n" % n)
# Exits without waiting for the appends or closing the client.
"""


def _run_script(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _run_exiting_open(*args: str) -> subprocess.CompletedProcess[str]:
    return _run_script(_EXITS_OPEN, *args, timeout=120)


def test_appends_queued_when_a_script_exits_without_closing_are_sent(
    broker: BrokerProcess,
) -> None:
    """A script that queues appends and exits without closing its client or waiting (as
    one leaves a file unclosed) gets them all committed, in order, not dropped with the
    client's daemon loop thread."""
    done = _run_exiting_open(broker.address, "exit/open", "30")
    assert done.returncode == 0, done.stderr
    with SyncJournalClient(broker.address) as client:
        content = b"".join(client.read("exit/open"))
    assert content == b"".join(b"record %d\n" % n for n in range(200))


def test_appends_that_cannot_be_sent_at_exit_are_reported_lost() -> None:
    """With no broker to take them, exit waits `exit_flush_seconds`, then says what is lost."""
    started = time.monotonic()
    done = _run_exiting_open(f"http://127.0.0.1:{free_port()}", "-", "1")
    assert done.returncode == 0, done.stderr
    assert re.search(r"\d+ queued appends were not committed within 1 s and are lost", done.stderr)
    assert time.monotonic() - started < 60


_FORKS_OPEN = """
import os, sys, time
from pygazette.client import SyncJournalClient

client = SyncJournalClient(sys.argv[1])
pid = os.fork()
if pid == 0:
    sys.exit(0)  # The child exits normally: its interpreter runs the atexit hooks.
deadline = time.monotonic() + 15
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child exited", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("child hung at exit")
client.close()
"""


def test_a_child_forked_with_a_client_open_exits_at_once() -> None:
    """A child forked from a process with a client open inherits its exit hook but not its
    loop's thread: its exit leaves the client alone (the parent's), rather than waiting on a
    loop nothing runs (exit_flush_seconds, then for ever)."""
    done = subprocess.run(
        [sys.executable, "-c", _FORKS_OPEN, f"http://127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "child exited 0", done.stderr


# The parent's part of the scripts below: wait for the child `pid` (15 s at most).
_WAIT_FOR_THE_CHILD = """
deadline = time.monotonic() + 15
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("child hung", flush=True)
"""

_FORKED_CHILD_USES = (
    """
import os, sys, time
from pygazette.client import SyncClientForked, SyncJournalClient
from pygazette.client.append_service import AppendServiceClosed

client = SyncJournalClient(sys.argv[1])
service = client.append_service()
pid = os.fork()
if pid == 0:
    outcome = []
    try:
        client.list_journals()
    except SyncClientForked as exc:
        outcome.append("list refused" if str(os.getppid()) in str(exc) else "list: " + str(exc))
    try:
        service.append("a/journal", b"x")
    except AppendServiceClosed as exc:
        outcome.append("append refused" if "forked" in str(exc) else "append: " + str(exc))
    client.close()  # Returns at once: the client is the parent's.
    try:
        client.get_journal("a/journal")
    except SyncClientForked:
        outcome.append("closed")
    print(", ".join(outcome), flush=True)
    os._exit(0)
"""
    + _WAIT_FOR_THE_CHILD
    + """
# The parent's client is untouched by what its child did.
print("parent", client.get_journal(sys.argv[2]).name, flush=True)
client.close_append_service(service)
client.close()
"""
)


_FORKED_WHILE_A_CALL_STARTS = (
    """
import os, sys, time
from pygazette.client import SyncClientForked, SyncJournalClient

client = SyncJournalClient(sys.argv[1])
# Another thread of the parent is starting or ending a call at the fork: it holds the loop's
# lock, and the child's copy of that lock stays held, for no thread of the child holds it.
client._loop._lock.acquire()
pid = os.fork()
if pid == 0:
    client.close()
    try:
        client.list_journals()
    except SyncClientForked:
        print("child closed", flush=True)
    os._exit(0)
client._loop._lock.release()
"""
    + _WAIT_FOR_THE_CHILD
    + """
client.close()
print("parent closed", flush=True)
"""
)


def test_a_forked_child_closes_its_copy_while_the_parent_was_mid_call() -> None:
    """fork copies a lock held by another of the parent's threads (one starting or ending a
    call) as held for ever: the child's `close` must not wait for it."""
    done = _run_script(_FORKED_WHILE_A_CALL_STARTS, f"127.0.0.1:{free_port()}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["child closed", "parent closed"], done.stderr


def test_a_forked_child_using_its_parents_client_fails_at_once(broker: BrokerProcess) -> None:
    """A child forked with a client open (multiprocessing's fork start method, a Spark
    Python worker) has a copy of it but not its loop's thread: each call, and an append
    service's append, fails at once with an error saying so, and `close` returns, rather
    than waiting for ever on a loop nothing runs. The parent's client keeps working."""
    with SyncJournalClient(broker.address) as client:
        spec = pb.JournalSpec(name="forked/parent", replication=1)
        spec.fragment.length = 1 << 20
        spec.fragment.compression_codec = pb.SNAPPY
        spec.fragment.stores.append("file:///")
        spec.fragment.refresh_interval.seconds = 60
        client.apply_journals([pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=0)])
    done = _run_script(_FORKED_CHILD_USES, broker.address, "forked/parent")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "list refused, append refused, closed",
        "parent forked/parent",
    ], done.stderr
