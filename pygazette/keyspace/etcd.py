"""The etcd keyspace: a watched local mirror of every key under a root, over `aetcd`.

`open()` loads the keys under the root at one revision, then a watch from that revision
applies every change to the mirror, in revision order, and notifies listeners. The mirror's
revision is the mod revision of the last change it applied (or the load revision), so
`wait_for_revision(r)` for the revision `r` of a write under the root returns once the
mirror reflects that write. A broken watch is re-established from the mirror's revision
(whose events it skips); if etcd compacted past it, is behind the mirror (replaced or
restored), or is another cluster, the mirror reloads.

Writes go straight to etcd as transactions guarded by mod revisions, as Gazette's do. The
lease calls that membership needs live here too: grant, keep alive, revoke.

An `https://` etcd URL is reached over TLS (`ClientTLS`: the CA to trust, and a client
certificate for an etcd run with `--client-cert-auth`), through `_TLSEtcdClient`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import logging
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import aetcd
import aetcd.rpc as etcd_rpc
import aetcd.watcher as etcd_watcher
import grpc

from pygazette.auth.tls import ClientTLS, channel_credentials
from pygazette.keyspace.keyspace import (
    DEFAULT_ROOT,
    ClusterIdentity,
    Compare,
    Delete,
    KeyChanges,
    Keyspace,
    KeyspaceUnavailable,
    KeyValue,
    Put,
    TxnResult,
)

log = logging.getLogger(__name__)

_RPC_TIMEOUT = 10.0
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]
# Fail watches on an etcd member cut off from its cluster's leader, as Gazette does.
_REQUIRE_LEADER = (("hasleader", "true"),)
# Both channels to etcd: connections are pinged (a dead one is noticed within ~10 s, as
# Gazette's DialKeepAliveTime does; etcd refuses pings more often than every 5 s by default),
# and a lost one is reconnected within a second of etcd being back. gRPC's core (1.85) times
# a ping's acknowledgement out by ping_timeout_ms (one minute by default), not by
# keepalive_timeout_ms: without it a dead connection went unnoticed for a minute or more.
_CHANNEL_OPTIONS = {
    "grpc.keepalive_time_ms": 5000,
    "grpc.keepalive_timeout_ms": 5000,
    "grpc.http2.ping_timeout_ms": 5000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
}


def parse_etcd_url(url: str) -> tuple[str, int]:
    """Host and port of an etcd client URL such as "http://127.0.0.1:2379" (or
    "https://…", see `etcd_url_is_tls`)."""
    text = url.strip()
    if "," in text:
        raise ValueError(f"one etcd endpoint expected, got {url!r}")
    parts = urlsplit(text if "://" in text else "http://" + text)
    if parts.scheme not in ("http", "https", ""):
        raise ValueError(
            f"unsupported etcd URL scheme {parts.scheme!r} in {url!r} (use http:// or https://)"
        )
    if not parts.hostname:
        raise ValueError(f"etcd URL has no host: {url!r}")
    try:
        port = parts.port or 2379
    except ValueError:
        raise ValueError(f"etcd URL has a bad port: {url!r}") from None
    return parts.hostname, port


def etcd_url_is_tls(url: str) -> bool:
    """Whether the etcd URL asks for TLS ("https://")."""
    return url.strip().lower().startswith("https://")


class _TLSEtcdClient(aetcd.Client):  # type: ignore[misc]
    """`aetcd.Client` over a TLS channel (aetcd itself only opens insecure ones). Only
    `connect` differs: it opens a secure channel, then the same stubs `aetcd` would."""

    def __init__(self, credentials: grpc.ChannelCredentials, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        target = f"{self._host}:{self._port}"
        self.channel = grpc.aio.secure_channel(
            target, self._credentials, options=list(self._options.items())
        )
        self.kvstub = etcd_rpc.KVStub(self.channel)
        self.clusterstub = etcd_rpc.ClusterStub(self.channel)
        self.leasestub = etcd_rpc.LeaseStub(self.channel)
        self.maintenancestub = etcd_rpc.MaintenanceStub(self.channel)
        self._watcher = etcd_watcher.Watcher(
            etcd_rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
        )
        self._connected.set()


def _prefix_end(prefix: bytes) -> bytes:
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def _key_text(raw: bytes) -> str:
    """An etcd key as the mirror holds it. etcd keys are bytes and need not be UTF-8 (any
    tool may write under the root): one that isn't keeps its bytes as lone surrogates, so it
    is mirrored (and written back, `_key_bytes`) like any other, and fails to decode as a
    member, item or assignment (`keyspace.layout`) instead of failing the mirror."""
    return raw.decode("utf-8", "surrogateescape")


def _key_bytes(key: str) -> bytes:
    """An etcd key of the mirror, as etcd has it (see `_key_text`)."""
    return key.encode("utf-8", "surrogateescape")


def _kv(raw: Any) -> KeyValue:
    return KeyValue(
        _key_text(raw.key),
        bytes(raw.value),
        int(raw.create_revision),
        int(raw.mod_revision),
        int(raw.lease),
    )


class EtcdKeyspace(Keyspace):
    """A Keyspace mirroring `<root>/` of an etcd cluster."""

    def __init__(self, url: str, root: str = DEFAULT_ROOT, *, tls: ClientTLS | None = None) -> None:
        super().__init__(root)
        self.url = url
        host, port = parse_etcd_url(url)
        if tls is not None and not etcd_url_is_tls(url):
            raise ValueError(f"etcd TLS options given, but {url!r} is not an https:// URL")
        client_type: Any = aetcd.Client
        self._target = f"{host}:{port}"
        self._credentials: grpc.ChannelCredentials | None = None
        if etcd_url_is_tls(url):
            # Files are read and checked now, at start-up.
            self._credentials = channel_credentials(tls)
            client_type = functools.partial(_TLSEtcdClient, self._credentials)
        self._client = client_type(
            host=host,
            port=port,
            timeout=None,
            options={
                **_CHANNEL_OPTIONS,
                # The initial load is one Range of everything under the root: over gRPC's
                # default 4 MiB at ~10,000 journals (as etcd's Go client, no limit).
                "grpc.max_receive_message_length": -1,
            },
        )
        self._prefix = (root + "/").encode()
        self._kvs: dict[str, KeyValue] = {}
        self._keys: list[str] = []  # Sorted.
        self._revision = 0
        self._identity = ClusterIdentity(0, 0, 0)
        self._watch_task: asyncio.Task[None] | None = None
        self.watch_failures = 0  # Watches re-established (for tests and diagnostics).
        # A synchronous channel for `keep_alive_blocking` (a thread's own, opened on use).
        self._sync_channel: grpc.Channel | None = None
        self._sync_lock = threading.Lock()

    # Keyspace interface.
    @property
    def revision(self) -> int:
        return self._revision

    @property
    def identity(self) -> ClusterIdentity:
        return self._identity

    def get(self, key: str) -> KeyValue | None:
        return self._kvs.get(key)

    def range(self, prefix: str) -> list[KeyValue]:
        i = bisect.bisect_left(self._keys, prefix)
        out = []
        while i < len(self._keys) and self._keys[i].startswith(prefix):
            out.append(self._kvs[self._keys[i]])
            i += 1
        return out

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> TxnResult:
        request = etcd_rpc.TxnRequest(
            compare=[
                etcd_rpc.Compare(
                    result=etcd_rpc.Compare.EQUAL,
                    target=etcd_rpc.Compare.MOD,
                    key=_key_bytes(c.key),
                    mod_revision=c.mod_revision,
                )
                for c in compares
            ],
            success=[self._request_op(op) for op in ops],
        )
        resp = await self._call(lambda: self._client.kvstub.Txn(request, timeout=_RPC_TIMEOUT))
        return TxnResult(bool(resp.succeeded), int(resp.header.revision))

    @staticmethod
    def _request_op(op: Put | Delete) -> Any:
        if isinstance(op, Put):
            return etcd_rpc.RequestOp(
                request_put=etcd_rpc.PutRequest(
                    key=_key_bytes(op.key),
                    value=op.value,
                    lease=0 if op.ignore_lease else op.lease,
                    ignore_lease=op.ignore_lease,
                )
            )
        return etcd_rpc.RequestOp(
            request_delete_range=etcd_rpc.DeleteRangeRequest(key=_key_bytes(op.key))
        )

    # Lifecycle.
    async def open(self) -> None:
        """Connect, load the keys under the root, and start watching them."""
        await self._call(self._client.connect)
        await self._load()
        self._watch_task = asyncio.create_task(self._watch_loop(), name="etcd-watch")

    async def close(self) -> None:
        await super().close()
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.wait([self._watch_task])  # Our own cancellation still propagates.
            self._watch_task = None
        with contextlib.suppress(Exception):
            await self._client.close()
        self.close_blocking_channel()

    async def _call(self, fn: Any) -> Any:
        try:
            return await fn()
        except (grpc.aio.AioRpcError, aetcd.ClientError, OSError) as exc:
            raise KeyspaceUnavailable(f"etcd at {self.url}: {_describe(exc)}") from exc
        except TimeoutError as exc:
            raise KeyspaceUnavailable(f"etcd at {self.url}: timed out") from exc

    async def _load(self) -> None:
        request = etcd_rpc.RangeRequest(key=self._prefix, range_end=_prefix_end(self._prefix))
        resp = await self._call(lambda: self._client.kvstub.Range(request, timeout=_RPC_TIMEOUT))
        kvs = {kv.key: kv for kv in (_kv(raw) for raw in resp.kvs)}
        prior = self._revision
        self._kvs = kvs
        self._keys = sorted(kvs)
        self._revision = int(resp.header.revision)
        self._identity = ClusterIdentity(
            int(resp.header.cluster_id), int(resp.header.member_id), int(resp.header.raft_term)
        )
        await self._notify(KeyChanges(prior, self._revision, reset=True))

    # Watching.
    async def _watch_loop(self) -> None:
        backoff = 0.05
        while True:
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except _Reload as exc:
                log.warning(f"{exc}; reloading", extra={"revision": self._revision})
                with contextlib.suppress(KeyspaceUnavailable):
                    await self._load()
                    backoff = 0.05
                    continue
            except Exception as exc:
                self.watch_failures += 1
                log.warning(
                    "etcd watch failed (will restart)",
                    extra={"error": _describe(exc), "revision": self._revision},
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _watch_once(self) -> None:
        stub = etcd_rpc.WatchStub(self._client.channel)
        call = stub.Watch(metadata=_REQUIRE_LEADER)
        try:
            await call.write(
                etcd_rpc.WatchRequest(
                    create_request=etcd_rpc.WatchCreateRequest(
                        key=self._prefix,
                        range_end=_prefix_end(self._prefix),
                        # From the mirror's own revision, not the next one: its events are
                        # skipped (`_apply`), but etcd then reports any compaction that took
                        # a revision the mirror lacks. Resumed from a compaction revision,
                        # a watch is accepted and misses its deletes (compaction dropped
                        # their tombstones): the mirror would keep those keys for good.
                        start_revision=self._revision,
                    )
                )
            )
            while True:
                resp = await call.read()
                if resp is _EOF:
                    raise KeyspaceUnavailable("watch stream ended")
                if resp.compact_revision:
                    raise _Reload("etcd compacted past the mirror's revision")
                cluster = self._identity.cluster_id
                if cluster and resp.header.cluster_id and resp.header.cluster_id != cluster:
                    # Another etcd cluster (the store replaced): its revisions are not the
                    # mirror's, whatever they are (Gazette's keyspace checks it too).
                    raise _Reload(
                        f"etcd is another cluster ({resp.header.cluster_id}, not {cluster})"
                    )
                if 0 < resp.header.revision < self._revision:
                    # The store is behind the mirror: it was replaced (data lost, or
                    # restored from a snapshot). The watch would wait for the mirror's
                    # next revision, missing every change until the store reached it.
                    raise _Reload(f"etcd is at revision {resp.header.revision}, behind the mirror")
                if resp.canceled:
                    raise KeyspaceUnavailable(f"watch canceled: {resp.cancel_reason}")
                if resp.events:
                    await self._apply(resp)
        finally:
            call.cancel()

    async def _apply(self, resp: Any) -> None:
        revision = prior = self._revision
        touched: dict[str, None] = {}
        for event in resp.events:
            kv = event.kv
            mod = int(kv.mod_revision)
            if mod <= self._revision:
                continue  # Already applied (a re-established watch may repeat a revision).
            key = _key_text(kv.key)
            if event.type == etcd_rpc.Event.PUT:
                if key not in self._kvs:
                    bisect.insort(self._keys, key)
                self._kvs[key] = _kv(kv)
            elif key in self._kvs:
                del self._kvs[key]
                self._keys.pop(bisect.bisect_left(self._keys, key))
            touched[key] = None
            revision = max(revision, mod)
        if revision == self._revision:
            return
        self._revision = revision
        hdr = resp.header
        self._identity = ClusterIdentity(
            int(hdr.cluster_id) or self._identity.cluster_id, int(hdr.member_id), int(hdr.raft_term)
        )
        puts = [kv for kv in map(self._kvs.get, touched) if kv is not None]
        deletes = [key for key in touched if key not in self._kvs]
        await self._notify(KeyChanges(prior, revision, puts, deletes))

    async def wait_for_store_revision(self, revision: int, within: float | None = None) -> None:
        """Return once the mirror reflects etcd as of `revision`. The mirror's revision is
        that of the last change under the root: a revision etcd reached through writes
        elsewhere (another root, another application; Gazette's Headers carry etcd's
        revision) is never applied. Past a short wait, etcd is asked whether any key under
        the root changed between the mirror's revision and `revision`; if none did, the
        mirror is as of `revision` and says so."""
        if self._revision >= revision:
            return
        delay = 0.05
        async with asyncio.timeout(within):
            while True:
                with contextlib.suppress(TimeoutError):
                    await self.wait_for_revision(revision, delay)
                    return
                if await self._unchanged_through(revision):
                    return
                delay = min(delay * 2, 1.0)

    async def _unchanged_through(self, revision: int) -> bool:
        """If no key under the root changed after the mirror's revision up to `revision`,
        advance the mirror to it (True). Two reads at `revision` tell: a key modified after
        the mirror's revision (a put), and the count of keys (a delete, with no put, changes
        it). A key both created and deleted in between is missed, as it leaves the mirror
        as it was."""
        seen, count = self._revision, len(self._kvs)
        end = _prefix_end(self._prefix)
        total = etcd_rpc.RangeRequest(
            key=self._prefix, range_end=end, revision=revision, count_only=True
        )
        # (etcd's count ignores min_mod_revision: it filters the keys it returns.)
        newer = etcd_rpc.RangeRequest(
            key=self._prefix,
            range_end=end,
            revision=revision,
            keys_only=True,
            limit=1,
            min_mod_revision=seen + 1,
        )
        try:
            resp_total = await self._call(
                lambda: self._client.kvstub.Range(total, timeout=_RPC_TIMEOUT)
            )
            resp_newer = await self._call(
                lambda: self._client.kvstub.Range(newer, timeout=_RPC_TIMEOUT)
            )
        except KeyspaceUnavailable:  # Compacted, a future revision, or etcd unreachable.
            return False
        if self._revision >= revision:
            return True
        if self._revision != seen or resp_newer.kvs or resp_total.count != count:
            return False  # The watch brings the changes.
        self._revision = revision
        await self._notify(KeyChanges(seen, revision))
        return True

    # Direct reads and leases (membership).
    async def get_remote(self, key: str) -> KeyValue | None:
        """`key` as etcd has it now (not the mirror)."""
        request = etcd_rpc.RangeRequest(key=_key_bytes(key))
        resp = await self._call(lambda: self._client.kvstub.Range(request, timeout=_RPC_TIMEOUT))
        return _kv(resp.kvs[0]) if resp.kvs else None

    async def get_remote_many(self, keys: Sequence[str]) -> list[KeyValue | None]:
        """Each of `keys` as etcd has it now, all at one revision (one transaction)."""
        request = etcd_rpc.TxnRequest(
            success=[
                etcd_rpc.RequestOp(request_range=etcd_rpc.RangeRequest(key=_key_bytes(key)))
                for key in keys
            ]
        )
        resp = await self._call(lambda: self._client.kvstub.Txn(request, timeout=_RPC_TIMEOUT))
        out: list[KeyValue | None] = []
        for op in resp.responses:
            kvs = op.response_range.kvs
            out.append(_kv(kvs[0]) if kvs else None)
        return out

    async def grant_lease(self, ttl_seconds: int) -> int:
        request = etcd_rpc.LeaseGrantRequest(TTL=ttl_seconds)
        resp = await self._call(
            lambda: self._client.leasestub.LeaseGrant(request, timeout=_RPC_TIMEOUT)
        )
        if resp.error:
            raise KeyspaceUnavailable(f"etcd lease grant: {resp.error}")
        return int(resp.ID)

    async def keep_alive(self, lease: int, within: float) -> int:
        """Refresh `lease`; returns its renewed TTL in seconds (0: the lease is gone)."""

        async def once() -> int:
            call = self._client.leasestub.LeaseKeepAlive(
                iter([etcd_rpc.LeaseKeepAliveRequest(ID=lease)]), timeout=within
            )
            try:
                async for reply in call:
                    return int(reply.TTL)
                return 0
            finally:
                call.cancel()

        result: int = await self._call(once)
        return result

    def keep_alive_blocking(self, lease: int, within: float) -> int:
        """`keep_alive` for a thread of its own, on a synchronous channel of its own: it
        doesn't wait for the event loop, so a busy loop can't starve the lease."""
        with self._sync_lock:
            if self._sync_channel is None:
                # Pinged as the other one is: a connection that died silently is noticed and
                # replaced while the lease lives (a refresh waits on it as long as that).
                options = list(_CHANNEL_OPTIONS.items())
                if self._credentials is not None:
                    self._sync_channel = grpc.secure_channel(
                        self._target, self._credentials, options=options
                    )
                else:
                    self._sync_channel = grpc.insecure_channel(self._target, options=options)
            channel = self._sync_channel
        stub = etcd_rpc.LeaseStub(channel)
        try:
            replies = stub.LeaseKeepAlive(
                iter([etcd_rpc.LeaseKeepAliveRequest(ID=lease)]), timeout=within
            )
            try:
                for reply in replies:
                    return int(reply.TTL)
                return 0
            finally:
                replies.cancel()
        except (grpc.RpcError, ValueError) as exc:  # ValueError: the channel was closed.
            raise KeyspaceUnavailable(f"etcd at {self.url}: {_describe(exc)}") from exc

    def close_blocking_channel(self) -> None:
        """Close `keep_alive_blocking`'s channel (ending a call in flight on it)."""
        with self._sync_lock:
            channel, self._sync_channel = self._sync_channel, None
        if channel is not None:
            channel.close()

    async def revoke_lease(self, lease: int) -> None:
        request = etcd_rpc.LeaseRevokeRequest(ID=lease)
        with contextlib.suppress(KeyspaceUnavailable):
            await self._call(
                lambda: self._client.leasestub.LeaseRevoke(request, timeout=_RPC_TIMEOUT)
            )


class _Reload(Exception):
    """The watch can't resume from the mirror's revision: the mirror must reload."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, grpc.RpcError) and isinstance(exc, grpc.Call):  # A synchronous call's.
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__
