"""Benchmark: persisting fragments per codec, and reading them back proxied and directly.

Figures, all measured in this run on the same journal data (JSON lines):

- codecs: each codec's raw in-memory compress and decompress speed (one whole buffer,
  `pygazette.stores.codecs`) — the baseline the persist figures are ratios to;
- persist: MB/s of journal bytes compressed and stored by the broker's persister (spools of
  `--fragment-mb` each, the persister's worker threads and per-store workers), to a file://
  store and to a local S3 server (moto_server on loopback), per codec. The persister
  compresses fragments on several threads at once while the raw baseline compresses one
  buffer on one, so `vs_raw_compress` (wall time) can exceed 1 on two cores; beside it,
  `vs_raw_compress_cpu` compares the CPU time of this process (all its threads; the S3
  server's own is not counted) per byte, like for like;
- read: MB/s of a whole journal read back through a broker (proxied: the broker fetches,
  decompresses and streams the fragments) beside a direct read (`do_not_proxy`: the client
  fetches each fragment from its signed URL and decompresses it), per store. A file store's
  fragments are opened under the broker's file root (`file_root`, as a client sharing the
  broker's file system is configured). A direct read that fell back to the broker for any
  fragment (a URL this process could not open) fails the run: without `file_root`, every
  "direct" read of the file store was such a fallback, i.e. a proxied read.

    python bench/fragments.py [--mb 32] [--fragment-mb 8] [--quick]

With `--reads-only`, only the read figures, of fragments of each of `--read-codecs` (put
into the stores as a broker persists them, then listed by the broker), from an S3 server
(`--s3 moto`, or `--s3 versitygw`: a real server streaming objects from its disk,
interop/bin/versitygw) and from a file store: e.g. one large fragment,

    python bench/fragments.py --reads-only --mb 256 --fragment-mb 256 --s3 versitygw

Prints one JSON document. Needs the dev extras (moto[server] for the S3 server).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pygazette.broker.fragment.fragment_index import FragmentIndex  # noqa: E402
from pygazette.broker.fragment.persister import Persister  # noqa: E402
from pygazette.broker.fragment.spool import Spool  # noqa: E402
from pygazette.client.journal_client import JournalClient  # noqa: E402
from pygazette.client.retry_reader import RetryReader, chunks_of  # noqa: E402
from pygazette.protocol.fragment_name import (  # noqa: E402
    fragment_content_path,
    sha1sum_from_digest,
)
from pygazette.protocol.pb import protocol_pb2 as pb  # noqa: E402
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc  # noqa: E402
from pygazette.stores import codecs  # noqa: E402
from pygazette.stores.store import FragmentStore, StoreRegistry  # noqa: E402
from tests.support.broker_process import BrokerProcess  # noqa: E402
from tests.support.s3_real_server import RealS3Server  # noqa: E402
from tests.support.s3_server import S3Server, export_credentials  # noqa: E402

MiB = 1 << 20
CODECS = {
    "NONE": pb.NONE,
    "GZIP": pb.GZIP,
    "ZSTANDARD": pb.ZSTANDARD,
    "SNAPPY": pb.SNAPPY,
}


def make_data(mb: int, seed: int = 7) -> bytes:
    """JSON lines resembling event data: repeated keys, varied values."""
    rng = random.Random(seed)
    words = [f"w{rng.getrandbits(20):x}" for _ in range(2000)]
    lines = []
    size = 0
    i = 0
    while size < mb * MiB:
        line = (
            f'{{"seq":{i},"user":"{rng.choice(words)}","page":"/{rng.choice(words)}/'
            f'{rng.choice(words)}","ms":{rng.randint(0, 99999)},'
            f'"ok":{str(rng.random() < 0.9).lower()},"tag":"{rng.getrandbits(64):016x}"}}\n'
        )
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines).encode()[: mb * MiB]


def mb_s(n: int, seconds: float) -> float:
    return round(n / MiB / seconds, 1) if seconds > 0 else float("inf")


def best_of(runs: int, fn) -> float:  # type: ignore[no-untyped-def]
    return best_of_with_cpu(runs, fn)[0]


def best_of_with_cpu(runs: int, fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The least wall time and the least CPU time of this process over `runs` calls."""
    times, cpus = [], []
    for _ in range(runs):
        c, t = time.process_time(), time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return min(times), min(cpus)


