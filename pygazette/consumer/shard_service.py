"""The `consumer.Shard` gRPC servicer (Gazette's shard_api.go), over a ShardResolver.

Every request is validated first: bad input fails with INVALID_ARGUMENT and a message
naming the field. Gazette statuses travel in the response's `status`.

- List: shards whose labels plus the synthetic label `id=<shard id>` match the selector,
  each with its spec, mod and create revisions, route (with endpoints) and the status of
  each assignment in route order.
- Stat: resolved to the shard's primary. If that is another process, the request is proxied
  to it with the resolution's header (the peer first reads through that etcd revision, and
  answers NOT_SHARD_PRIMARY rather than proxying again); here, it waits until the shard's
  committed transactions have read through the requested offsets of its source journals,
  and answers its progress (read_through, publish_at).
- Apply: all changes in one etcd transaction, each guarded by its expect_mod_revision (-1:
  no guard); upserts may also install primary hints. ETCD_TRANSACTION_FAILED when a guard
  fails; otherwise the answer comes once this process's mirror reflects etcd as of it.
- GetHints: the hints stored at the spec's primary hints key and at each backup key.
- Unassign: delete the shards' FAILED assignments and (unless only_failed) their primary
  assignments, in one transaction guarded by their mod revisions; dry_run only reports.

Response headers carry this process's ID (or, for a routed response, the primary's), the
shard's route and the etcd revision it was served at, as the broker's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
import grpc.aio

from pygazette.auth.verified_claims import labels_permitted
from pygazette.consumer.hints import HintsError, encode_hints, fetch_hints
from pygazette.consumer.key_space import canonical_shard_spec
from pygazette.consumer.resolver import (
    ReplicaStopped,
    Resolution,
    ResolveError,
    ShardResolver,
)
from pygazette.consumer.shard_client import ShardPeers
from pygazette.keyspace.keyspace import (
    Compare,
    Delete,
    Keyspace,
    KeyspaceUnavailable,
    KeyValue,
    Put,
)
from pygazette.keyspace.layout import KeyLayout
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import consumer_pb2_grpc as cpb_grpc
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import selector_matches
from pygazette.protocol.shard_validation import (
    hint_primary_key,
    recovery_log,
    shard_label_set_ext,
    validate_fsm_hints,
    validate_get_hints_request,
    validate_shard_apply_request,
    validate_shard_list_request,
    validate_stat_request,
    validate_unassign_request,
)
from pygazette.protocol.validation import repeated_change

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_STAT_WAIT_SECONDS", "ShardService"]

Context = grpc.aio.ServicerContext[Any, Any]

# How long a Stat without a deadline waits for the shard to read through its offsets: as
# long as it takes (Gazette's waits until the client's deadline or cancellation, or the shard
# stops). A server may set a bound of its own (`stat_wait`).
DEFAULT_STAT_WAIT_SECONDS: float | None = None
# Specs whose List view is kept (all are dropped past it).
_LISTED_LIMIT = 100_000
# How long an answer waits for this process's mirror to reflect its own write.
_OWN_WRITE_WAIT_SECONDS = 30.0


class ShardService(cpb_grpc.ShardServicer):
    def __init__(
        self,
        resolver: ShardResolver,
        keyspace: Keyspace,
        layout: KeyLayout,
        *,
        peers: ShardPeers | None = None,
        stat_wait: float | None = DEFAULT_STAT_WAIT_SECONDS,
    ) -> None:
        self.resolver = resolver
        self.keyspace = keyspace
        self.layout = layout
        self.peers = peers if peers is not None else ShardPeers()
        self.stat_wait = stat_wait
        # List's view of each spec (by item key and mod revision): its labels with the
        # shard ID, and its canonical form.
        self._listed: dict[tuple[str, int], tuple[pb.LabelSet, cpb.ShardSpec]] = {}

    async def close(self) -> None:
        """Close the channels to peers (proxied Stats)."""
        await self.peers.close()

    # Stat.
    async def Stat(self, request: cpb.StatRequest, context: Context) -> cpb.StatResponse:  # type: ignore[override]
        await _validate(validate_stat_request, request, context)
        proxied = request.HasField("header")
        if not self._permitted(request.shard):  # As if it didn't exist (Gazette's resolver).
            return cpb.StatResponse(status=cpb.SHARD_NOT_FOUND, header=self.resolver.header())
        res = await self._resolve(context, request, proxied)
        if res.status != cpb.OK:
            return cpb.StatResponse(status=res.status, header=res.header)
        if res.replica is None:
            return await self._proxy_stat(request, res, context)

        assert res.spec is not None
        # Only offsets of the shard's own sources count (as Gazette's).
        read_through = {
            src.journal: request.read_through[src.journal]
            for src in res.spec.sources
            if request.read_through.get(src.journal, 0) != 0
        }
        remaining = context.time_remaining()
        within = self.stat_wait if remaining is None else max(0.0, remaining)
        try:
            rt, pa = await _until_stopped(
                res.replica.wait_read_through(read_through, within), res.stopped
            )
        except ReplicaStopped:
            return cpb.StatResponse(status=cpb.SHARD_STOPPED, header=res.header)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"shard {request.shard} did not read through {read_through} in time",
            )
            raise  # Not reached: abort raises.
        resp = cpb.StatResponse(status=cpb.OK, header=res.header)
        resp.read_through.update(rt)
        resp.publish_at.update(pa)
        return resp

    async def _resolve(
        self, context: Context, request: cpb.StatRequest, proxied: bool
    ) -> Resolution:
        try:
            return await self.resolver.resolve(
                request.shard,
                require_primary=True,
                proxy=not proxied,
                proxy_header=request.header if proxied else None,
            )
        except ResolveError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise  # Not reached: abort raises.

    async def _proxy_stat(
        self, request: cpb.StatRequest, res: Resolution, context: Context
    ) -> cpb.StatResponse:
        route, target = res.route, res.header.process_id
        endpoint = ""
        for i, member in enumerate(route.members):
            if member.zone == target.zone and member.suffix == target.suffix:
                endpoint = route.endpoints[i] if i < len(route.endpoints) else ""
        if not endpoint:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"primary {target.zone}#{target.suffix} of shard {request.shard} "
                "advertises no endpoint",
            )
        forwarded = cpb.StatRequest()
        forwarded.CopyFrom(request)
        forwarded.header.CopyFrom(res.header)
        try:
            stub = self.peers.stub(endpoint)
            resp: cpb.StatResponse = await stub.Stat(forwarded, timeout=context.time_remaining())
        except ValueError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"primary endpoint: {exc}")
            raise  # Not reached: abort raises.
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "proxied Stat failed")
            raise  # Not reached: abort raises.
        return resp

    # List.
    async def List(self, request: cpb.ListRequest, context: Context) -> cpb.ListResponse:  # type: ignore[override]
        await _validate(validate_shard_list_request, request, context)
        resolver = self.resolver
        state = resolver.observed.current
        resp = cpb.ListResponse(status=cpb.OK, header=resolver.header())
        for item in state.items:
            found = resolver.shard_spec(state, item.id)
            if found is None:
                continue
            spec, kv = found
            labels, canonical = self._listed_spec(spec, kv)
            if not selector_matches(request.selector, labels) or not labels_permitted(labels):
                continue
            assignments = resolver.shard_assignments(state, item.id)
            shard = resp.shards.add(
                spec=canonical,
                mod_revision=kv.mod_revision,
                create_revision=kv.create_revision,
                route=resolver.shard_route(state, assignments),
            )
            for a in assignments:
                status = resolver.decoder.replica_status(a.kv)
                assert status is not None  # shard_assignments keeps decodable ones only.
                shard.status.append(status)
        return resp

    def _listed_spec(self, spec: cpb.ShardSpec, kv: KeyValue) -> tuple[pb.LabelSet, cpb.ShardSpec]:
        key = (kv.key, kv.mod_revision)
        listed = self._listed.get(key)
        if listed is None:
            if len(self._listed) > _LISTED_LIMIT:
                self._listed.clear()
            listed = self._listed[key] = (shard_label_set_ext(spec), canonical_shard_spec(spec))
        return listed

    # Apply.
    async def Apply(self, request: cpb.ApplyRequest, context: Context) -> cpb.ApplyResponse:  # type: ignore[override]
        await _validate(validate_shard_apply_request, request, context)
        shards = [c.upsert.id if c.HasField("upsert") else c.delete for c in request.changes]
        if problem := repeated_change("shard", shards):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        compares: list[Compare] = []
        ops: list[Put | Delete] = []
        for change, shard in zip(request.changes, shards, strict=True):
            # Upserts are authorized on the shard's labels, deletes on its id alone.
            if not labels_permitted(
                shard_label_set_ext(change.upsert)
                if change.HasField("upsert")
                else _id_labels(change.delete)
            ):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"not authorized to {shard}")
            if change.HasField("upsert"):
                key = self.layout.item_key(change.upsert.id)
                value = canonical_shard_spec(change.upsert).SerializeToString(deterministic=True)
                ops.append(Put(key, value))
                if change.HasField("primary_hints"):
                    hints = change.primary_hints
                    if hints.log != recovery_log(change.upsert):
                        await context.abort(
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"PrimaryHints.Log {hints.log!r} != ShardSpec.RecoveryLog "
                            f"{recovery_log(change.upsert)!r} of shard {change.upsert.id}",
                        )
                    ops.append(Put(hint_primary_key(change.upsert), encode_hints(hints)))
            else:
                key = self.layout.item_key(change.delete)
                ops.append(Delete(key))
            if change.expect_mod_revision != -1:  # -1 skips the revision check.
                compares.append(Compare(key, change.expect_mod_revision))
        header = self.resolver.header()
        result = await self._txn(compares, ops, context)
        if result.revision > 0:
            header.etcd.revision = result.revision  # As Gazette's: the transaction's.
        if not result.succeeded:
            return cpb.ApplyResponse(status=cpb.ETCD_TRANSACTION_FAILED, header=header)
        if ops:
            await self._read_own_write(result.revision)
        return cpb.ApplyResponse(status=cpb.OK, header=header)

    # GetHints.
    async def GetHints(  # type: ignore[override]
        self, request: cpb.GetHintsRequest, context: Context
    ) -> cpb.GetHintsResponse:
        await _validate(validate_get_hints_request, request, context)
        resolver = self.resolver
        state = resolver.observed.current
        resp = cpb.GetHintsResponse(status=cpb.OK, header=resolver.header())
        found = resolver.shard_spec(state, request.shard)
        if found is None or not labels_permitted(shard_label_set_ext(found[0])):
            resp.status = cpb.SHARD_NOT_FOUND
            return resp
        spec, _kv = found
        try:
            fetched = await fetch_hints(self.keyspace, spec)
        except KeyspaceUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise  # Not reached: abort raises.
        except HintsError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            raise  # Not reached: abort raises.
        log_name = recovery_log(spec)
        resp.primary_hints.SetInParent()
        for i, (key, _kv2, hints) in enumerate(fetched):
            target = resp.primary_hints if i == 0 else resp.backup_hints.add()
            if hints is None:
                continue
            try:
                validate_fsm_hints(hints)
            except ValidationError as exc:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, f"validating FSMHints at {key}: {exc}"
                )
            if hints.log != log_name:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"hints.Log {hints.log} != ShardSpec.RecoveryLog {log_name} (at {key})",
                )
            target.hints.CopyFrom(hints)
        return resp

    # Unassign.
    async def Unassign(  # type: ignore[override]
        self, request: cpb.UnassignRequest, context: Context
    ) -> cpb.UnassignResponse:
        await _validate(validate_unassign_request, request, context)
        resolver = self.resolver
        state = resolver.observed.current
        resp = cpb.UnassignResponse(status=cpb.OK)
        compares: list[Compare] = []
        ops: list[Put | Delete] = []
        for shard in request.shards:
            if not labels_permitted(_id_labels(shard)):  # By the "id" label alone.
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"not authorized to {shard}")
            for a in resolver.shard_assignments(state, shard):
                status = resolver.decoder.replica_status(a.kv)
                assert status is not None
                # A FAILED assignment is always removed; so is a primary, unless only
                # failed ones are asked for.
                failed = status.code == cpb.ReplicaStatus.FAILED
                if not failed and (request.only_failed or a.slot != 0):
                    continue
                compares.append(Compare(a.kv.key, a.kv.mod_revision))
                ops.append(Delete(a.kv.key))
                if not resp.shards or resp.shards[-1] != shard:
                    resp.shards.append(shard)
        if request.dry_run or not ops:
            return resp
        result = await self._txn(compares, ops, context)
        if not result.succeeded:
            resp.status = cpb.ETCD_TRANSACTION_FAILED
        else:
            await self._read_own_write(result.revision)
        return resp

    # Helpers.
    def _permitted(self, shard: str) -> bool:
        """Whether the RPC's claims reach `shard` (true of a shard that doesn't exist)."""
        found = self.resolver.shard_spec(self.resolver.observed.current, shard)
        return found is None or labels_permitted(shard_label_set_ext(found[0]))

    async def _txn(self, compares: list[Compare], ops: list[Put | Delete], context: Context) -> Any:
        """One transaction of `ops`, whose size is etcd's to judge (as Gazette's: an etcd run
        with a larger --max-txn-ops takes more)."""
        try:
            return await self.keyspace.txn(compares, ops)
        except KeyspaceUnavailable as exc:
            cause = exc.__cause__
            if (
                isinstance(cause, grpc.aio.AioRpcError)
                and cause.code() == grpc.StatusCode.INVALID_ARGUMENT
            ):
                # etcd refused the transaction itself: retrying can't help.
                details = cause.details() or ""
                advice = (
                    f": {len(ops)} operations are more than etcd's --max-txn-ops; apply them "
                    "in batches"
                    if "too many operations" in details
                    else ""
                )
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"executing etcd transaction: {details}{advice}",
                )
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"executing etcd transaction: {exc}")
            raise  # Not reached: abort raises.

    async def _read_own_write(self, revision: int) -> None:
        """Answer only once our mirror reflects etcd as of our own write (as Gazette's).
        A transaction that changed no key under the root (deleting a shard that doesn't
        exist) is at a revision that writes elsewhere (hints keys, other roots) reached: the
        mirror reflects it without any change of its own, so it is not waited for as one."""
        with contextlib.suppress(TimeoutError):
            await self.keyspace.wait_for_store_revision(revision, _OWN_WRITE_WAIT_SECONDS)


async def _until_stopped(
    wait: Coroutine[Any, Any, tuple[dict[str, int], dict[str, int]]],
    stopped: asyncio.Event | None,
) -> tuple[dict[str, int], dict[str, int]]:
    """Await `wait`, raising ReplicaStopped if `stopped` is set first."""
    task = asyncio.ensure_future(wait)
    if stopped is None:
        return await task
    stop_wait = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait([task, stop_wait], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # Cancelled: so is the wait.
        task.cancel()
        raise
    finally:
        stop_wait.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ReplicaStopped("the shard stopped")


def _id_labels(shard: str) -> pb.LabelSet:
    return pb.LabelSet(labels=[pb.Label(name="id", value=shard)])


async def _validate(validator: Callable[[Any], None], request: object, context: Context) -> None:
    try:
        validator(request)
    except ValidationError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
