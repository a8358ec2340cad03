"""Recovery logs: a shard's local store, replicated as a journal of file operations.

Byte-compatible with Gazette's `consumer/recoverylog`: the same `RecordedOp` records in
fixed frames, checksum chaining, hints and fence registers, so Gazette's tools and player
read logs pygazette writes, and the other way around.

- `FSM` (and `Author`, `FSMHints` handling): which operations apply, in what order;
- `Recorder`: records a directory's file operations, one journal append per commit;
- `Player`: plays a log into a directory, tails it, and hands it off to a new author;
- `Segment`, `SegmentSet`: the stretches of log that hints point into.
"""

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
