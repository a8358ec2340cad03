"""The persister: moves closed spools into the journal's first fragment store.

Spools persist in the order they closed. Compression runs on a worker thread, so appends
and reads never wait on it. A spool's local files are removed only after the store holds
the fragment durably; a failed put is retried with backoff, keeping the spool on disk (and
readable) meanwhile. A journal without stores keeps no history: its closed spools are
dropped, as Gazette does.

In a cluster, the primary persists its spools at once; replicas persist theirs a little
later and only if the store doesn't already hold a fragment covering them (usually the
primary's, which has the same name), so a fragment normally lands once, yet survives the
primary's loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import fragment_content_path, parse_fragment_path
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores import codecs
from pygazette.stores.store import FragmentStore, StoreRegistry

if TYPE_CHECKING:
    from pygazette.broker.fragment_index import FragmentIndex
    from pygazette.broker.spool import Spool

log = logging.getLogger(__name__)

# How long a replica leaves its primary to persist a fragment before checking for it.
REPLICA_PERSIST_DELAY_SECONDS = 5.0


class Persister:
    def __init__(self, stores: StoreRegistry, scratch_dir: Path) -> None:
        self.stores = stores
        self.scratch_dir = scratch_dir
        self._queue: asyncio.Queue[tuple[Spool, list[str], FragmentIndex, bool]] = (
            asyncio.Queue()
        )
        self._delayed: dict[asyncio.TimerHandle, tuple[Spool, list[str], FragmentIndex, bool]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.persisted_count = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="persister")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def enqueue(
        self,
        spool: Spool,
        stores: list[str],
        index: FragmentIndex,
        *,
        check_existing: bool = False,
    ) -> None:
        """Persist the closed `spool` to `stores[0]` (drop it if there are no stores).

        With `check_existing` (a replica's spool), wait a little and skip the upload if the
        store already holds a fragment covering the spool.
        """
        self._idle.clear()
        item = (spool, list(stores), index, check_existing)
        if not check_existing:
            self._queue.put_nowait(item)
            return

        def release() -> None:
            self._delayed.pop(handle, None)
            self._queue.put_nowait(item)

        handle = asyncio.get_running_loop().call_later(REPLICA_PERSIST_DELAY_SECONDS, release)
        self._delayed[handle] = item

    def expedite(self) -> None:
        """Stop delaying replicas' spools (the broker is shutting down)."""
        for handle, item in list(self._delayed.items()):
            handle.cancel()
            self._queue.put_nowait(item)
        self._delayed.clear()

    async def wait_idle(self) -> None:
        """Wait until everything queued has persisted."""
        await self._idle.wait()

    async def _run(self) -> None:
        while True:
            spool, stores, index, check_existing = await self._queue.get()
            backoff = 0.1
            while True:
                try:
                    await self.persist(spool, stores, index, check_existing=check_existing)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning(
                        "persist failed; will retry",
                        extra={"journal": spool.journal, "begin": spool.begin, "error": str(exc)},
                    )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
            if self._queue.empty() and not self._delayed:
                self._idle.set()

    async def persist(
        self, spool: Spool, stores: list[str], index: FragmentIndex, *, check_existing: bool = False
    ) -> None:
        if spool.deleted:
            return
        if not stores or spool.end == spool.begin:
            index.remove_local(spool)
            spool.delete()
            return
        frag = spool.fragment()
        frag.backing_store = stores[0]
        store = self.stores.get(stores[0])
        path = fragment_content_path(frag)
        if check_existing:
            covering = await self._covering(store, frag)
            if covering is not None:
                covering.backing_store = stores[0]
                index.add_persisted(covering)
                index.remove_local(spool)
                spool.delete()
                return
        encoding = "gzip" if frag.compression_codec == pb.GZIP_OFFLOAD_DECOMPRESSION else ""
        if frag.compression_codec == pb.NONE:
            await store.put_file(path, spool.content_path, content_encoding=encoding)
        else:
            tmp = await asyncio.to_thread(self._compress, spool)
            try:
                await store.put_file(path, tmp, content_encoding=encoding)
            finally:
                tmp.unlink(missing_ok=True)
        frag.mod_time = int(time.time())
        index.add_persisted(frag)
        index.remove_local(spool)
        spool.delete()
        self.persisted_count += 1
        log.info(
            "persisted fragment",
            extra={"journal": frag.journal, "begin": frag.begin, "end": frag.end, "path": path},
        )

    @staticmethod
    async def _covering(store: FragmentStore, frag: pb.Fragment) -> pb.Fragment | None:
        """A fragment in `store` covering all of `frag`, if there is one."""
        for obj in await store.list_files(frag.journal + "/"):
            try:
                other = parse_fragment_path(frag.journal, obj.path)
            except ValidationError:
                continue
            if other.begin <= frag.begin and frag.end <= other.end:
                other.mod_time = obj.mod_time
                return other
        return None

    def _compress(self, spool: Spool) -> Path:
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        with open(spool.content_path, "rb") as f:
            data = f.read(spool.end - spool.begin)
        fd, tmp = tempfile.mkstemp(dir=self.scratch_dir, prefix="persist-")
        with os.fdopen(fd, "wb") as out:
            out.write(codecs.compress(spool.codec, data))
        return Path(tmp)
