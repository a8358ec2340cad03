"""The connector's options: parsed and validated once, on the driver, into frozen dataclasses.

Option names are case-insensitive (Spark hands them over lower-cased). A misspelt or unknown
option, a malformed value, or a combination that cannot work is an `OptionError` naming
the option, raised before any job runs.
"""

from __future__ import annotations

import difflib
import json
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pygazette.auth.configured import authorizer_from
from pygazette.auth.tls import ClientTLS, TLSConfigError, check_client
from pygazette.client.channel import channel_target
from pygazette.client.journal_client import broker_address_from_env
from pygazette.message.csv_framing import CSVFraming
from pygazette.message.json_framing import JSONFraming
from pygazette.protocol.errors import GazetteError, ValidationError
from pygazette.protocol.selector import format_selector, parse_selector
from pygazette.protocol.validation import validate_journal_name
from pygazette.spark.framing import Framing
from pygazette.spark.read_committed import DEFAULT_WAIT_SECONDS, CommittedReads
from pygazette.spark.runtime import BrokerAuth, BrokerTarget

EARLIEST = -2
LATEST = -1

# Options Spark itself passes to sources and sinks; accepted and ignored.
_SPARK_OPTIONS = frozenset({"checkpointlocation"})

# TLS towards "https://" brokers: the CA to trust, and a client certificate and key (mTLS).
TLS_OPTIONS = ("tlsCAFile", "tlsCertFile", "tlsKeyFile")
# Authorization of every broker RPC, as the CLI's --auth-keys / --auth-token.
AUTH_OPTIONS = ("authKeys", "authToken")

READ_OPTIONS = (
    "broker",
    "journals",
    "selector",
    "framing",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "maxBytesPerTrigger",
    "maxRecordsPerTrigger",
    "failOnDataLoss",
    "minPartitions",
    "fileRoot",
    "readCommitted",
    "uuidField",
    "readCommittedWaitSeconds",
    "readCommittedOnTimeout",
    *TLS_OPTIONS,
    *AUTH_OPTIONS,
)
WRITE_OPTIONS = (
    "broker",
    "journal",
    "journals",
    "selector",
    "framing",
    "keyColumn",
    "partitioner",
    "writerId",
    *TLS_OPTIONS,
    *AUTH_OPTIONS,
)


_READ_ONLY = {n.lower(): n for n in READ_OPTIONS if n not in WRITE_OPTIONS}
_WRITE_ONLY = {n.lower(): n for n in WRITE_OPTIONS if n not in READ_OPTIONS}


class OptionError(GazetteError, ValueError):
    """An option of the gazette data source is missing, unknown or malformed."""


@dataclass(frozen=True)
class OffsetSpec:
    """Where to start or end: earliest, latest, or per-journal offsets (EARLIEST/LATEST
    allowed as values); journals not named use `default`."""

    default: int
    per_journal: tuple[tuple[str, int], ...] = ()

    def for_journal(self, journal: str) -> int:
        for name, offset in self.per_journal:
            if name == journal:
                return offset
        return self.default

    @property
    def journals(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.per_journal)


