"""The pygazette broker client: async core (`JournalClient`, `Reader`, `RetryReader`,
`Appender`, `AppendService`, `WatchedList`, listing and apply helpers, direct fragment reads)
and a synchronous facade (`SyncJournalClient`) over the same implementation.

The client talks to brokers only over Gazette's gRPC protocol, so it works against pygazette
and Gazette brokers alike. Every name below is imported from its module on first use, so that
e.g. `pygazette.client.journal_client` alone does not import the append pipeline.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from pygazette.client.defaults import (
        BROKER_ADDRESS_ENV,
        DEFAULT_BROKER,
        broker_address_from_env,
    )
    from pygazette.client.errors import (
        ClientError,
        CorruptFragment,
        DidNotReadExpectedEOF,
        FragmentOpenError,
        FragmentReadError,
        InvalidResponse,
        OffsetJump,
        ProtocolViolation,
        ReaderCancelled,
        UnexpectedFragmentEOF,
    )
    from pygazette.client.fragment_reader import (
        FragmentReader,
        new_fragment_reader,
        open_fragment_url,
    )
    from pygazette.client.fragments import list_all_fragments, list_all_fragments_response
    from pygazette.client.journal_client import JournalClient, is_unavailable
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
    from pygazette.client.sync_client import (
        SyncAppender,
        SyncClientClosed,
        SyncClientForked,
        SyncJournalClient,
    )
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
    "InvalidResponse",
    "JournalClient",
    "OffsetJump",
    "OpFuture",
    "ProtocolViolation",
    "Reader",
    "ReaderCancelled",
    "RetryReader",
    "SyncAppender",
    "SyncClientClosed",
    "SyncClientForked",
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

# Where each exported name is defined. A name's module is imported when the name is first
# used (PEP 562), so importing one module of the package imports no other.
_EXPORTS: dict[str, str] = {
    "AppendBuffer": "pygazette.client.append_buffer",
    "AppendBufferPool": "pygazette.client.append_buffer",
    "AppendService": "pygazette.client.append_service",
    "AppendServiceClosed": "pygazette.client.append_service",
    "AppendServiceError": "pygazette.client.append_service",
    "AsyncAppend": "pygazette.client.append_service",
    "DependencyFailed": "pygazette.client.append_service",
    "OpFuture": "pygazette.client.append_service",
    "finished_operation": "pygazette.client.append_service",
    "is_terminal_append_error": "pygazette.client.append_service",
    "Appender": "pygazette.client.appender",
    "CHUNK_SIZE": "pygazette.client.appender",
    "ChunkCoalescer": "pygazette.client.appender",
    "append": "pygazette.client.appender",
    "ClientError": "pygazette.client.errors",
    "CorruptFragment": "pygazette.client.errors",
    "DidNotReadExpectedEOF": "pygazette.client.errors",
    "FragmentOpenError": "pygazette.client.errors",
    "FragmentReadError": "pygazette.client.errors",
    "InvalidResponse": "pygazette.client.errors",
    "OffsetJump": "pygazette.client.errors",
    "ProtocolViolation": "pygazette.client.errors",
    "ReaderCancelled": "pygazette.client.errors",
    "UnexpectedFragmentEOF": "pygazette.client.errors",
    "BROKER_ADDRESS_ENV": "pygazette.client.defaults",
    "DEFAULT_BROKER": "pygazette.client.defaults",
    "broker_address_from_env": "pygazette.client.defaults",
    "FragmentReader": "pygazette.client.fragment_reader",
    "new_fragment_reader": "pygazette.client.fragment_reader",
    "open_fragment_url": "pygazette.client.fragment_reader",
    "list_all_fragments": "pygazette.client.fragments",
    "list_all_fragments_response": "pygazette.client.fragments",
    "JournalClient": "pygazette.client.journal_client",
    "is_unavailable": "pygazette.client.journal_client",
    "apply_journals": "pygazette.client.list_apply",
    "apply_journals_in_batches": "pygazette.client.list_apply",
    "as_selector": "pygazette.client.list_apply",
    "get_journal": "pygazette.client.list_apply",
    "get_journal_entry": "pygazette.client.list_apply",
    "list_all": "pygazette.client.list_apply",
    "list_journals": "pygazette.client.list_apply",
    "Reader": "pygazette.client.reader",
    "read_request": "pygazette.client.reader",
    "RetryReader": "pygazette.client.retry_reader",
    "read_journal": "pygazette.client.retry_reader",
    "SyncAppender": "pygazette.client.sync_client",
    "SyncClientClosed": "pygazette.client.sync_client",
    "SyncClientForked": "pygazette.client.sync_client",
    "SyncJournalClient": "pygazette.client.sync_client",
    "WatchedList": "pygazette.client.watched_list",
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
