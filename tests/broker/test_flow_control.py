"""Flow control: a stalled client cannot hold a journal; maximum rates delay chunks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from pygazette.broker.flow_control import (
    FlowControlUnderflow,
    MinRatePolicer,
    RateLimiter,
    next_policed,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all
from tests.support.broker_process import BrokerProcess


def test_rate_limiter_burst_then_delay() -> None:
    lim = RateLimiter(1000)
    assert lim.delay_for(1000) == 0.0  # One second of burst.
    assert lim.delay_for(500) == pytest.approx(0.5, abs=0.05)
    assert RateLimiter(0).delay_for(10**9) == 0.0  # Unlimited.


def test_min_rate_policer() -> None:
    p = MinRatePolicer(1000)
    timeout = p.timeout()
    assert timeout is not None and 0.9 < timeout <= 1.0
    p.received(5000)  # Credit is capped at one second's worth.
    timeout = p.timeout()
    assert timeout is not None and timeout <= 2.0
    p._stamp -= 3.0  # Three seconds pass without data.
    with pytest.raises(FlowControlUnderflow):
        p.received(1)
    assert MinRatePolicer(0).timeout() is None


async def _chunk_after(delay: float) -> AsyncIterator[bytes]:
    await asyncio.sleep(delay)
    yield b"chunk"


async def test_next_policed_aborts_a_stalled_client() -> None:
    started = time.monotonic()
    with pytest.raises(FlowControlUnderflow):
        await next_policed(_chunk_after(60), MinRatePolicer(1 << 16))
    assert time.monotonic() - started < 5
    # A prompt one is served, and the end of a stream is None.
    it = _chunk_after(0.01)
    assert await next_policed(it, MinRatePolicer(1 << 16)) == b"chunk"
    assert await next_policed(it, MinRatePolicer(1 << 16)) is None


async def test_next_policed_excuses_the_brokers_own_stall() -> None:
    """The client's chunk is due at 0.1 s; the loop is blocked from 0.05 s to 1.65 s (past
    the 1 s allowance). When it comes back, the client isn't blamed for the broker's stall
    (asyncio.timeout alone aborted it: its timer ran before the chunk was taken)."""
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, time.sleep, 1.6)
    assert await next_policed(_chunk_after(0.1), MinRatePolicer(1 << 16)) == b"chunk"


@pytest.mark.slow
async def test_stalled_client_is_aborted_and_frees_the_journal(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", extra_args=["--min-append-rate", "100000"])
    broker.start()
    try:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            await apply_specs(stub, journal_spec("flow/stall"))
            release = asyncio.Event()

            async def stalling() -> AsyncIterator[pb.AppendRequest]:
                yield pb.AppendRequest(journal="flow/stall")
                yield pb.AppendRequest(content=b"partial")
                await release.wait()  # Never sends more, never commits.

            stalled = asyncio.ensure_future(stub.Append(stalling()))
            await asyncio.sleep(0.1)
            # A second writer queues behind the stalled one and gets through once it's aborted.
            second = await asyncio.wait_for(append(stub, "flow/stall", b"next"), 10)
            assert second.status == pb.OK and second.commit.begin == 0
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stalled
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "minimum append data rate" in (err.value.details() or "")
            release.set()
            content, _ = await read_all(stub, "flow/stall")
            assert content == b"next"
    finally:
        broker.kill()


async def test_max_append_rate_delays_chunks(broker: BrokerProcess) -> None:
    async with grpc.aio.insecure_channel(broker.address) as channel:
        stub = pb_grpc.JournalStub(channel)
        await apply_specs(stub, journal_spec("flow/limited", max_append_rate=200_000))
        chunks = [b"x" * 20_000] * 20  # 400 kB at 200 kB/s with a 200 kB burst.
        start = time.monotonic()
        resp = await append(stub, "flow/limited", *chunks)
        elapsed = time.monotonic() - start
        assert resp.status == pb.OK
        assert resp.total_chunks == 21  # With the commit chunk, as Gazette counts.
        assert resp.delayed_chunks > 0
        assert elapsed >= 0.8


@pytest.mark.slow
async def test_max_append_rate_flag_caps_each_journal_as_gazettes_does(tmp_path: Path) -> None:
    """--max-append-rate upper-bounds each journal's own max_append_rate, as Gazette's
    --broker.max-append-rate does (appendFlowControl.reset): it is no bucket the broker's
    journals share, and a journal without a max_append_rate stays unlimited."""
    broker = BrokerProcess(tmp_path / "data", extra_args=["--max-append-rate", "200000"])
    broker.start()
    try:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            specs = [journal_spec("flow/unlimited")]
            specs += [journal_spec(f"flow/capped-{i}", max_append_rate=10**9) for i in range(2)]
            await apply_specs(stub, *specs)
            # Each capped journal takes its own first second's burst, at the same time.
            burst = [b"x" * 20_000] * 10
            both = await asyncio.gather(
                *(append(stub, f"flow/capped-{i}", *burst) for i in range(2))
            )
            assert [r.delayed_chunks for r in both] == [0, 0]
            # Past its burst, a capped journal is held to the flag's rate.
            start = time.monotonic()
            resp = await append(stub, "flow/capped-0", *burst)
            assert resp.delayed_chunks > 0 and time.monotonic() - start >= 0.8
            # A journal without a max_append_rate is not limited by the flag.
            resp = await append(stub, "flow/unlimited", *(burst * 3))
            assert resp.status == pb.OK and resp.delayed_chunks == 0
    finally:
        broker.kill()


def test_rate_limiter_banks_ten_seconds_from_its_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """As Gazette's appendFlowControl: a journal's first append has one second of burst,
    however long ago the journal was created; unused rate then banks up to ten seconds."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    lim = RateLimiter(1000)
    now[0] += 60.0  # Created long before its first append.
    assert lim.delay_for(1000) == 0.0
    assert lim.delay_for(500) == pytest.approx(0.5)
    now[0] += 60.0  # Idle: ten seconds' worth banked, no more.
    assert lim.delay_for(10_000) == 0.0
    assert lim.delay_for(1000) == pytest.approx(1.0)
