"""Exception types of pygazette, and the mapping of broker `Status` codes to them.

Every error pygazette raises on purpose derives from `GazetteError`. Bad input
is a `ValidationError` (also a `ValueError`), whose message is prefixed by the
dotted path of the offending field, as Gazette's own validation errors are.
A non-OK `Status` in an RPC response becomes a `BrokerError` subclass.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pygazette.protocol.pb import protocol_pb2 as pb

__all__ = [
    "BrokerError",
    "EtcdTransactionFailed",
    "FragmentStoreUnhealthy",
    "GazetteError",
    "IndexHasGreaterOffset",
    "InsufficientJournalBrokers",
    "JournalNotFound",
    "NoJournalPrimaryBroker",
    "NotAllowed",
    "NotJournalBroker",
    "NotJournalPrimaryBroker",
    "OffsetNotYetAvailable",
    "ProposalMismatch",
    "RegisterMismatch",
    "Suspended",
    "ValidationError",
    "WrongAppendOffset",
    "WrongRoute",
    "error_for_status",
    "raise_for_status",
    "status_name",
]


class GazetteError(Exception):
    """Base class of every error raised by pygazette."""


class ValidationError(GazetteError, ValueError):
    """Input failed validation.

    `context` is the path of the field at fault, outermost first; `detail`
    says what is wrong with it. `str()` joins them as Gazette does:
    ``"Fragment.Journal: invalid length (2; expected 4 <= length <= 512)"``.
    """

    def __init__(self, detail: str, context: list[str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.context: list[str] = list(context or [])

    def extend(self, context: str) -> ValidationError:
        """Prepend one level of field context, and return this same error."""
        self.context.insert(0, context)
        return self

    def __str__(self) -> str:
        if self.context:
            return ".".join(self.context) + ": " + self.detail
        return self.detail

    def __repr__(self) -> str:
        return f"ValidationError({str(self)!r})"


def status_name(status: int) -> str:
    """Name of a `pb.Status` value, or ``"Status(<n>)"`` when it is unknown."""
    try:
        return pb.Status.Name(status)
    except ValueError:
        return f"Status({status})"


class BrokerError(GazetteError):
    """An RPC answered with a non-OK `Status`."""

    STATUS: ClassVar[int | None] = None

    def __init__(self, status: int, detail: str = "", header: pb.Header | None = None) -> None:
        self.status = int(status)
        self.status_name = status_name(self.status)
        self.detail = detail
        self.header = header
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.detail:
            return f"{self.status_name}: {self.detail}"
        return self.status_name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_broker_error, (self.status, self.detail, self.header))


def _rebuild_broker_error(status: int, detail: str, header: pb.Header | None) -> BrokerError:
    return error_for_status(status, detail, header)


_BY_STATUS: dict[int, type[BrokerError]] = {}


def _status_class(status_key: str) -> Any:
    """Register a BrokerError subclass for the named status (if the stubs know it)."""

    def register(cls: type[BrokerError]) -> type[BrokerError]:
        value = pb.Status.Value(status_key)
        cls.STATUS = value
        _BY_STATUS[value] = cls
        return cls

    return register


class _Bound(BrokerError):
    """A BrokerError subclass whose status is fixed by the class."""

    def __init__(
        self, status: int | None = None, detail: str = "", header: pb.Header | None = None
    ) -> None:
        if status is None:
            assert self.STATUS is not None
            status = self.STATUS
        super().__init__(status, detail, header)


@_status_class("JOURNAL_NOT_FOUND")
class JournalNotFound(_Bound):
    """The named journal does not exist."""


@_status_class("NO_JOURNAL_PRIMARY_BROKER")
class NoJournalPrimaryBroker(_Bound):
    """The journal has no primary broker at the moment (transient)."""


@_status_class("NOT_JOURNAL_PRIMARY_BROKER")
class NotJournalPrimaryBroker(_Bound):
    """The responding broker is not the journal's primary."""


@_status_class("INSUFFICIENT_JOURNAL_BROKERS")
class InsufficientJournalBrokers(_Bound):
    """Fewer brokers are assigned than the journal's replication requires."""


@_status_class("NOT_JOURNAL_BROKER")
class NotJournalBroker(_Bound):
    """The responding broker is not assigned to the journal."""


@_status_class("OFFSET_NOT_YET_AVAILABLE")
class OffsetNotYetAvailable(_Bound):
    """A non-blocking read asked for an offset that is not readable yet."""


@_status_class("WRONG_ROUTE")
class WrongRoute(_Bound):
    """A replication peer disagrees with the route of the request."""


@_status_class("PROPOSAL_MISMATCH")
class ProposalMismatch(_Bound):
    """A replication peer disagrees with the proposed fragment or registers."""


@_status_class("ETCD_TRANSACTION_FAILED")
class EtcdTransactionFailed(_Bound):
    """A coordination-store transaction failed (e.g. a stale expect_mod_revision)."""


@_status_class("NOT_ALLOWED")
class NotAllowed(_Bound):
    """The journal's flags forbid the operation."""


@_status_class("WRONG_APPEND_OFFSET")
class WrongAppendOffset(_Bound):
    """The append's offset precondition is not the journal's write head."""


@_status_class("INDEX_HAS_GREATER_OFFSET")
class IndexHasGreaterOffset(_Bound):
    """The fragment index knows a larger offset than the replication pipeline."""


@_status_class("REGISTER_MISMATCH")
class RegisterMismatch(_Bound):
    """The append's check_registers selector did not match the registers."""


@_status_class("SUSPENDED")
class Suspended(_Bound):
    """The journal is suspended (and has no readable content)."""


@_status_class("FRAGMENT_STORE_UNHEALTHY")
class FragmentStoreUnhealthy(_Bound):
    """A fragment store the operation depends on is failing its health checks."""


def error_for_status(status: int, detail: str = "", header: pb.Header | None = None) -> BrokerError:
    """Build the exception for a non-OK status (a plain BrokerError if unknown)."""
    cls = _BY_STATUS.get(int(status))
    if cls is None:
        return BrokerError(status, detail, header)
    return cls(int(status), detail, header)


def raise_for_status(response: Any, detail: str = "") -> None:
    """Raise the matching BrokerError unless `response.status` is OK.

    The response's header is attached when it has one. With no `detail`,
    a FRAGMENT_STORE_UNHEALTHY response's `store_health_error` is used.
    """
    status = int(response.status)
    if status == pb.OK:
        return
    header: pb.Header | None = None
    try:
        if response.HasField("header"):
            header = response.header
    except (ValueError, AttributeError):
        header = None
    if not detail:
        detail = str(getattr(response, "store_health_error", "") or "")
    raise error_for_status(status, detail, header)
