"""The differential scenario against pygazette and Gazette, compared response by response."""

from __future__ import annotations

import asyncio
import difflib
import json
from pathlib import Path

from pygazette.client import JournalClient
from pygazette.protocol.fragment_name import parse_fragment_path
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores import codecs
from tests.interop.scenario import PREFIX, Identity, Recording, run_scenario
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


def fragment_files(root: Path) -> dict[str, bytes]:
    """Fragment files of the scenario's journals under a store root, by relative path."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted((root / PREFIX).rglob("*"))
        if path.is_file() and not path.name.startswith(".")
    }


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

    # The same appends left the same fragment files in both stores.
    ours_files = fragment_files(pygazette.data_dir / "fragments")
    theirs_files = fragment_files(gazette.file_root)
    assert sorted(ours_files) == sorted(theirs_files)
    assert len(ours_files) >= 8
    for path, data in theirs_files.items():
        journal, name = path.rsplit("/", 1)
        frag = parse_fragment_path(journal, name)
        if frag.compression_codec in (pb.NONE, pb.SNAPPY):
            # Raw bytes, and snappy framing of the same content, match byte for byte.
            assert ours_files[path] == data, path
        else:
            # Equal content; gzip bytes are each compressor's own (Go's klauspost/compress
            # deflate, zlib here): README, "Differences from Gazette".
            decompressed = codecs.decompress(frag.compression_codec, ours_files[path])
            assert decompressed == codecs.decompress(frag.compression_codec, data), path
