"""The embedded single-node keyspace, persisted to one file.

It lets `pygazette serve` run with nothing else installed. Each transaction rewrites a JSON
snapshot of all keys (written to a temp file, fsynced and renamed into place), so specs and
revisions survive crashes and restarts. It holds journal specs, which are few and small.
With no path it keeps its keys in memory only (in-process simulations and benchmarks).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pygazette.keyspace.keyspace import (
    ClusterIdentity,
    Compare,
    Delete,
    KeyChanges,
    Keyspace,
    KeyValue,
    Put,
    TxnResult,
)

_FORMAT = "pygazette-embedded-keyspace-v1"


class KeyspaceFileError(RuntimeError):
    """The keyspace file exists but can't be read as one (damaged, or not ours)."""


class EmbeddedKeyspace(Keyspace):
    def __init__(self, path: Path | None) -> None:
        super().__init__()
        self.path = path
        self._lock = asyncio.Lock()
        self._kvs: dict[str, KeyValue] = {}
        self._revision = 1
        self._identity = ClusterIdentity(random.getrandbits(63) | 1, random.getrandbits(63) | 1, 1)
        if path is not None and path.exists():
            self._load()
        elif path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._save()

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def identity(self) -> ClusterIdentity:
        return self._identity

    def get(self, key: str) -> KeyValue | None:
        return self._kvs.get(key)

    def range(self, prefix: str) -> list[KeyValue]:
        return [self._kvs[k] for k in sorted(self._kvs) if k.startswith(prefix)]

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> TxnResult:
        async with self._lock:
            for cmp in compares:
                kv = self._kvs.get(cmp.key)
                if (kv.mod_revision if kv else 0) != cmp.mod_revision:
                    return TxnResult(False, self._revision)
            if not ops:
                return TxnResult(True, self._revision)
            prior_revision = revision = self._revision
            revision += 1
            kvs = self._kvs
            undo: dict[str, KeyValue | None] = {}  # Each touched key as it was.
            for op in ops:
                prior = kvs.get(op.key)
                undo.setdefault(op.key, prior)
                if isinstance(op, Put):
                    created = prior.create_revision if prior else revision
                    kvs[op.key] = KeyValue(op.key, op.value, created, revision)
                else:
                    kvs.pop(op.key, None)
            self._revision = revision
            if self.path is not None:
                try:
                    await asyncio.to_thread(self._save)
                except BaseException:
                    for key, was in undo.items():
                        if was is None:
                            kvs.pop(key, None)
                        else:
                            kvs[key] = was
                    self._revision = prior_revision
                    raise
            puts = [kv for kv in map(kvs.get, undo) if kv is not None]
            deletes = [key for key in undo if key not in kvs]
        await self._notify(KeyChanges(prior_revision, revision, puts, deletes))
        return TxnResult(True, revision)

    def _snapshot(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "revision": self._revision,
            "cluster_id": self._identity.cluster_id,
            "member_id": self._identity.member_id,
            "keys": [
                {
                    "key": kv.key,
                    "value": base64.b64encode(kv.value).decode(),
                    "create_revision": kv.create_revision,
                    "mod_revision": kv.mod_revision,
                }
                for kv in self._kvs.values()
            ],
        }

    def _save(self) -> None:
        assert self.path is not None
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(self._snapshot(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _load(self) -> None:
        assert self.path is not None
        try:
            doc = json.loads(self.path.read_text())
            if doc.get("format") != _FORMAT:
                raise ValueError(f"unknown format {doc.get('format')!r}")
            self._revision = int(doc["revision"])
            self._identity = ClusterIdentity(int(doc["cluster_id"]), int(doc["member_id"]), 1)
            self._kvs = {
                e["key"]: KeyValue(
                    e["key"],
                    base64.b64decode(e["value"]),
                    int(e["create_revision"]),
                    int(e["mod_revision"]),
                )
                for e in doc["keys"]
            }
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KeyspaceFileError(f"cannot load keyspace {self.path}: {exc}") from exc
