"""On a real etcd, the mirror and the allocator state built change by change from its watch
always equal a full rebuild: a fresh load of etcd, and a from-scratch extract of it.

Random sequences of transactions over members, items and assignments (and keys of no kind),
leases revoked with the keys under them (a member's lease expiring), the watch broken and
resumed over several revisions (they come in one response), and the watch resumed past a
compaction (a reload). The embedded keyspace's property tests (test_incremental_state) cover
`AllocatorState.apply`; this one covers what etcd's watch hands it.
"""

from __future__ import annotations

import asyncio
import uuid

import aetcd.rpc as etcd_rpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pygazette.allocator.allocator import ObservedState
from pygazette.allocator.state import AllocatorState
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.keyspace import Delete, KeyValue, Put
from pygazette.keyspace.layout import KeyLayout
from tests.allocator.test_allocation import TextDecoder
from tests.allocator.test_incremental_state import view
from tests.conftest import GRPC_CALLS_END_SECONDS, _grpc_calls_ending
from tests.support.etcd_process import EtcdProcess

_MEMBERS = [("a", "m0"), ("a", "m1"), ("b", "m2")]
_ITEMS = ["item-0", "item-1", "item-2"]


def _keys(layout: KeyLayout) -> list[str]:
    members = [layout.member_key(z, s) for z, s in _MEMBERS]
    items = [layout.item_key(i) for i in _ITEMS]
    assignments = [
        layout.assign_prefix + f"{item}#{z}#{s}#{slot}"
        for item in [*_ITEMS, "gone"]
        for z, s in _MEMBERS
        for slot in (0, 1)
    ]
    return members + items + assignments + [layout.root + "/other"]


def _value(layout: KeyLayout, key: str, n: int) -> bytes:
    if key.startswith(layout.members_prefix):
        return [b"0", b"2", b"4", b"4,exiting"][n % 4]
    if key.startswith(layout.items_prefix):
        return [b"0", b"1", b"2", b"3", b"bad"][n % 5]
    return [b"", b"route"][n % 2]


# A step: ("txn", [(key index, value index or None: delete), ...], under a lease or not),
# ("revoke",) the latest lease, ("gap", n) n transactions while the watch is down, then
# resumed, ("compact", n) the same and etcd compacted past the mirror meanwhile.
_ops = st.lists(
    st.tuples(st.integers(0, 200), st.one_of(st.none(), st.integers(0, 9))),
    min_size=1,
    max_size=6,
)
_step = st.one_of(
    st.tuples(st.just("txn"), _ops, st.booleans()),
    st.tuples(st.just("revoke")),
    st.tuples(st.just("gap"), st.lists(_ops, min_size=1, max_size=3)),
    st.tuples(st.just("compact"), st.lists(_ops, min_size=1, max_size=3)),
)


def _kvs(ks: EtcdKeyspace, root: str) -> list[KeyValue]:
    return ks.range(root + "/")


def _without_revision(v: dict[str, object]) -> dict[str, object]:
    # A fresh load's revision is etcd's, which counts writes elsewhere in the shared etcd.
    return {k: x for k, x in v.items() if k != "revision"}


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(_step, min_size=1, max_size=6))
def test_the_watched_state_equals_a_full_rebuild(
    etcd: EtcdProcess, steps: list[tuple[object, ...]]
) -> None:
    root = f"/prop-{uuid.uuid4().hex[:12]}/gazette/cluster"
    layout = KeyLayout(root)
    keys = _keys(layout)
    local = layout.member_key(*_MEMBERS[0])

    async def run() -> None:
        mirror = EtcdKeyspace(etcd.url, root)
        writer = EtcdKeyspace(etcd.url, root)
        await mirror.open()
        await writer.open()
        leases: list[int] = []
        try:
            observed = ObservedState(mirror, layout, TextDecoder(), local)

            async def txn(ops: list[tuple[int, int | None]], leased: bool = False) -> None:
                lease = 0
                if leased:
                    lease = await writer.grant_lease(60)
                    leases.append(lease)
                batch: dict[str, Put | Delete] = {}
                for k, v in ops:
                    key = keys[k % len(keys)]
                    if v is None:
                        batch[key] = Delete(key)
                    else:
                        batch[key] = Put(key, _value(layout, key, v), lease=lease)
                await writer.txn([], list(batch.values()))

            async def stop_watch() -> None:
                task = mirror._watch_task
                assert task is not None
                task.cancel()
                await asyncio.wait([task])

            for step in steps:
                if step[0] == "txn":
                    await txn(step[1], step[2])  # type: ignore[arg-type]
                elif step[0] == "revoke":
                    if leases:
                        await writer.revoke_lease(leases.pop())
                else:
                    await stop_watch()
                    for ops in step[1]:  # type: ignore[attr-defined]
                        await txn(ops)
                    if step[0] == "compact":
                        # Past the mirror's revision: the watch can't resume, it reloads.
                        r = await writer.txn([], [Put("/elsewhere" + root, b"")])
                        await writer._client.kvstub.Compact(
                            etcd_rpc.CompactionRequest(revision=r.revision, physical=True)
                        )
                    mirror._watch_task = asyncio.create_task(mirror._watch_loop())
                fresh = EtcdKeyspace(etcd.url, root)
                await fresh.open()
                try:
                    # etcd's revision as the fresh load read it (writes elsewhere included).
                    await mirror.wait_for_store_revision(fresh.revision, 10)
                    assert _kvs(mirror, root) == _kvs(fresh, root)
                    assert observed.current.revision == mirror.revision
                    scratch = AllocatorState.extract(fresh, layout, TextDecoder(), local)
                    assert _without_revision(view(observed.current)) == _without_revision(
                        view(scratch)
                    )
                finally:
                    await fresh.close()
        finally:
            await mirror.close()
            await writer.close()
            if ending := _grpc_calls_ending():
                await asyncio.wait(ending, timeout=GRPC_CALLS_END_SECONDS)

    asyncio.run(run())
