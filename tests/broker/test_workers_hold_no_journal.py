"""Shared workers (the persister's, the pulser's) hold nothing of a journal once they are
done with it: a deleted journal's replica is freed, not kept by whichever worker last
served it until that worker's next job."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

from pygazette.broker.fragment.fragment_index import FragmentIndex
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.fragment.spool import Spool
from pygazette.broker.pulser import Pulser
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores.store import StoreRegistry
from tests.broker.rpc_helpers import journal_spec


class _Journal:
    """A replica, as the persister and the pulser see it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.spec = journal_spec(name)
        self.index = FragmentIndex(name)
        self.primary = True
        self.stopping = False


async def _persist_one(persister: Persister, root: Path, name: str) -> weakref.ref[_Journal]:
    journal = _Journal(name)
    spool = Spool.create(root / "spools" / "j", name, 0, pb.NONE, pb.LabelSet(), sync=False)
    pending = spool.start_append()
    pending.write(b"content\n")
    spool.commit(pending, None)
    spool.close()
    persister.enqueue(spool, journal)
    async with asyncio.timeout(30):
        await persister.wait_idle()
    assert persister.persisted_count == 1
    return weakref.ref(journal)


async def test_the_persister_holds_no_journal_it_persisted(tmp_path: Path) -> None:
    # Each of a store's workers kept its last job (the spool, and the journal's replica)
    # while it waited for the next: a broker whose journals were all deleted still held
    # up to four of their replicas.
    (tmp_path / "fragments").mkdir()
    persister = Persister(StoreRegistry(tmp_path / "fragments"), tmp_path / "scratch")
    try:
        gone = await _persist_one(persister, tmp_path, "workers/persisted")
        gc.collect()
        assert gone() is None
    finally:
        await persister.stop()


async def _pulse_one(pulser: Pulser, pulsed: asyncio.Event) -> weakref.ref[_Journal]:
    journal = _Journal("workers/pulsed")
    pulser.request(journal)  # type: ignore[arg-type]
    async with asyncio.timeout(30):
        await pulsed.wait()
    return weakref.ref(journal)


async def test_the_pulser_holds_no_journal_it_pulsed() -> None:
    # Each pulse worker kept the last journal it pulsed until its next pulse: a broker
    # whose journals were all deleted still held up to eight of their replicas.
    pulsed = asyncio.Event()

    async def pulse(_journal: object) -> bool:
        pulsed.set()
        return True

    pulser = Pulser(pulse)  # type: ignore[arg-type]
    pulser.start()
    try:
        gone = await _pulse_one(pulser, pulsed)
        for _ in range(3):
            await asyncio.sleep(0)  # The worker goes back to waiting for work.
        gc.collect()
        assert gone() is None
    finally:
        await pulser.stop()