def codec_baselines(data: bytes, runs: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, codec in CODECS.items():
        if codec == pb.NONE:
            continue
        z = codecs.compress(codec, data)
        out[name] = {
            "compress_mb_s": mb_s(
                len(data), best_of(runs, lambda c=codec: codecs.compress(c, data))
            ),
            "decompress_mb_s": mb_s(
                len(data), best_of(runs, lambda c=codec, z=z: codecs.decompress(c, z))
            ),
            "compression_ratio": round(len(data) / len(z), 2),
        }
    return out


class _Target:
    """What the persister needs of a journal: a spec and an index."""

    def __init__(self, spec: pb.JournalSpec) -> None:
        self.spec = spec
        self.index = FragmentIndex(spec.name)


async def persist_run(
    store_url: str, file_root: Path, work: Path, codec: int, data: bytes, fragment: int
) -> tuple[float, float]:
    """Seconds the persister takes to compress and store `data` as fragments, and the CPU
    seconds this process (the persister's threads) spent meanwhile."""
    name = f"bench/persist/{pb.CompressionCodec.Name(codec).lower()}"
    spec = pb.JournalSpec(name=name, replication=1)
    spec.fragment.stores.append(store_url)
    spec.fragment.compression_codec = codec
    target = _Target(spec)
    spools = []
    for begin in range(0, len(data), fragment):
        spool = Spool.create(work / "spools", name, begin, codec, pb.LabelSet(), sync=False)
        pending = spool.start_append()
        pending.write(data[begin : begin + fragment])
        spool.commit(pending, None)
        spool.fragment()  # Hashing belongs to appends, not to persisting.
        spool.close()
        spools.append(spool)
    # A file store's directory must exist.
    await asyncio.to_thread(file_root.mkdir, parents=True, exist_ok=True)
    stores = StoreRegistry(file_root)
    persister = Persister(stores, work / "scratch")
    persister.start()
    cpu, started = time.process_time(), time.perf_counter()
    for spool in spools:
        target.index.add_local(spool)
        persister.enqueue(spool, target)
    await persister.wait_idle()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    assert persister.persisted_bytes == len(data), persister.persisted_bytes
    await persister.stop()
    return elapsed, cpu


async def read_runs(
    broker: BrokerProcess, journal: str, size: int, runs: int, file_root: Path | None = None
) -> dict[str, float]:
    """Proxied and direct reads of `journal`; `file_root`: where its file:// store's
    fragments are, for direct reads of a file store."""
    async with JournalClient(broker.url) as client:

        async def read(direct: bool) -> float:
            rr = RetryReader(client, journal, do_not_proxy=direct, file_root=file_root)
            t = time.perf_counter()
            n = 0
            try:
                async for chunk in chunks_of(rr):
                    n += len(chunk)
                seconds = time.perf_counter() - t
                # Fragments whose URL could not be opened, read through the broker instead.
                through_broker = rr._proxied_fragments
            finally:
                await rr.aclose()
            assert n == size, (n, size)
            if direct and through_broker:
                raise RuntimeError(
                    f"{journal}: a direct read fell back to the broker for {through_broker} "
                    "fragments (their URLs could not be opened here)"
                )
            return seconds

        proxied = min([await read(False) for _ in range(runs)])
        direct = min([await read(True) for _ in range(runs)])
    return {
        "proxied_mb_s": mb_s(size, proxied),
        "direct_mb_s": mb_s(size, direct),
        "direct_vs_proxied": round(proxied / direct, 2),
    }


async def load_journal(broker: BrokerProcess, spec: pb.JournalSpec, data: bytes) -> None:
    async with grpc.aio.insecure_channel(
        broker.address, options=[("grpc.max_send_message_length", 64 << 20)]
    ) as channel:
        stub = pb_grpc.JournalStub(channel)
        resp = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
        assert resp.status == pb.OK, resp
        step = 4 * MiB
        for i in range(0, len(data), step):

            async def reqs(chunk: bytes = data[i : i + step]):  # type: ignore[no-untyped-def]
                yield pb.AppendRequest(journal=spec.name)
                for j in range(0, len(chunk), MiB):
                    yield pb.AppendRequest(content=chunk[j : j + MiB])
                yield pb.AppendRequest()

            out = await stub.Append(reqs(), timeout=120)
            assert out.status == pb.OK, out


async def main(mb: int, fragment_mb: int, quick: bool) -> dict[str, object]:
    runs = 1 if quick else 3
    data = make_data(mb)
    fragment = fragment_mb * MiB
    work = Path(tempfile.mkdtemp(prefix="pygazette-bench-fragments-"))
    export_credentials()
    s3 = S3Server(work)
    s3.start()
    result: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "data_mb": mb,
        "fragment_mb": fragment_mb,
    }
    try:
        baselines = codec_baselines(data, runs)
        result["codecs"] = baselines
        persist: dict[str, dict[str, dict[str, float]]] = {"file": {}, "s3": {}}
        for target in ("file", "s3"):
            for name, codec in CODECS.items():
                # The baseline is measured right beside each persist figure, so that load
                # from elsewhere on the machine weighs on both alike.
                raw = raw_cpu = None
                if codec != pb.NONE:
                    raw_s, raw_cpu_s = best_of_with_cpu(
                        runs, lambda c=codec: codecs.compress(c, data)
                    )
                    raw, raw_cpu = mb_s(len(data), raw_s), mb_s(len(data), raw_cpu_s)
                best = best_cpu = float("inf")
                for run in range(runs):
                    root = work / f"persist-{target}-{name}-{run}"
                    url = "file:///" if target == "file" else s3.store_url(s3.create_bucket())
                    seconds, cpu = await persist_run(
                        url, root / "fragments", root, codec, data, fragment
                    )
                    best, best_cpu = min(best, seconds), min(best_cpu, cpu)
                    shutil.rmtree(root, ignore_errors=True)
                figure: dict[str, float] = {
                    "mb_s": mb_s(len(data), best),
                    "mb_per_cpu_s": mb_s(len(data), best_cpu),
                }
                if raw is not None and raw_cpu is not None:
                    figure["raw_compress_mb_s"] = raw
                    figure["vs_raw_compress"] = round(figure["mb_s"] / raw, 2)
                    figure["raw_compress_mb_per_cpu_s"] = raw_cpu
                    figure["vs_raw_compress_cpu"] = round(figure["mb_per_cpu_s"] / raw_cpu, 2)
                persist[target][name] = figure
        result["persist"] = persist

        reads: dict[str, dict[str, float]] = {}
        broker = BrokerProcess(work / "broker", extra_args=["--retention-interval", "0s"])
        broker.start()
        try:
            stores = {"file": "file:///", "s3": s3.store_url(s3.create_bucket())}
            for target, url in stores.items():
                spec = pb.JournalSpec(name=f"bench/read/{target}", replication=1)
                spec.fragment.length = fragment
                spec.fragment.compression_codec = pb.SNAPPY
                spec.fragment.stores.append(url)
                spec.fragment.refresh_interval.seconds = 300
                await load_journal(broker, spec, data)
            # Persists every spool: reads come from the stores (checked: a stop that timed
            # out would leave spools that the restarted broker serves instead).
            broker.stop(timeout=600)
            broker.start()
            for target in stores:
                await all_persisted(broker, f"bench/read/{target}", len(data))
                read_root = broker.file_root if target == "file" else None
                reads[target] = await read_runs(
                    broker, f"bench/read/{target}", len(data), runs, read_root
                )
        finally:
            broker.kill()
        result["read_snappy"] = reads
    finally:
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)
    return result


