"""The replication pipeline confirms a commit only once every peer acknowledged it *and* the
primary committed it to its own spool; a confirmation is never left registered but unsent.

Peers here are in-process doubles of a Replicate stream (each acknowledges what asks for an
acknowledgement, in order), so the test controls when the primary's own commit completes.
Confirming before it would leave content on every replica that the primary then failed to
commit (its disk full), while its client hears of a failure and may append it again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pygazette.broker.pipeline import Pipeline, PipelineBroken
from pygazette.protocol.pb import protocol_pb2 as pb

JOURNAL = "a/journal"


class _PeerCall:
    """A Replicate stream whose peer acknowledges every request asking for it."""

    def __init__(self) -> None:
        self.requests: list[pb.ReplicateRequest] = []
        self._answers: asyncio.Queue[Any] = asyncio.Queue()

    async def write(self, req: pb.ReplicateRequest) -> None:
        self.requests.append(req)
        if req.acknowledge:
            self._answers.put_nowait(pb.ReplicateResponse(status=pb.OK))

    async def read(self) -> Any:
        return await self._answers.get()

    async def done_writing(self) -> None:
        import grpc.aio

        self._answers.put_nowait(grpc.aio.EOF)  # type: ignore[attr-defined]

    def cancel(self) -> bool:
        return True

    def proposals(self) -> int:
        return sum(1 for r in self.requests if r.HasField("proposal"))


class _Stub:
    def __init__(self, calls: list[_PeerCall]) -> None:
        self.calls = calls

    def Replicate(self, **_kwargs: Any) -> _PeerCall:
        call = _PeerCall()
        self.calls.append(call)
        return call


class _Peers:
    def __init__(self) -> None:
        self.calls: list[_PeerCall] = []

    def stub(self, endpoint: str) -> _Stub:
        return _Stub(self.calls)


def _header(members: int = 3) -> pb.Header:
    header = pb.Header()
    for i in range(members):
        header.route.members.add(zone="z", suffix=f"broker-{i}")
        header.route.endpoints.append(f"http://127.0.0.1:{1000 + i}")
    header.route.primary = 0
    return header


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _pipeline(
    members: int = 3, may_confirm: bool = True
) -> tuple[Pipeline, _Peers, list[int]]:
    peers = _Peers()
    confirmed: list[int] = []
    pln = Pipeline(
        _header(members),
        peers,  # type: ignore[arg-type]
        on_confirmed=confirmed.append,
        may_confirm=lambda: may_confirm,
    )
    await pln.open()
    return pln, peers, confirmed


def _commit(end: int) -> pb.ReplicateRequest:
    return pb.ReplicateRequest(
        proposal=pb.Fragment(journal=JOURNAL, begin=0, end=end), registers=pb.LabelSet()
    )


async def test_a_commit_is_confirmed_only_after_the_primary_committed_it() -> None:
    pln, peers, confirmed = await _pipeline()
    rnd = await pln.propose(_commit(10), commit=True)
    await pln.wait(rnd)  # Every peer acknowledged the commit...
    await _settle()
    # ...but the primary's own commit is still under way: nothing is confirmed yet.
    assert [c.proposals() for c in peers.calls] == [1, 1]
    assert confirmed == [] and pln.confirm_sent < 10

    pln.committed_locally(rnd)
    await _settle()
    assert [c.proposals() for c in peers.calls] == [2, 2]  # The confirmation went out.
    assert confirmed == [10]
    await pln.confirm(10)
    await pln.close()


async def test_a_commit_the_primary_committed_first_is_confirmed_once_acknowledged() -> None:
    pln, _peers, confirmed = await _pipeline()
    rnd = await pln.propose(_commit(10), commit=True)
    pln.committed_locally(rnd)  # Before any peer answered.
    await pln.wait(rnd)
    await pln.confirm(10)
    assert confirmed == [10]
    await pln.close()


async def test_no_confirmation_is_registered_on_a_closing_pipeline() -> None:
    pln, _peers, _confirmed = await _pipeline()
    rnd = await pln.propose(_commit(10), commit=True)
    pln.committed_locally(rnd)
    await pln.wait(rnd)
    await _settle()
    pln._closing = True  # As `close()` sets it once its wait for open rounds ran out.
    with pytest.raises(PipelineBroken):
        await pln.confirm_fragment(pb.Fragment(journal=JOURNAL, begin=0, end=20), pb.LabelSet())
    # Nothing dangling for a later waiter to block on.
    assert not pln._confirmations or all(r.future.done() for r in pln._confirmations)
    pln.fail("test over")


async def test_on_a_route_of_two_a_commit_confirms_itself() -> None:
    pln, peers, confirmed = await _pipeline(members=2)
    assert pln.pair
    rnd = pln.propose_confirmed_commit(_commit(10))
    assert pln.confirm_sent == 10  # Sent: should the pipeline fail now, it is in doubt.
    await pln.wait(rnd)
    await pln.confirm(10)
    await _settle()
    assert confirmed == [10]
    # One request, carrying the Header, and no separate confirmation.
    [call] = peers.calls
    assert [r.HasField("header") and r.acknowledge for r in call.requests] == [True]
    await pln.close()


async def test_a_self_confirming_commit_needs_a_pair_and_a_live_lease() -> None:
    pln, _peers, _confirmed = await _pipeline(members=3)
    assert not pln.pair
    with pytest.raises(ValueError):
        pln.propose_confirmed_commit(_commit(10))
    pln.fail("test over")

    pln, _peers, confirmed = await _pipeline(members=2, may_confirm=False)
    with pytest.raises(PipelineBroken):
        pln.propose_confirmed_commit(_commit(10))
    assert not pln.ok and confirmed == [] and pln.confirm_sent < 10


class _EndingCall(_PeerCall):
    """A Replicate stream whose peer ends it with `error` instead of acknowledging."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    async def write(self, req: pb.ReplicateRequest) -> None:
        self.requests.append(req)
        if req.acknowledge:
            self._answers.put_nowait(self.error)

    async def read(self) -> Any:
        answer = await self._answers.get()
        if isinstance(answer, BaseException):
            raise answer
        return answer


@pytest.mark.parametrize(
    ("code", "details", "level"),
    [
        # A peer lets go of the journal (a hand-off): expected, so not a warning.
        ("ABORTED", "the journal's route changed; stream is stale", "INFO"),
        ("UNAVAILABLE", "replica is stopping", "INFO"),
        # Anything else breaking a pipeline is worth a warning.
        ("UNAVAILABLE", "Connection reset by peer", "WARNING"),
        ("ABORTED", "something else", "WARNING"),
    ],
)
async def test_a_peer_handing_the_journal_off_breaks_the_pipeline_quietly(
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    code: str,
    details: str,
    level: str,
) -> None:
    import grpc

    error = grpc.aio.AioRpcError(
        getattr(grpc.StatusCode, code), grpc.aio.Metadata(), grpc.aio.Metadata(), details
    )
    monkeypatch.setattr(
        _Stub, "Replicate", lambda self, **_kw: self.calls.append(c := _EndingCall(error)) or c
    )
    caplog.set_level("INFO", logger="pygazette.broker.pipeline")
    pln, _peers, _ = await _pipeline(members=2)
    with pytest.raises(PipelineBroken, match=details):
        rnd = await pln.propose(_commit(10), commit=True)
        await pln.wait(rnd)
    broken = [r for r in caplog.records if r.getMessage() == "replication pipeline broken"]
    assert [r.levelname for r in broken] == [level]
