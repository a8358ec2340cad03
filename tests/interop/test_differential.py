"""The differential scenario against pygazette and Gazette, compared response by response."""

from __future__ import annotations

import asyncio
import difflib
import json

from pygazette.client import JournalClient
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.interop.scenario import Identity, Recording, run_scenario
from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import GazetteBroker


async def identity_of(url: str) -> Identity:
    async with JournalClient(url) as client:
        async for resp in client.rpc_list(pb.ListRequest()):
            pid = resp.header.process_id
            return Identity((pid.zone, pid.suffix), url)
    raise AssertionError("no List response")


async def record(url: str) -> Recording:
    return await run_scenario(url, await identity_of(url))


def describe(observed: object) -> list[str]:
    return json.dumps(observed, indent=1, sort_keys=True, default=str).splitlines()


# Gazette fails RPCs with gRPC UNKNOWN (a plain Go error) where pygazette uses the gRPC code
# that says what happened (README, "Differences from Gazette"): (our code, Gazette's message
# or None when the messages are the same).
SPECIFIC_CODES = {
    ("INVALID_ARGUMENT", None),
    ("ABORTED", "append stream: unexpected EOF"),
}


def deliberate(ours: object, theirs: object) -> object:
    """`theirs` with the differences pygazette makes on purpose mapped to ours."""
    if (
        isinstance(ours, dict)
        and isinstance(theirs, dict)
        and theirs.get("grpc_code") == "UNKNOWN"
        and ours.get("grpc_code") != "UNKNOWN"
    ):
        code, details = ours.get("grpc_code"), theirs.get("details")
        if (code, None) in SPECIFIC_CODES and ours.get("details") == details:
            return {**theirs, "grpc_code": code}
        if (code, details) in SPECIFIC_CODES:
            return ours
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [deliberate(o, t) for o, t in zip(ours, theirs, strict=True)]
    return theirs


def test_scenario_matches_gazette(pygazette: BrokerProcess, gazette: GazetteBroker) -> None:
    async def both() -> tuple[Recording, Recording]:
        return await asyncio.gather(record(pygazette.url), record(gazette.url))

    ours, theirs = asyncio.run(both())
    assert theirs.problems == []
    assert ours.problems == []
    differences = []
    assert [s.name for s in ours.steps] == [s.name for s in theirs.steps]
    for mine, gaz in zip(ours.steps, theirs.steps, strict=True):
        expected = deliberate(mine.observed, gaz.observed)
        if mine.observed != expected:
            diff = difflib.unified_diff(
                describe(expected), describe(mine.observed), "gazette", "pygazette", lineterm=""
            )
            differences.append(f"=== {mine.name}\n" + "\n".join(diff))
    assert not differences, "\n".join(differences)