@dataclass(frozen=True)
class ReadOptions:
    broker: str
    journals: tuple[str, ...]
    selector: str  # Canonical selector text, or "" when `journals` names the journals.
    framing: Framing
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp_ms: int | None
    max_bytes_per_trigger: int | None
    max_records_per_trigger: int | None
    fail_on_data_loss: bool
    min_partitions: int | None
    # The brokers' file store root as mounted on executors: `file://` fragment URLs (signed
    # relative to it, as Gazette signs them) are read directly under it. None: through brokers.
    file_root: str | None = None
    tls: ClientTLS | None = None  # tlsCAFile, tlsCertFile, tlsKeyFile.
    auth: BrokerAuth = field(default_factory=lambda: BrokerAuth(), repr=False)
    # readCommitted: rows of committed messages only (`pygazette.spark.read_committed`), whose
    # UUID is JSON field `uuid_field` (matched as Go matches field names) or a CSV record's
    # first column; a stream waits up to `read_committed_wait_seconds` for a decision, then
    # fails, or with `read_committed_skip_open` leaves the open transactions out.
    read_committed: bool = False
    uuid_field: str = "uuid"
    read_committed_wait_seconds: float = DEFAULT_WAIT_SECONDS
    read_committed_skip_open: bool = False

    @property
    def target(self) -> BrokerTarget:
        """The broker with its TLS material, as `runtime` calls take it."""
        return BrokerTarget(self.broker, self.tls, self.auth)

    def check_selected(self, journals: Iterable[str]) -> None:
        """With a selector: its offsets name only `journals`, those it matches (with option
        journals, that was checked as the options were parsed)."""
        if self.selector:
            journals = list(journals)
            matched = f"{len(journals)} journal(s)"
            check_offsets_read(
                self.starting,
                self.ending,
                journals,
                f"option selector {self.selector} matches {matched}",
            )

    def committed_reads(self, *, streaming: bool) -> CommittedReads | None:
        """How partitions read committed messages (None: every record is a row)."""
        if not self.read_committed:
            return None
        framing = JSONFraming(self.uuid_field) if self.framing is Framing.JSON else CSVFraming()
        return CommittedReads(
            framing,
            streaming,
            self.read_committed_wait_seconds,
            skip_open=self.read_committed_skip_open,
        )


@dataclass(frozen=True)
class WriteOptions:
    broker: str
    journal: str | None  # A fixed target journal (overrides a `journal` column).
    journals: tuple[str, ...]  # Journals to map keys over ...
    selector: str  # ... or a selector of them.
    framing: Framing | None  # None: `lines` when there is a `value` column, else `json`.
    key_column: str | None
    partitioner: str  # "modulo" | "rendezvous"
    writer_id: str | None
    checkpoint_location: str | None = field(default=None)
    tls: ClientTLS | None = None  # tlsCAFile, tlsCertFile, tlsKeyFile.
    auth: BrokerAuth = field(default_factory=lambda: BrokerAuth(), repr=False)

    @property
    def target(self) -> BrokerTarget:
        """The broker with its TLS material, as `runtime` calls take it."""
        return BrokerTarget(self.broker, self.tls, self.auth)


def _lookup(options: Mapping[str, str], known: tuple[str, ...]) -> dict[str, str]:
    """Options by their canonical names; unknown ones are an error."""
    canonical = {name.lower(): name for name in known}
    out: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower in canonical:
            out[canonical[lower]] = str(value)
        elif lower not in _SPARK_OPTIONS:
            if lower == "path":
                raise OptionError(
                    "the gazette data source takes no path: name journals with the "
                    "'journals' or 'selector' option"
                )
            if known is WRITE_OPTIONS and lower in _READ_ONLY:
                raise OptionError(f"option {_READ_ONLY[lower]} applies to reads, not to writes")
            if known is READ_OPTIONS and lower in _WRITE_ONLY:
                raise OptionError(f"option {_WRITE_ONLY[lower]} applies to writes, not to reads")
            close = difflib.get_close_matches(lower, list(canonical), n=1)
            hint = f"did you mean {canonical[close[0]]}? " if close else ""
            raise OptionError(
                f"unknown option {key!r} of the gazette data source "
                f"({hint}valid options: {', '.join(known)})"
            )
    return out


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"option {name} must be a positive integer, not {text!r}") from None
    if value <= 0:
        raise OptionError(f"option {name} must be a positive integer, not {text!r}")
    return value


def _bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name} must be true or false, not {text!r}")


def _broker(opts: dict[str, str]) -> str:
    broker = opts.get("broker", "").strip() or broker_address_from_env()
    try:
        channel_target(broker)
    except ValueError as exc:
        raise OptionError(f"option broker: {exc}") from None
    return broker