async def store_fragments(
    store: FragmentStore, spec: pb.JournalSpec, data: bytes, scratch: Path
) -> None:
    """Put `data` into `store` as the journal's fragments, as its broker would persist them."""
    step = spec.fragment.length
    codec = spec.fragment.compression_codec
    for begin in range(0, len(data), step):
        content = data[begin : begin + step]
        frag = pb.Fragment(
            journal=spec.name, begin=begin, end=begin + len(content), compression_codec=codec
        )
        frag.sum.CopyFrom(sha1sum_from_digest(hashlib.sha1(content).digest()))
        await asyncio.to_thread(scratch.write_bytes, codecs.compress(codec, content))
        await store.put_file(fragment_content_path(frag), scratch)


async def all_persisted(broker: BrokerProcess, journal: str, size: int) -> None:
    """Fail unless the journal's content is all in persisted fragments, listed by the broker
    (within a minute): what a read then reads comes from the store, not from a spool."""
    async with grpc.aio.insecure_channel(broker.address) as channel:
        stub = pb_grpc.JournalStub(channel)
        for _ in range(600):
            resp = await stub.ListFragments(pb.FragmentsRequest(journal=journal))
            persisted = [f.spec for f in resp.fragments if f.spec.backing_store]
            if sum(f.end - f.begin for f in persisted) == size:
                return
            await asyncio.sleep(0.1)
    listed = [(f.spec.begin, f.spec.end, f.spec.backing_store) for f in resp.fragments]
    raise RuntimeError(f"{journal}: not all of its {size} bytes are persisted: {listed}")


