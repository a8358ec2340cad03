"""Exception types of pygazette, and the mapping of broker `Status` codes to them.

Every error pygazette raises on purpose derives from `GazetteError`. Bad input
is a `ValidationError` (also a `ValueError`), whose message is prefixed by the
dotted path of the offending field, as Gazette's own validation errors are.
A non-OK `Status` in an RPC response becomes a `BrokerError` subclass (a `StatusError`
family; the consumer's `ShardError` is another).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

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
    "StatusError",
    "Suspended",
    "ValidationError",
    "WrongAppendOffset",
    "WrongRoute",
    "bind_status",
    "enum_value_name",
    "error_for_status",
    "raise_for_status",
    "status_name",
]


class GazetteError(Exception):
    """Base class of every error raised by pygazette."""


# A validation message quotes the bad value, which may be megabytes of hostile input: past
# this many characters the middle is elided, so that a status's details (sent back as gRPC
# trailing metadata, whose limit is a few KiB at most clients) and log lines stay small.
_MAX_DETAIL = 2048


def _clip(detail: str) -> str:
    if len(detail) <= _MAX_DETAIL:
        return detail
    keep = _MAX_DETAIL // 2
    return f"{detail[:keep]}...({len(detail) - 2 * keep} characters elided)...{detail[-keep:]}"


class ValidationError(GazetteError, ValueError):
    """Input failed validation.

    `context` is the path of the field at fault, outermost first; `detail`
    says what is wrong with it. `str()` joins them as Gazette does:
    ``"Fragment.Journal: invalid length (2; expected 4 <= length <= 512)"``.
    """

    def __init__(self, detail: str, context: list[str] | None = None) -> None:
        detail = _clip(detail)
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


def enum_value_name(enum: Any, value: int) -> str:
    """Name of a value of a protobuf status enum, or ``"Status(<n>)"`` when it is unknown."""
    try:
        return str(enum.Name(value))
    except ValueError:
        return f"Status({value})"


def status_name(status: int) -> str:
    """Name of a `pb.Status` value, or ``"Status(<n>)"`` when it is unknown."""
    return enum_value_name(pb.Status, status)


class StatusError(GazetteError):
    """An RPC answered with a non-OK status.

    Each service's errors are a family: a direct subclass naming the service's status enum
    (`STATUS_ENUM`: `BrokerError` for `protocol.Status`, the consumer's `ShardError` for
    `consumer.Status`), and one subclass per status value, registered with `@bind_status`,
    whose `STATUS` is fixed (so it may be built without one). `for_status` builds the family's
    exception of a status (the family class itself for a status it has no subclass of).
    """

    STATUS_ENUM: ClassVar[Any] = None
    STATUS: ClassVar[int | None] = None
    _family: ClassVar[type[StatusError]]
    _by_status: ClassVar[dict[int, type[StatusError]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "STATUS_ENUM" in cls.__dict__:  # The base class of a family.
            cls._family = cls
            cls._by_status = {}

    def __init__(
        self, status: int | None = None, detail: str = "", header: pb.Header | None = None
    ) -> None:
        if status is None:
            if self.STATUS is None:
                raise TypeError(f"{type(self).__name__} needs a status")
            status = self.STATUS
        self.status = int(status)
        self.status_name = enum_value_name(self.STATUS_ENUM, self.status)
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
        return (self._family.for_status, (self.status, self.detail, self.header))

    @classmethod
    def for_status(
        cls, status: int, detail: str = "", header: pb.Header | None = None
    ) -> StatusError:
        """The family's exception of a non-OK status."""
        sub = cls._by_status.get(int(status), cls._family)
        return sub(int(status), detail, header)

    @classmethod
    def raise_for(cls, response: Any, detail: str = "") -> None:
        """Raise the family's exception of `response.status` unless it is OK, with the
        response's header when it has one."""
        status = int(response.status)
        if status == cls.STATUS_ENUM.Value("OK"):
            return
        header: pb.Header | None = None
        try:
            if response.HasField("header"):
                header = response.header
        except (ValueError, AttributeError):
            header = None
        raise cls.for_status(status, detail, header)