def _tls(opts: dict[str, str], broker: str) -> ClientTLS | None:
    """The TLS options, their files checked here on the driver (executors read them again:
    the paths must be valid there too)."""
    ca, cert, key = (opts.get(name, "").strip() or None for name in TLS_OPTIONS)
    if cert is None and key is None and ca is None:
        return None
    if not channel_target(broker)[1]:
        raise OptionError(
            f"options {'/'.join(TLS_OPTIONS)} need an https:// broker, not {broker!r}"
        )
    tls = ClientTLS(ca_file=ca, cert_file=cert, key_file=key)
    try:
        check_client(tls)
    except TLSConfigError as exc:
        raise OptionError(f"TLS options: {exc}") from None
    return tls


def _auth(opts: dict[str, str]) -> BrokerAuth:
    """The authKeys / authToken options, the keys checked here on the driver."""
    auth = BrokerAuth(opts.get("authKeys", "").strip(), opts.get("authToken", "").strip())
    try:
        authorizer_from(auth.keys, auth.token)
    except ValueError as exc:
        raise OptionError(f"option authKeys: {exc}") from None
    return auth


def _journal_name(option: str, name: str) -> str:
    name = name.strip()
    try:
        validate_journal_name(name, allow_meta=False)
    except ValidationError as exc:
        raise OptionError(f"option {option}: invalid journal name {name!r}: {exc}") from None
    return name


