"""FSM hints in the keyspace: where a shard's recovery starts reading its log.

Gazette stores a shard's hints at `<hint_prefix>/<shard id>.primary` (written by the
primary as it records) and rotates verified hints through `.backup.0` … `.backup.N-1` when
a primary finishes recovery, so that a corrupt or over-pruned primary hint can be fallen back
from. Values are JSON, exactly as Go's encoding/json writes Gazette's FSMHints struct
(snake_case names, zero values omitted except the lists), and a binary protobuf value is
accepted too, as Gazette accepts both.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from google.protobuf.message import DecodeError

from pygazette.keyspace.keyspace import Compare, Keyspace, KeyValue, Put
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from pygazette.protocol.shard_validation import hint_backup_keys, hint_primary_key

log = logging.getLogger(__name__)

__all__ = [
    "HintsError",
    "decode_hints",
    "encode_hints",
    "fetch_hints",
    "pick_first_hints",
    "store_recorded_hints",
    "store_recovered_hints",
]


class HintsError(ValueError):
    """A stored hints value that doesn't decode."""


def _omit_zero(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v}


def encode_hints(hints: rpb.FSMHints) -> bytes:
    """Hints as Go's json.Marshal writes Gazette's FSMHints."""
    doc: dict[str, Any] = _omit_zero({"log": hints.log})
    doc["live_nodes"] = [
        {
            **_omit_zero({"fnode": node.fnode}),
            "segments": [
                _omit_zero(
                    {
                        "author": s.author,
                        "first_seq_no": s.first_seq_no,
                        "first_offset": s.first_offset,
                        "first_checksum": s.first_checksum,
                        "last_seq_no": s.last_seq_no,
                        "last_offset": s.last_offset,
                        "log": s.log,
                    }
                )
                for s in node.segments
            ],
        }
        for node in hints.live_nodes
    ]
    doc["properties"] = [
        _omit_zero({"path": p.path, "content": p.content}) for p in hints.properties
    ]
    return json.dumps(doc, separators=(",", ":")).encode()


def _get(d: dict[str, Any], name: str, kind: type) -> Any:
    # Go's decoder matches field names case-insensitively.
    for key, value in d.items():
        if key.lower() == name:
            if value is None:
                return kind()
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise HintsError(f"hints field {name!r}: expected {kind.__name__}")
            return value
    return kind()


def decode_hints(raw: bytes) -> rpb.FSMHints:
    """Hints from a keyspace value (JSON, or binary protobuf as Gazette also accepts)."""
    hints = rpb.FSMHints()
    if not raw.startswith(b"{"):
        try:
            hints.ParseFromString(raw)
        except DecodeError as exc:
            raise HintsError(f"hints don't decode: {exc}") from exc
        return hints
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise HintsError(f"hints aren't valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise HintsError("hints JSON is not an object")
    hints.log = _get(doc, "log", str)
    for node in _get(doc, "live_nodes", list):
        if not isinstance(node, dict):
            raise HintsError("hints live_nodes entry is not an object")
        out = hints.live_nodes.add(fnode=_get(node, "fnode", int))
        for seg in _get(node, "segments", list):
            if not isinstance(seg, dict):
                raise HintsError("hints segment is not an object")
            out.segments.add(
                author=_get(seg, "author", int),
                first_seq_no=_get(seg, "first_seq_no", int),
                first_offset=_get(seg, "first_offset", int),
                first_checksum=_get(seg, "first_checksum", int),
                last_seq_no=_get(seg, "last_seq_no", int),
                last_offset=_get(seg, "last_offset", int),
                log=_get(seg, "log", str),
            )
    for prop in _get(doc, "properties", list):
        if not isinstance(prop, dict):
            raise HintsError("hints property is not an object")
        hints.properties.add(path=_get(prop, "path", str), content=_get(prop, "content", str))
    return hints


async def _get_kv(ks: Keyspace, key: str) -> KeyValue | None:
    """`key` as the store has it now: hint keys usually live outside the mirrored root."""
    get_remote = getattr(ks, "get_remote", None)
    if get_remote is not None:
        kv: KeyValue | None = await get_remote(key)
        return kv
    return ks.get(key)


async def _get_kvs(ks: Keyspace, keys: list[str]) -> list[KeyValue | None]:
    """`keys` as the store has them now, all at one revision."""
    get_remote_many = getattr(ks, "get_remote_many", None)
    if get_remote_many is not None:
        kvs: list[KeyValue | None] = await get_remote_many(keys)
        return kvs
    return [ks.get(key) for key in keys]  # The embedded keyspace: no await in between.


async def fetch_hints(
    ks: Keyspace, spec: cpb.ShardSpec
) -> list[tuple[str, KeyValue | None, rpb.FSMHints | None]]:
    """(key, key/value, hints) of the primary hints key, then of each backup key, read in
    one transaction as Gazette's fetchHints reads them: read one by one, a rotation of the
    backup keys between two reads answered a mix of before and after."""
    keys = [hint_primary_key(spec), *hint_backup_keys(spec)]
    kvs = await _get_kvs(ks, keys)
    return [
        (key, kv, decode_hints(kv.value) if kv is not None and kv.value else None)
        for key, kv in zip(keys, kvs, strict=True)
    ]


def pick_first_hints(
    fetched: list[tuple[str, KeyValue | None, rpb.FSMHints | None]], log_name: str
) -> rpb.FSMHints:
    """The primary hints, else the most recent backup, else empty hints of the log."""
    for _key, _kv, hints in fetched:
        if hints is not None:
            return hints
    return rpb.FSMHints(log=log_name)


async def store_recorded_hints(
    ks: Keyspace,
    spec: cpb.ShardSpec,
    hints: rpb.FSMHints,
    assignment: KeyValue | None = None,
) -> bool:
    """Write a primary's recorded hints to the primary hints key — with `assignment`, only
    while that assignment still exists (as Gazette guards it), so a deposed primary doesn't
    overwrite its successor's hints."""
    compares: list[Compare] = []
    if assignment is not None:
        current = ks.get(assignment.key)
        if current is None or current.create_revision != assignment.create_revision:
            return False
        compares.append(Compare(assignment.key, current.mod_revision))
    result = await ks.txn(compares, [Put(hint_primary_key(spec), encode_hints(hints))])
    return result.succeeded


async def store_recovered_hints(
    ks: Keyspace,
    spec: cpb.ShardSpec,
    hints: rpb.FSMHints,
    assignment: KeyValue | None = None,
) -> bool | None:
    """Rotate `hints` (verified by a completed recovery) into the backup keys: backup.0
    takes them, backup.1 takes backup.0's former value, and so on.

    With `assignment`, only while that assignment still exists, as Gazette guards it: a
    replica deposed while it recovered must not push its hints over the newer ones its
    successor may have rotated in since. Returns True once stored, False if the backup keys
    or the assignment changed meanwhile (try again), None if the assignment is gone."""
    fetched = await fetch_hints(ks, spec)
    backups = fetched[1:]
    compares: list[Compare] = []
    if assignment is not None:
        current = await _get_kv(ks, assignment.key)
        if current is None or current.create_revision != assignment.create_revision:
            return None
        compares.append(Compare(assignment.key, current.mod_revision))
    ops: list[Put] = []
    value: bytes | None = encode_hints(hints)
    for key, kv, _hints in backups:
        if value is None:
            break
        ops.append(Put(key, value))
        compares.append(Compare(key, kv.mod_revision if kv is not None else 0))
        value = kv.value if kv is not None else None
    if not ops:
        return True
    result = await ks.txn(compares, ops)
    return result.succeeded