_E = TypeVar("_E", bound=StatusError)


def bind_status(name: str) -> Callable[[type[_E]], type[_E]]:
    """Register a subclass of a StatusError family as the exception of status `name`."""

    def register(cls: type[_E]) -> type[_E]:
        value = int(cls.STATUS_ENUM.Value(name))
        cls.STATUS = value
        cls._by_status[value] = cls
        return cls

    return register


class BrokerError(StatusError):
    """An RPC answered with a non-OK `Status`."""

    STATUS_ENUM = pb.Status


@bind_status("JOURNAL_NOT_FOUND")
class JournalNotFound(BrokerError):
    """The named journal does not exist."""


@bind_status("NO_JOURNAL_PRIMARY_BROKER")
class NoJournalPrimaryBroker(BrokerError):
    """The journal has no primary broker at the moment (transient)."""


@bind_status("NOT_JOURNAL_PRIMARY_BROKER")
class NotJournalPrimaryBroker(BrokerError):
    """The responding broker is not the journal's primary."""


@bind_status("INSUFFICIENT_JOURNAL_BROKERS")
class InsufficientJournalBrokers(BrokerError):
    """Fewer brokers are assigned than the journal's replication requires."""


@bind_status("NOT_JOURNAL_BROKER")
class NotJournalBroker(BrokerError):
    """The responding broker is not assigned to the journal."""


@bind_status("OFFSET_NOT_YET_AVAILABLE")
class OffsetNotYetAvailable(BrokerError):
    """A non-blocking read asked for an offset that is not readable yet."""


@bind_status("WRONG_ROUTE")
class WrongRoute(BrokerError):
    """A replication peer disagrees with the route of the request."""


@bind_status("PROPOSAL_MISMATCH")
class ProposalMismatch(BrokerError):
    """A replication peer disagrees with the proposed fragment or registers."""


@bind_status("ETCD_TRANSACTION_FAILED")
class EtcdTransactionFailed(BrokerError):
    """A coordination-store transaction failed (e.g. a stale expect_mod_revision)."""


@bind_status("NOT_ALLOWED")
class NotAllowed(BrokerError):
    """The journal's flags forbid the operation."""


@bind_status("WRONG_APPEND_OFFSET")
class WrongAppendOffset(BrokerError):
    """The append's offset precondition is not the journal's write head."""


@bind_status("INDEX_HAS_GREATER_OFFSET")
class IndexHasGreaterOffset(BrokerError):
    """The fragment index knows a larger offset than the replication pipeline."""


@bind_status("REGISTER_MISMATCH")
class RegisterMismatch(BrokerError):
    """The append's check_registers selector did not match the registers."""


@bind_status("SUSPENDED")
class Suspended(BrokerError):
    """The journal is suspended (and has no readable content)."""


@bind_status("FRAGMENT_STORE_UNHEALTHY")
class FragmentStoreUnhealthy(BrokerError):
    """A fragment store the operation depends on is failing its health checks."""


def error_for_status(status: int, detail: str = "", header: pb.Header | None = None) -> BrokerError:
    """Build the exception for a non-OK status (a plain BrokerError if unknown)."""
    err = BrokerError.for_status(status, detail, header)
    assert isinstance(err, BrokerError)
    return err


def raise_for_status(response: Any, detail: str = "") -> None:
    """Raise the matching BrokerError unless `response.status` is OK.

    The response's header is attached when it has one. With no `detail`,
    a FRAGMENT_STORE_UNHEALTHY response's `store_health_error` is used.
    """
    if not detail:
        detail = str(getattr(response, "store_health_error", "") or "")
    BrokerError.raise_for(response, detail)
