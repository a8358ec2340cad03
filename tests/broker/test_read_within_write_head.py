"""Read and ListFragments responses describe only content readers may see, under pipelining.

A real three-broker cluster at replication 3: many appenders pipeline small appends into the
same journals while blocking readers follow them at the head — through the primary, proxied
through another broker, and served by a replica itself (`do_not_proxy`) — and listers poll
ListFragments. Every response is checked as Gazette's Go client checks it
(`validate_read_response`, `validate_fragments_response`: a fragment never ends past the
write head), every listed fragment ends at or below the write head its broker reports right
after, and every fragment any response named has the SHA-1 of exactly the content the
journal holds over its [begin, end).

Gazette's Go client threw away most Read responses of busy journals from pygazette brokers
("ReadResponse: invalid WriteHead (9857; expected >= 10006)"): the open spool's fragment
counted commits pipelined past what every replica had confirmed.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import sha1sum_from_digest
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.validation import validate_fragments_response, validate_read_response
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, ClusterBroker, append_once, read_range
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

JOURNALS = ("head/one", "head/two")
APPENDERS = 8  # Per journal.
APPENDS = 40  # Per appender.


class Checker:
    """Checks every response it is shown; keeps every fragment named, and what broke."""

    def __init__(self) -> None:
        self.fragments: dict[str, list[pb.Fragment]] = {j: [] for j in JOURNALS}
        self.violations: list[str] = []  # The first few of each kind.
        self.counts: dict[str, int] = {}  # Violations by kind ("read …", "list …").
        self.read_responses = 0
        self.listings = 0

    def violation(self, where: str, what: str) -> None:
        kind = where.split(" at ")[0].split()[0]
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] <= 5:
            self.violations.append(f"{where}: {what}")

    def read_response(self, where: str, journal: str, resp: pb.ReadResponse) -> None:
        self.read_responses += 1
        try:
            validate_read_response(resp)
        except ValidationError as exc:
            self.violation(where, f"{exc} in {resp}")
        if resp.HasField("fragment"):
            if resp.write_head < resp.fragment.end:
                self.violation(where, f"fragment past the write head: {resp}")
            self.fragments[journal].append(resp.fragment)

    def listing(self, where: str, journal: str, resp: pb.FragmentsResponse, head: int) -> None:
        self.listings += 1
        try:
            validate_fragments_response(resp)
        except ValidationError as exc:
            self.violation(where, f"{exc} in {resp}")
        for f in resp.fragments:
            if f.spec.end > head:
                self.violation(where, f"listed fragment {f.spec} past the write head {head}")
            self.fragments[journal].append(f.spec)


async def _cluster(tmp_path: Path, etcd: EtcdProcess, root: str) -> Cluster:
    cluster = Cluster(tmp_path, etcd, root)
    for i in range(3):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    await cluster.start()
    specs = []
    for name in JOURNALS:
        # Small fragments: spools roll, persist and are listed while the run goes on.
        spec = journal_spec(name, replication=3, length=128 << 10)
        spec.fragment.refresh_interval.seconds = 1
        specs.append(spec)
    assert (await apply_specs(cluster.stub(cluster.brokers[0]), *specs)).status == pb.OK
    await cluster.wait_ready(list(JOURNALS), 3)
    return cluster


async def _list(
    cluster: Cluster,
    broker: ClusterBroker,
    journal: str,
    checker: Checker,
    stop: asyncio.Event,
    direct: bool,
) -> None:
    """Poll ListFragments at `broker` (and its write head right after) until `stop` (with
    `direct`, that broker's own replica answers: do_not_proxy)."""
    where = f"list {journal} at {broker.member_key}{' (direct)' if direct else ''}"
    stub: pb_grpc.JournalStub = cluster.stub(broker)
    while not stop.is_set():
        resp = await stub.ListFragments(
            pb.FragmentsRequest(journal=journal, do_not_proxy=direct), timeout=10
        )
        # The write head never moves back: one read after the listing bounds what it showed.
        head = await stub.Read(
            pb.ReadRequest(journal=journal, offset=-1, block=False, do_not_proxy=direct),
            timeout=10,
        ).read()
        checker.read_response(where, journal, head)
        checker.listing(where, journal, resp, head.write_head)
        await asyncio.sleep(0.01)


async def test_responses_stay_within_the_write_head(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    cluster = await _cluster(tmp_path, etcd, etcd_root)
    checker = Checker()
    stop = asyncio.Event()
    appenders: list[asyncio.Task[None]] = []
    listers: list[asyncio.Task[None]] = []
    followers: list[tuple[str, asyncio.Task[bytes]]] = []
    try:
        total: dict[str, int] = dict.fromkeys(JOURNALS, 0)
        appended: dict[str, int] = dict.fromkeys(JOURNALS, 0)

        async def appender(journal: str, w: int, stub: pb_grpc.JournalStub) -> None:
            rng = random.Random(f"{journal}/{w}")
            for seq in range(APPENDS):
                data = f"{w}-{seq}:".encode() + rng.randbytes(rng.randint(100, 4000)) + b"\n"
                resp = await append_once(stub, journal, data, within=60, chunk=1024)
                assert resp.status == pb.OK, resp
                appended[journal] += len(data)
                # Acknowledged: every member shows it, under a write head covering it.
                member = rng.choice(cluster.members_of(journal))
                where = f"read {journal} at {member.member_key} (direct, acknowledged)"
                meta = (
                    await cluster.stub(member)
                    .Read(
                        pb.ReadRequest(
                            journal=journal,
                            offset=resp.commit.begin,
                            block=False,
                            metadata_only=True,
                            do_not_proxy=True,
                        ),
                        timeout=10,
                    )
                    .read()
                )
                checker.read_response(where, journal, meta)
                if meta.status != pb.OK or meta.write_head < resp.commit.end:
                    checker.violation(where, f"{resp.commit} acknowledged, but {meta}")

        for journal in JOURNALS:
            primary = cluster.primary_of(journal)
            assert primary is not None
            others = [b for b in cluster.members_of(journal) if b is not primary]
            # Appends go to the primary (and, proxied, to another broker).
            for w in range(APPENDERS):
                via = primary if w % 2 == 0 else others[0]
                appenders.append(asyncio.create_task(appender(journal, w, cluster.stub(via))))
            for broker, direct in ((primary, False), (others[0], False), (others[1], True)):
                lister = _list(cluster, broker, journal, checker, stop, direct)
                listers.append(asyncio.create_task(lister))
        done = asyncio.gather(*appenders)
        for journal in JOURNALS:
            primary = cluster.primary_of(journal)
            assert primary is not None
            others = [b for b in cluster.members_of(journal) if b is not primary]
            for broker, direct in (
                (primary, False),
                (primary, False),
                (others[0], False),  # Proxied to the primary.
                (others[1], True),  # A replica's own spool.
            ):
                task = _follow(cluster, broker, journal, checker, done, total, direct)
                followers.append((journal, asyncio.create_task(task)))

        async with asyncio.timeout(240):
            await done
        for journal in JOURNALS:
            total[journal] = appended[journal]
        async with asyncio.timeout(120):
            results = [(j, await t) for j, t in followers]
        stop.set()
        await asyncio.gather(*listers)

        for journal in JOURNALS:
            primary = cluster.primary_of(journal)
            assert primary is not None
            content, head = await read_range(cluster.stub(primary), journal)
            assert head == len(content) == total[journal]
            for j, got in results:
                if j == journal:
                    assert got == content
            for frag in checker.fragments[journal]:
                want = sha1sum_from_digest(hashlib.sha1(content[frag.begin : frag.end]).digest())
                assert frag.sum == want, f"fragment {frag} has the sum of other content"
        print(
            f"{checker.read_responses} read responses, {checker.listings} listings, "
            f"{sum(len(f) for f in checker.fragments.values())} fragments checked"
        )
        assert not checker.counts, f"{checker.counts}:\n" + "\n".join(checker.violations)
    finally:
        stop.set()
        tasks = appenders + listers + [t for _j, t in followers]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await cluster.close()


async def _follow(
    cluster: Cluster,
    broker: ClusterBroker,
    journal: str,
    checker: Checker,
    done: asyncio.Future[object],
    total: dict[str, int],
    direct: bool,
) -> bytes:
    """Follow `journal` at its head with blocking reads until the appenders are `done` and
    all `total[journal]` bytes were read."""
    where = f"read {journal} at {broker.member_key}{' (direct)' if direct else ''}"
    stub = cluster.stub(broker)
    out = bytearray()
    while not (done.done() and total[journal] and len(out) >= total[journal]):
        req = pb.ReadRequest(journal=journal, offset=len(out), block=True, do_not_proxy=direct)
        try:
            async for resp in stub.Read(req, timeout=2):
                checker.read_response(where, journal, resp)
                if resp.status != pb.OK:
                    await asyncio.sleep(0.05)
                    break
                if resp.content:
                    assert resp.offset == len(out), (where, resp.offset, len(out))
                    out += resp.content
                elif resp.fragment_url:
                    path = cluster.file_root / resp.fragment_url.removeprefix("file:///")
                    out += path.read_bytes()[len(out) - resp.fragment.begin :]
                    assert len(out) == resp.fragment.end, where
                    break
                if done.done() and total[journal] and len(out) >= total[journal]:
                    break
        except grpc.aio.AioRpcError as exc:
            # A blocking read at the head ends at its deadline; anything else is a failure.
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (where, exc)
    return bytes(out)