async def reads_only(
    mb: int, fragment_mb: int, quick: bool, read_codecs: list[str], server: str
) -> dict[str, object]:
    """Proxied and direct read figures only, per codec and store."""
    runs = 1 if quick else 3
    data = make_data(mb)
    work = Path(tempfile.mkdtemp(prefix="pygazette-bench-reads-"))
    s3: S3Server | RealS3Server
    if server == "versitygw":
        s3 = RealS3Server(work / "s3")
        env = s3.env()
        os.environ.update(env)  # For the fragments this process puts.
    else:
        export_credentials()
        s3 = S3Server(work)
        env = None
    s3.start()
    result: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "data_mb": mb,
        "fragment_mb": fragment_mb,
        "s3_server": server,
    }
    try:
        broker = BrokerProcess(work / "broker", extra_args=["--retention-interval", "0s"], env=env)
        broker.start()
        stores = StoreRegistry(broker.file_root)
        try:
            reads: dict[str, dict[str, dict[str, float]]] = {"file": {}, "s3": {}}
            for target in ("file", "s3"):
                for name in read_codecs:
                    url = "file:///" if target == "file" else s3.store_url(s3.create_bucket())
                    spec = pb.JournalSpec(name=f"bench/read/{target}/{name}", replication=1)
                    spec.fragment.length = fragment_mb * MiB
                    spec.fragment.compression_codec = CODECS[name]
                    spec.fragment.stores.append(url)
                    spec.fragment.refresh_interval.seconds = 300
                    # The fragments go into the store as a broker persists them: the reads
                    # then come from the store.
                    await store_fragments(stores.get(url), spec, data, work / "fragment")
                    async with grpc.aio.insecure_channel(broker.address) as channel:
                        stub = pb_grpc.JournalStub(channel)
                        change = pb.ApplyRequest.Change(upsert=spec)
                        resp = await stub.Apply(pb.ApplyRequest(changes=[change]))
                        assert resp.status == pb.OK, resp
                    await all_persisted(broker, spec.name, len(data))
                    read_root = broker.file_root if target == "file" else None
                    reads[target][name] = await read_runs(
                        broker, spec.name, len(data), runs, read_root
                    )
        finally:
            broker.kill()
        result["read"] = reads
    finally:
        if isinstance(s3, RealS3Server):
            s3.kill()
        else:
            s3.stop()
        shutil.rmtree(work, ignore_errors=True)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=32, help="MiB of journal data")
    parser.add_argument("--fragment-mb", type=int, default=8, help="MiB per fragment")
    parser.add_argument("--quick", action="store_true", help="one run of each measurement")
    parser.add_argument("--reads-only", action="store_true", help="only the read figures")
    parser.add_argument(
        "--read-codecs", default="NONE,SNAPPY", help="codecs of --reads-only (comma-separated)"
    )
    parser.add_argument("--s3", choices=("moto", "versitygw"), default="moto")
    args = parser.parse_args()
    if args.reads_only:
        outcome = reads_only(
            args.mb, args.fragment_mb, args.quick, args.read_codecs.split(","), args.s3
        )
    else:
        outcome = main(args.mb, args.fragment_mb, args.quick)
    print(json.dumps(asyncio.run(outcome), indent=2))
