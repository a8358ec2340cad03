"""Fragment lifecycle on file:// stores, against a real broker process: codecs readable by the
standard tools, Hive-style path postfixes, index refresh over fragments written by others,
and retention (`journals prune`)."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.fragment_name import fragment_content_path, sha1sum_from_digest
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.stores import codecs
from tests.broker.fragment_helpers import (
    assemble,
    check_fragment_file,
    list_fragments,
    wait_persisted,
)
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all
from tests.cli.test_journals_cli import cli, ok, one_line_error
from tests.support.broker_process import BrokerProcess

HIVE = (
    'date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}'
    '/hour={{ .Spool.FirstAppendTime.Format "15" }}'
)


def _records(n: int, tag: str) -> list[bytes]:
    return [f"{tag} record {i:06d} {'x' * (i % 97)}\n".encode() for i in range(n)]


def _files(root: Path, journal: str) -> dict[str, bytes]:
    top = root / journal
    return {
        p.relative_to(top).as_posix(): p.read_bytes()
        for p in sorted(top.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.fixture
def broker_proc(tmp_path: Path):  # type: ignore[no-untyped-def]
    proc = BrokerProcess(tmp_path / "data", extra_args=["--retention-interval", "0s"])
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


async def test_codecs_write_files_the_standard_tools_read(
    broker_proc: BrokerProcess, snappycat: Path
) -> None:
    journals = {
        "lifecycle/none": pb.NONE,
        "lifecycle/gzip": pb.GZIP,
        "lifecycle/zstd": pb.ZSTANDARD,
        "lifecycle/snappy": pb.SNAPPY,
    }
    sent: dict[str, bytes] = {}
    async with grpc.aio.insecure_channel(broker_proc.address) as channel:
        stub = pb_grpc.JournalStub(channel)
        specs = [journal_spec(name, codec=c, length=16 * 1024) for name, c in journals.items()]
        assert (await apply_specs(stub, *specs)).status == pb.OK
        for name in journals:
            records = _records(1500, name)
            for i in range(0, len(records), 100):
                resp = await append(stub, name, b"".join(records[i : i + 100]))
                assert resp.status == pb.OK
            sent[name] = b"".join(records)
        for name in journals:
            # Every fragment but the open one rolled at 16 KiB and persists.
            frags = await list_fragments(stub, name)
            assert len(frags) >= len(sent[name]) // (24 * 1024)
            assert all(f.end - f.begin < 16 * 1024 + 8 * 1024 for f in frags)  # Plus one append.
            await wait_persisted(stub, name, frags[-1].begin)
    broker_proc.stop()  # A clean shutdown persists the open spools too.

    root = broker_proc.data_dir / "fragments"
    for name, codec in journals.items():
        files = _files(root, name)
        ext = {pb.NONE: ".raw", pb.GZIP: ".gz", pb.ZSTANDARD: ".zst", pb.SNAPPY: ".sz"}[codec]
        assert files and all(path.endswith(ext) for path in files), files.keys()
        checked = [check_fragment_file(name, path, raw, snappycat) for path, raw in files.items()]
        assert assemble(checked) == sent[name]


async def test_hive_path_postfix_and_reads_after_restart(broker_proc: BrokerProcess) -> None:
    name = "lifecycle/hive/part-000"
    spec = journal_spec(name, codec=pb.SNAPPY, length=4096)
    spec.fragment.path_postfix_template = HIVE
    before = datetime.now(UTC)
    async with grpc.aio.insecure_channel(broker_proc.address) as channel:
        stub = pb_grpc.JournalStub(channel)
        assert (await apply_specs(stub, spec)).status == pb.OK
        data = b"".join(_records(400, "hive"))
        for i in range(0, len(data), 3000):
            assert (await append(stub, name, data[i : i + 3000])).status == pb.OK
    after = datetime.now(UTC)
    broker_proc.stop()

    root = broker_proc.data_dir / "fragments"
    partitions = {
        f"date={t:%Y-%m-%d}/hour={t:%H}" for t in (before, after)
    }  # The hour may turn during the test.
    files = _files(root, name)
    assert files
    for path in files:
        assert path.rsplit("/", 1)[0] in partitions, path

    broker_proc.start()  # Spools are gone: everything is read back from the store listing.
    async with grpc.aio.insecure_channel(broker_proc.address) as channel:
        stub = pb_grpc.JournalStub(channel)
        frags = await list_fragments(stub, name)
        assert frags and all(f.path_postfix in partitions and f.mod_time for f in frags)
        content, meta = await read_all(stub, name)
        assert content == data
        assert all(m.fragment.path_postfix in partitions for m in meta if m.status == pb.OK)


def test_unsupported_template_is_refused_at_apply(
    broker_proc: BrokerProcess, tmp_path: Path
) -> None:
    specs = tmp_path / "specs.yaml"
    specs.write_text(
        "name: lifecycle/bad-template\n"
        "replication: 1\n"
        "fragment:\n"
        "  length: 1048576\n"
        "  compression_codec: SNAPPY\n"
        "  stores: [file:///]\n"
        "  refresh_interval: 1m\n"
        "  path_postfix_template: '{{ if .Name }}x{{ end }}'\n"
    )
    line = one_line_error(cli(broker_proc.url, "journals", "apply", "--specs", str(specs)))
    assert "INVALID_ARGUMENT" in line and "unsupported action 'if'" in line
    assert "PathPostfixTemplate" in line


def _write_fragment(root: Path, store_dir: str, journal: str, content: bytes, begin: int) -> Path:
    """A fragment file as another broker would have written it (NONE codec)."""
    frag = pb.Fragment(
        journal=journal,
        begin=begin,
        end=begin + len(content),
        sum=sha1sum_from_digest(hashlib.sha1(content).digest()),
        compression_codec=pb.NONE,
    )
    path = root / store_dir / fragment_content_path(frag)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


async def test_listing_unions_stores_and_local_spools_as_a_cover_set(
    broker_proc: BrokerProcess,
) -> None:
    name = "lifecycle/union"
    root = broker_proc.data_dir / "fragments"
    history = b"".join(_records(300, "older history"))
    # History persisted by another broker in a second store, plus a smaller duplicate
    # (a fork's re-persist) that the cover set must hide.
    _write_fragment(root, "other", name, history, 0)
    _write_fragment(root, "other", name, history[:1000], 0)
    spec = journal_spec(name, stores=["file:///main/", "file:///other/"], length=1 << 20)
    spec.fragment.refresh_interval.seconds = 1
    async with grpc.aio.insecure_channel(broker_proc.address) as channel:
        stub = pb_grpc.JournalStub(channel)
        assert (await apply_specs(stub, spec)).status == pb.OK
        frags = await list_fragments(stub, name)
        assert [(f.begin, f.end, f.backing_store) for f in frags] == [
            (0, len(history), "file:///other/")
        ]
        # Appends continue at the listed write head, into a local spool.
        resp = await append(stub, name, b"new\n")
        assert (resp.status, resp.commit.begin) == (pb.OK, len(history))
        content, _ = await read_all(stub, name)
        assert content == history + b"new\n"
        # A fragment appearing in a store later is picked up at the next refresh.
        more = b"appended elsewhere\n"
        _write_fragment(root, "other", name, more, len(history) + 4)
        deadline = time.monotonic() + 10
        while len(await list_fragments(stub, name)) < 3:
            assert time.monotonic() < deadline, await list_fragments(stub, name)
            time.sleep(0.05)
        content, _ = await read_all(stub, name)
        assert content == history + b"new\n" + more


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


async def test_prune_removes_exactly_the_expired_fragments(broker_proc: BrokerProcess) -> None:
    name = "lifecycle/retained"
    forever = "lifecycle/forever"
    root = broker_proc.data_dir / "fragments"
    spec = journal_spec(name, length=1024, stores=["file:///", "file:///copy/"])
    spec.fragment.retention.seconds = 3600
    spec.fragment.refresh_interval.seconds = 1
    keep_all = journal_spec(forever, length=1024)  # No retention: kept forever.
    size = 1025
    async with grpc.aio.insecure_channel(broker_proc.address) as channel:
        stub = pb_grpc.JournalStub(channel)
        assert (await apply_specs(stub, spec, keep_all)).status == pb.OK
        for journal in (name, forever):
            # Each append overfills a fragment, which rolls and persists (as in Gazette, a
            # fragment rolls once it holds more than fragment.length).
            for i in range(4):
                assert (await append(stub, journal, bytes([65 + i]) * size)).status == pb.OK
            await wait_persisted(stub, journal, 4 * size)
    files = sorted((root / name).iterdir())
    assert len(files) == 4
    f1, f2, f3, f4 = files
    _age(f1, 7200)
    _age(f2, 7200)
    dup = root / "copy" / name / f3.name  # A duplicate of f3 in the second store, expired.
    dup.parent.mkdir(parents=True)
    shutil.copy(f3, dup)
    _age(dup, 7200)
    for f in sorted((root / forever).iterdir()):
        _age(f, 10 * 86400)

    out = ok(cli(broker_proc.url, "journals", "prune", "-l", "prefix=lifecycle/", "--dry-run"))
    text = out.decode()
    assert "would remove 3 fragment(s) (3.0 KiB of journal content) of 2 journal(s)" in text
    for f in (f1, f2):
        assert f"file:///{name}/{f.name}" in text
    assert f"file:///copy/{name}/{f3.name}" in text
    assert f1.exists() and f2.exists() and dup.exists()

    out = ok(cli(broker_proc.url, "journals", "prune", "-l", f"name={name}"))
    assert "removed 3 fragment(s)" in out.decode()
    assert not f1.exists() and not f2.exists() and not dup.exists()
    assert f3.exists() and f4.exists()
    assert len(list((root / forever).iterdir())) == 4  # Retention 0 keeps everything.

    # Everything expired: the fragment holding the write head stays.
    _age(f3, 7200)
    _age(f4, 7200)
    proc = cli(broker_proc.url, "journals", "prune", "-l", f"name={name}")
    assert "removed 1 fragment(s)" in ok(proc).decode()
    assert "write head" in proc.stderr.decode() and f4.name in proc.stderr.decode()
    assert not f3.exists() and f4.exists()

    async with grpc.aio.insecure_channel(broker_proc.address) as channel:
        stub = pb_grpc.JournalStub(channel)
        # A read from offset 0 now starts at the first remaining fragment (Gazette's jump).
        content, meta = await read_all(stub, name)
        assert meta[0].offset == 3 * size and content == b"D" * size
        # The write head did not move: the next append lands after it.
        resp = await append(stub, name, b"E")
        assert resp.commit.begin == 4 * size


def test_prune_of_unknown_journals(broker_proc: BrokerProcess) -> None:
    line = one_line_error(cli(broker_proc.url, "journals", "prune", "-l", "name=no/such"))
    assert "JOURNAL_NOT_FOUND" in line
    line = one_line_error(cli(broker_proc.url, "journals", "prune", "-l", "app=none"))
    assert "no journal matches" in line


def test_store_health_cli(broker_proc: BrokerProcess) -> None:
    assert b"is healthy" in ok(cli(broker_proc.url, "journals", "store-health", "file:///"))
    line = one_line_error(
        cli(broker_proc.url, "journals", "store-health", "s3://bucket/?endpoint=http://127.0.0.1:1")
    )
    assert "unhealthy" in line and "health check PUT failed" in line
    line = one_line_error(cli(broker_proc.url, "journals", "store-health", "s3://bucket/no-slash"))
    assert "INVALID_ARGUMENT" in line


def test_compressed_fragments_round_trip_in_memory() -> None:
    # The same bytes a broker writes, through the streaming compressor, for every codec.
    data = b"".join(_records(2000, "mem"))
    for codec in (pb.GZIP, pb.ZSTANDARD, pb.SNAPPY, pb.GZIP_OFFLOAD_DECOMPRESSION):
        c = codecs.new_compressor(codec)
        z = c.compress(data[:5000]) + c.compress(data[5000:]) + c.finish()
        assert codecs.decompress(codec, z) == data


@pytest.mark.parametrize("codec", [pb.NONE, pb.SNAPPY])
async def test_read_of_a_fragment_file_removed_since_the_listing(
    broker_proc: BrokerProcess, codec: int
) -> None:
    # A fragment file removed from a file:// store (retention by another broker, or by hand)
    # before the next listing is a fragment gone from the store: the broker lists again and
    # reads on from what is left, at once. It took the file's absence for a persisted spool
    # and queried the same fragment again, sending its metadata over and over until the
    # next scheduled listing (here a minute away).
    name = f"lifecycle/removed/{codec}"
    first, second = b"a" * 2000, b"b" * 2000
    async with grpc.aio.insecure_channel(broker_proc.address) as channel:
        stub = pb_grpc.JournalStub(channel)
        assert (await apply_specs(stub, journal_spec(name, codec=codec, length=1024))).status == (
            pb.OK
        )
        for data in (first, second, b"c"):  # Each append closes the spool before it.
            assert (await append(stub, name, data)).status == pb.OK
        frags = await wait_persisted(stub, name, len(first) + len(second))
        (gone,) = [f for f in frags if f.begin == 0]
        (broker_proc.data_dir / "fragments" / fragment_content_path(gone)).unlink()

        content, meta = await read_all(stub, name)
        assert content == second + b"c"
        # The gone fragment's metadata (sent before its file was found missing), then a
        # jump past it to the journal's first fragment left.
        assert [(m.status, m.offset) for m in meta] == [
            (pb.OK, 0),
            (pb.OK, len(first)),
            (pb.OK, len(first) + len(second)),
            (pb.OFFSET_NOT_YET_AVAILABLE, len(first) + len(second) + 1),
        ]