def _journal_list(option: str, text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise OptionError(f"option {option} names no journals")
    out = tuple(sorted({_journal_name(option, n) for n in names}))
    return out


def _selector(text: str) -> str:
    try:
        sel = parse_selector(text.strip())
    except ValidationError as exc:
        raise OptionError(f"option selector: {exc}") from None
    canonical = format_selector(sel)
    if not canonical:
        raise OptionError("option selector is empty (it would select every journal)")
    return canonical


def _file_root(text: str) -> str:
    """An absolute directory path (executors run in directories of Spark's choosing)."""
    root = text.strip()
    if not root or "\x00" in root or not posixpath.isabs(root):
        raise OptionError(
            f"option fileRoot must be the absolute path of the brokers' file store root "
            f"(their --file-root) as executors see it, not {text!r}"
        )
    return posixpath.normpath(root)


def _framing(text: str) -> Framing:
    try:
        return Framing.parse(text)
    except ValueError as exc:
        raise OptionError(f"option framing: {exc}") from None


def parse_offset_spec(name: str, text: str) -> OffsetSpec:
    """`earliest`, `latest`, or JSON {"journal": offset} with -2 / -1 for earliest / latest."""
    value = text.strip()
    if value.lower() == "earliest":
        return OffsetSpec(EARLIEST)
    if value.lower() == "latest":
        return OffsetSpec(LATEST)
    try:
        doc = json.loads(value)
    except ValueError:
        raise OptionError(
            f'option {name} must be earliest, latest or JSON like {{"journal/name": 1234}}, '
            f"not {text!r}"
        ) from None
    if not isinstance(doc, dict) or not doc:
        raise OptionError(f"option {name}: expected a non-empty JSON object of journal offsets")
    pairs: list[tuple[str, int]] = []
    for journal, offset in doc.items():
        journal = _journal_name(name, journal)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
            raise OptionError(
                f"option {name}: offset of {journal} must be an integer >= 0, "
                f"or -2 (earliest) / -1 (latest), not {offset!r}"
            )
        pairs.append((journal, offset))
    return OffsetSpec(LATEST if name == "endingOffsets" else EARLIEST, tuple(sorted(pairs)))


def check_offsets_read(
    starting: OffsetSpec, ending: OffsetSpec, journals: Iterable[str], read_by: str
) -> None:
    """Offsets may name only journals that are read: a misspelt name would leave its journal
    at the default offset, silently (`read_by` says which journals are read)."""
    read = set(journals)
    for name, spec in (("startingOffsets", starting), ("endingOffsets", ending)):
        unknown = sorted(set(spec.journals) - read)
        if unknown:
            raise OptionError(
                f"{name} names journals that are not read: {', '.join(unknown)} ({read_by})"
            )


def parse_read_options(options: Mapping[str, str], *, streaming: bool | None) -> ReadOptions:
    """Read options of a batch read, a stream, or (`streaming` None) either: the checks and
    defaults that differ between them are then left out."""
    opts = _lookup(options, READ_OPTIONS)
    journals: tuple[str, ...] = ()
    selector = ""
    if "journals" in opts and "selector" in opts:
        raise OptionError("set either option journals or option selector, not both")
    if "journals" in opts:
        journals = _journal_list("journals", opts["journals"])
    elif "selector" in opts:
        selector = _selector(opts["selector"])
    else:
        raise OptionError(
            "name the journals to read with option journals (comma-separated names) "
            "or option selector (a label selector)"
        )

    framing = _framing(opts.get("framing", "raw"))

    if "startingOffsets" in opts and "startingTimestamp" in opts:
        raise OptionError("set either option startingOffsets or startingTimestamp, not both")
    starting = parse_offset_spec("startingOffsets", opts.get("startingOffsets", "earliest"))
    if streaming and "startingOffsets" not in opts and "startingTimestamp" not in opts:
        starting = OffsetSpec(LATEST)  # As Spark's Kafka source: streams start at the end.
    ending = parse_offset_spec("endingOffsets", opts.get("endingOffsets", "latest"))
    if streaming and "endingOffsets" in opts:
        raise OptionError("option endingOffsets applies to batch reads only, not to streams")
    if streaming is False:
        if starting.default == LATEST or LATEST in dict(starting.per_journal).values():
            raise OptionError("startingOffsets cannot be latest in a batch read (nothing to read)")
        if ending.default == EARLIEST or EARLIEST in dict(ending.per_journal).values():
            raise OptionError("endingOffsets cannot be earliest in a batch read (nothing to read)")

    starting_timestamp: int | None = None
    if "startingTimestamp" in opts:
        text = opts["startingTimestamp"].strip()
        try:
            starting_timestamp = int(text)
        except ValueError:
            raise OptionError(
                f"option startingTimestamp must be milliseconds since the Unix epoch, not {text!r}"
            ) from None
        if starting_timestamp < 0:
            raise OptionError(f"option startingTimestamp must not be negative ({text})")

    max_bytes = max_records = None
    if "maxBytesPerTrigger" in opts:
        max_bytes = _positive_int("maxBytesPerTrigger", opts["maxBytesPerTrigger"])
    if "maxRecordsPerTrigger" in opts:
        max_records = _positive_int("maxRecordsPerTrigger", opts["maxRecordsPerTrigger"])
    if streaming is False and (max_bytes or max_records):
        raise OptionError("maxBytesPerTrigger and maxRecordsPerTrigger apply to streams only")

    min_partitions = None
    if "minPartitions" in opts:
        min_partitions = _positive_int("minPartitions", opts["minPartitions"])

    if journals:
        check_offsets_read(starting, ending, journals, f"option journals is {','.join(journals)}")

    read_committed = _bool("readCommitted", opts.get("readCommitted", "false"))
    if read_committed and framing not in (Framing.JSON, Framing.CSV):
        raise OptionError(
            f"option readCommitted needs messages with UUIDs: framing json or csv, not "
            f"{framing.value}"
        )
    if "uuidField" in opts:
        if not read_committed or framing is not Framing.JSON:
            raise OptionError(
                "option uuidField names the JSON field of a message's UUID: it applies to "
                "readCommitted reads of framing json"
            )
        if not opts["uuidField"].strip():
            raise OptionError("option uuidField must not be empty")
    wait_seconds = DEFAULT_WAIT_SECONDS
    if "readCommittedWaitSeconds" in opts:
        if not read_committed or streaming is False:
            raise OptionError("option readCommittedWaitSeconds applies to readCommitted streams")
        text = opts["readCommittedWaitSeconds"].strip()
        try:
            wait_seconds = float(text)
        except ValueError:
            wait_seconds = -1.0
        if not 0 < wait_seconds < float("inf"):
            raise OptionError(
                f"option readCommittedWaitSeconds must be a positive number of seconds, "
                f"not {text!r}"
            )
    skip_open = False
    if "readCommittedOnTimeout" in opts:
        if not read_committed or streaming is False:
            raise OptionError("option readCommittedOnTimeout applies to readCommitted streams")
        action = opts["readCommittedOnTimeout"].strip().lower()
        if action not in ("fail", "skip"):
            raise OptionError(
                f"option readCommittedOnTimeout is fail (the default) or skip, not "
                f"{opts['readCommittedOnTimeout']!r}"
            )
        skip_open = action == "skip"

    broker = _broker(opts)
    return ReadOptions(
        read_committed=read_committed,
        uuid_field=opts.get("uuidField", "uuid").strip(),
        read_committed_wait_seconds=wait_seconds,
        read_committed_skip_open=skip_open,
        broker=broker,
        journals=journals,
        selector=selector,
        framing=framing,
        starting=starting,
        ending=ending,
        starting_timestamp_ms=starting_timestamp,
        max_bytes_per_trigger=max_bytes,
        max_records_per_trigger=max_records,
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failOnDataLoss", "true")),
        min_partitions=min_partitions,
        file_root=_file_root(opts["fileRoot"]) if "fileRoot" in opts else None,
        tls=_tls(opts, broker),
        auth=_auth(opts),
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    opts = _lookup(options, WRITE_OPTIONS)
    journal = _journal_name("journal", opts["journal"]) if "journal" in opts else None
    journals: tuple[str, ...] = ()
    selector = ""
    if "journals" in opts and "selector" in opts:
        raise OptionError("set either option journals or option selector, not both")
    if "journals" in opts:
        journals = _journal_list("journals", opts["journals"])
    if "selector" in opts:
        selector = _selector(opts["selector"])
    if journal is not None and (journals or selector):
        raise OptionError(
            "option journal names the one journal to write; it excludes options journals "
            "and selector (which map rows over several journals by keyColumn)"
        )
    if len(journals) == 1 and "keyColumn" not in opts:
        journal, journals = journals[0], ()

    key_column = opts.get("keyColumn", "").strip() or None
    if (journals or selector) and key_column is None:
        raise OptionError(
            "writing over several journals (option journals or selector) needs option "
            "keyColumn, the column whose value maps each row to a journal"
        )
    if key_column is not None and not (journals or selector):
        raise OptionError("option keyColumn needs option journals or selector to map over")

    partitioner = opts.get("partitioner", "modulo").strip().lower()
    if partitioner not in ("modulo", "rendezvous"):
        raise OptionError(
            f"option partitioner must be modulo or rendezvous, not {opts['partitioner']!r}"
        )

    framing = _framing(opts["framing"]) if "framing" in opts else None

    writer_id = opts["writerId"].strip() if "writerId" in opts else None
    if writer_id == "":
        # Not the default identity: a re-run would not recognise the rows this run wrote.
        raise OptionError("option writerId is empty (leave it out for the default identity)")
    if writer_id is not None and (len(writer_id) > 256 or not writer_id.isprintable()):
        raise OptionError("option writerId must be printable text of at most 256 characters")

    checkpoint = None
    for key, value in options.items():
        if key.lower() == "checkpointlocation":
            checkpoint = str(value)
    broker = _broker(opts)
    return WriteOptions(
        broker=broker,
        journal=journal,
        journals=journals,
        selector=selector,
        framing=framing,
        key_column=key_column,
        partitioner=partitioner,
        writer_id=writer_id,
        checkpoint_location=checkpoint,
        tls=_tls(opts, broker),
        auth=_auth(opts),
    )
