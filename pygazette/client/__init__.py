"""The pygazette broker client: async core (`JournalClient`, `Reader`, `RetryReader`,
`Appender`, listing and apply helpers, direct fragment reads) and a synchronous facade
(`SyncJournalClient`) over the same implementation.

The client talks to brokers only over Gazette's gRPC protocol, so it works against pygazette
and Gazette brokers alike.
"""

from pygazette.client.appender import CHUNK_SIZE, Appender, ChunkCoalescer, append
from pygazette.client.errors import (
    ClientError,
    CorruptFragment,
    DidNotReadExpectedEOF,
    FragmentOpenError,
    FragmentReadError,
    OffsetJump,
    ProtocolViolation,
    ReaderCancelled,
    UnexpectedFragmentEOF,
)
from pygazette.client.fragment_reader import FragmentReader, new_fragment_reader, open_fragment_url
from pygazette.client.fragments import list_all_fragments, list_all_fragments_response
from pygazette.client.journal_client import (
    BROKER_ADDRESS_ENV,
    DEFAULT_BROKER,
    JournalClient,
    broker_address_from_env,
    is_unavailable,
)
from pygazette.client.list_apply import (
    apply_journals,
    apply_journals_in_batches,
    as_selector,
    get_journal,
    get_journal_entry,
    list_all,
    list_journals,
)
from pygazette.client.reader import Reader, read_request
from pygazette.client.retry_reader import RetryReader, read_journal
from pygazette.client.sync_client import SyncAppender, SyncJournalClient

__all__ = [
    "BROKER_ADDRESS_ENV",
    "CHUNK_SIZE",
    "DEFAULT_BROKER",
    "Appender",
    "ChunkCoalescer",
    "ClientError",
    "CorruptFragment",
    "DidNotReadExpectedEOF",
    "FragmentOpenError",
    "FragmentReadError",
    "FragmentReader",
    "JournalClient",
    "OffsetJump",
    "ProtocolViolation",
    "Reader",
    "ReaderCancelled",
    "RetryReader",
    "SyncAppender",
    "SyncJournalClient",
    "UnexpectedFragmentEOF",
    "append",
    "apply_journals",
    "apply_journals_in_batches",
    "as_selector",
    "broker_address_from_env",
    "get_journal",
    "get_journal_entry",
    "is_unavailable",
    "list_all",
    "list_all_fragments",
    "list_all_fragments_response",
    "list_journals",
    "new_fragment_reader",
    "open_fragment_url",
    "read_journal",
    "read_request",
]
