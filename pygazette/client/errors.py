"""Errors raised only by the client: offset jumps, invalid responses, direct fragment reads,
cancelled readers.

Broker statuses (JOURNAL_NOT_FOUND, OFFSET_NOT_YET_AVAILABLE, ...) are not defined here: the
client raises the per-status exceptions of `pygazette.protocol.errors` for them.
"""

from __future__ import annotations

from pygazette.protocol.errors import GazetteError


class ClientError(GazetteError):
    """Base of the errors the client raises on its own account."""


class OffsetJump(ClientError):
    """The next readable byte is at a larger offset than the one requested.

    Raised once by a Reader (and RetryReader) when the broker answers with an offset beyond the
    requested one, usually because the span in between was removed by retention. The reader
    stays usable: the next read continues from `offset`.
    """

    def __init__(self, journal: str, requested: int, offset: int) -> None:
        super().__init__(f"offset jump in {journal}: requested {requested}, continuing at {offset}")
        self.journal = journal
        self.requested = requested
        self.offset = offset


class ProtocolViolation(ClientError):
    """The broker answered something the protocol does not allow (a bug on its side)."""


class InvalidResponse(ProtocolViolation):
    """A response broke a rule of Gazette's protocol (its `Validate()` methods, or the RPC's
    contract): raised, and counted, by `response_check` as soon as the response arrives.

    `rpc` names the RPC ("Read", "Append", ...), `subject` what it was about (a journal's name,
    a listing's selector, a shard), `rule` the broken rule in Gazette's words
    ("Fragment: invalid WriteHead (9857; expected >= 10006)" reads
    "invalid Read response of a/journal: ...").
    """

    def __init__(self, rpc: str, subject: str, rule: str) -> None:
        of = f" of {subject}" if subject else ""
        super().__init__(f"invalid {rpc} response{of}: {rule}")
        self.rpc = rpc
        self.subject = subject
        self.rule = rule


class FragmentReadError(ClientError, OSError):
    """A fragment file could not be opened or did not hold what its name promises."""


class FragmentOpenError(FragmentReadError):
    """The fragment URL could not be fetched (missing file, HTTP error, unsupported scheme)."""


class UnexpectedFragmentEOF(FragmentReadError):
    """The fragment's content ended before the fragment's `end` offset."""


class DidNotReadExpectedEOF(FragmentReadError):
    """The fragment's content continued past the fragment's `end` offset."""


class CorruptFragment(FragmentReadError):
    """The fragment's bytes do not decompress with its codec."""


class ReaderCancelled(ClientError):
    """The reader was cancelled (by `cancel()`) while a read was in progress."""
