"""The pygazette broker client: async core (`JournalClient`, `Reader`, `RetryReader`,
`Appender`, `AppendService`, `WatchedList`, listing and apply helpers, direct fragment reads)
and a synchronous facade (`SyncJournalClient`) over the same implementation.

The client talks to brokers only over Gazette's gRPC protocol, so it works against pygazette
and Gazette brokers alike.
"""

from pygazette.client.append_buffer import AppendBuffer, AppendBufferPool
from pygazette.client.append_service import (
    AppendService,
    AppendServiceClosed,
    AppendServiceError,
    AsyncAppend,
    DependencyFailed,
    OpFuture,
    finished_operation,
    is_terminal_append_error,
)
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
from pygazette.client.watched_list import WatchedList

__all__ = [
    "BROKER_ADDRESS_ENV",
    "CHUNK_SIZE",
    "DEFAULT_BROKER",
    "AppendBuffer",
    "AppendBufferPool",
    "AppendService",
    "AppendServiceClosed",
    "AppendServiceError",
    "Appender",
    "AsyncAppend",
    "ChunkCoalescer",
    "ClientError",
    "CorruptFragment",
    "DependencyFailed",
    "DidNotReadExpectedEOF",
    "FragmentOpenError",
    "FragmentReadError",
    "FragmentReader",
    "JournalClient",
    "OffsetJump",
    "OpFuture",
    "ProtocolViolation",
    "Reader",
    "ReaderCancelled",
    "RetryReader",
    "SyncAppender",
    "SyncJournalClient",
    "UnexpectedFragmentEOF",
    "WatchedList",
    "append",
    "apply_journals",
    "apply_journals_in_batches",
    "as_selector",
    "broker_address_from_env",
    "finished_operation",
    "get_journal",
    "get_journal_entry",
    "is_terminal_append_error",
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
