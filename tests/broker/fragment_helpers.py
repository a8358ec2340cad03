"""Helpers of the fragment lifecycle tests: waiting for persistence, checking fragment files."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from pygazette.protocol.fragment_name import parse_fragment_path, sha1sum_to_hex
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc

SNAPPYCAT_SOURCE = Path(__file__).resolve().parents[1] / "support" / "snappycat"


def build_snappycat(out_dir: Path) -> Path | None:
    """Build the framed-snappy reader of golang/snappy — the library Gazette reads SNAPPY
    fragments with — from the local Go module cache; None without Go or the module."""
    go = shutil.which("go")
    if go is None:
        return None
    exe = out_dir / "snappycat"
    env = dict(os.environ, GOFLAGS="-mod=mod", GOPROXY="off", GOSUMDB="off")
    proc = subprocess.run(
        [go, "build", "-o", str(exe), "."],
        cwd=SNAPPYCAT_SOURCE,
        env=env,
        capture_output=True,
        timeout=300,
    )
    return exe if proc.returncode == 0 and exe.exists() else None


def decompress_with_standard_tool(codec: int, data: bytes, snappycat: Path | None = None) -> bytes:
    """Decompress a fragment file with the codec's standard reader: gzip, zstd, snappycat."""
    if codec == pb.NONE:
        return data
    if codec in (pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION):
        cmd = ["gzip", "-d", "-c"]
    elif codec == pb.ZSTANDARD:
        cmd = ["zstd", "-d", "-c", "-q"]
    elif codec == pb.SNAPPY:
        assert snappycat is not None, "no framed-snappy reader was built"
        cmd = [str(snappycat)]
    else:
        raise ValueError(codec)
    assert shutil.which(cmd[0]), f"{cmd[0]} is not installed"
    return subprocess.run(cmd, input=data, capture_output=True, check=True).stdout


def check_fragment_file(
    journal: str, relative_path: str, raw: bytes, snappycat: Path | None = None
) -> tuple[pb.Fragment, bytes]:
    """Parse a fragment's path, decompress it with the standard tool and check its SHA-1."""
    frag = parse_fragment_path(journal, relative_path)
    content = decompress_with_standard_tool(frag.compression_codec, raw, snappycat)
    assert len(content) == frag.end - frag.begin, relative_path
    assert hashlib.sha1(content).hexdigest() == sha1sum_to_hex(frag.sum), relative_path
    return frag, content


def assemble(fragments: list[tuple[pb.Fragment, bytes]], begin: int = 0) -> bytes:
    """Journal content from non-overlapping fragments that must cover [begin, end) contiguously."""
    out = bytearray()
    offset = begin
    for frag, content in sorted(fragments, key=lambda fc: fc[0].begin):
        assert frag.begin == offset, f"gap or overlap at {offset}: fragment {frag.begin}"
        out += content
        offset = frag.end
    return bytes(out)


async def list_fragments(stub: pb_grpc.JournalStub, journal: str) -> list[pb.Fragment]:
    resp = await stub.ListFragments(pb.FragmentsRequest(journal=journal), timeout=30)
    assert resp.status == pb.OK, resp
    return [f.spec for f in resp.fragments]


async def wait_persisted(
    stub: pb_grpc.JournalStub, journal: str, end: int, within: float = 60
) -> list[pb.Fragment]:
    """Wait until persisted fragments cover [0, end) of `journal`; returns them."""
    deadline = time.monotonic() + within
    while True:
        frags = [f for f in await list_fragments(stub, journal) if f.mod_time]
        reach = 0
        for f in sorted(frags, key=lambda f: f.begin):
            if f.begin <= reach:
                reach = max(reach, f.end)
        if reach >= end:
            return frags
        if time.monotonic() > deadline:
            raise TimeoutError(f"{journal}: persisted only up to {reach} of {end}: {frags}")
        await asyncio.sleep(0.05)
