"""Recovery logs: a shard's local store, replicated as a journal of file operations.

Byte-compatible with Gazette's `consumer/recoverylog`: the same `RecordedOp` records in
fixed frames, checksum chaining, hints and fence registers, so Gazette's tools and player
read logs pygazette writes, and the other way around.

- `FSM` (and `Author`, `FSMHints` handling): which operations apply, in what order;
- `Recorder`: records a directory's file operations, one journal append per commit;
- `Player`: plays a log into a directory, tails it, and hands it off to a new author;
- `Segment`, `SegmentSet`: the stretches of log that hints point into.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pygazette.consumer.recoverylog.fsm import (
        FENCE_LABEL,
        FSM,
        Author,
        ChecksumMismatch,
        ExpectedHintedFnode,
        FnodeNotTracked,
        FnodeState,
        FSMError,
        HintsSnapshot,
        LinkExists,
        NoSuchLink,
        NotHintedAuthor,
        PropertyExists,
        WrongSeqNo,
        live_log_segments,
        validate_hints,
    )
    from pygazette.consumer.recoverylog.player import FNODE_STAGING_DIR, Player, PlayerError
    from pygazette.consumer.recoverylog.recorder import (
        Recorder,
        RecorderError,
        RecorderFailed,
        RecorderFenced,
        normalize_path,
    )
    from pygazette.consumer.recoverylog.segments import Segment, SegmentError, SegmentSet

__all__ = [
    "FENCE_LABEL",
    "FNODE_STAGING_DIR",
    "FSM",
    "Author",
    "ChecksumMismatch",
    "ExpectedHintedFnode",
    "FSMError",
    "FnodeNotTracked",
    "FnodeState",
    "HintsSnapshot",
    "LinkExists",
    "NoSuchLink",
    "NotHintedAuthor",
    "Player",
    "PlayerError",
    "PropertyExists",
    "Recorder",
    "RecorderError",
    "RecorderFailed",
    "RecorderFenced",
    "Segment",
    "SegmentError",
    "SegmentSet",
    "WrongSeqNo",
    "live_log_segments",
    "normalize_path",
    "validate_hints",
]

# Where each exported name is defined. A name's module is imported when the name is first
# used (PEP 562), so importing one module of the package imports no other.
_EXPORTS: dict[str, str] = {
    "Author": "pygazette.consumer.recoverylog.fsm",
    "ChecksumMismatch": "pygazette.consumer.recoverylog.fsm",
    "ExpectedHintedFnode": "pygazette.consumer.recoverylog.fsm",
    "FENCE_LABEL": "pygazette.consumer.recoverylog.fsm",
    "FSM": "pygazette.consumer.recoverylog.fsm",
    "FSMError": "pygazette.consumer.recoverylog.fsm",
    "FnodeNotTracked": "pygazette.consumer.recoverylog.fsm",
    "FnodeState": "pygazette.consumer.recoverylog.fsm",
    "HintsSnapshot": "pygazette.consumer.recoverylog.fsm",
    "LinkExists": "pygazette.consumer.recoverylog.fsm",
    "NoSuchLink": "pygazette.consumer.recoverylog.fsm",
    "NotHintedAuthor": "pygazette.consumer.recoverylog.fsm",
    "PropertyExists": "pygazette.consumer.recoverylog.fsm",
    "WrongSeqNo": "pygazette.consumer.recoverylog.fsm",
    "live_log_segments": "pygazette.consumer.recoverylog.fsm",
    "validate_hints": "pygazette.consumer.recoverylog.fsm",
    "FNODE_STAGING_DIR": "pygazette.consumer.recoverylog.player",
    "Player": "pygazette.consumer.recoverylog.player",
    "PlayerError": "pygazette.consumer.recoverylog.player",
    "Recorder": "pygazette.consumer.recoverylog.recorder",
    "RecorderError": "pygazette.consumer.recoverylog.recorder",
    "RecorderFailed": "pygazette.consumer.recoverylog.recorder",
    "RecorderFenced": "pygazette.consumer.recoverylog.recorder",
    "normalize_path": "pygazette.consumer.recoverylog.recorder",
    "Segment": "pygazette.consumer.recoverylog.segments",
    "SegmentError": "pygazette.consumer.recoverylog.segments",
    "SegmentSet": "pygazette.consumer.recoverylog.segments",
}

if not TYPE_CHECKING:  # Type checkers see the imports above instead.

    def __getattr__(name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
