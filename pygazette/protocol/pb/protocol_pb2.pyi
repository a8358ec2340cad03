import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Status]
    JOURNAL_NOT_FOUND: _ClassVar[Status]
    NO_JOURNAL_PRIMARY_BROKER: _ClassVar[Status]
    NOT_JOURNAL_PRIMARY_BROKER: _ClassVar[Status]
    INSUFFICIENT_JOURNAL_BROKERS: _ClassVar[Status]
    NOT_JOURNAL_BROKER: _ClassVar[Status]
    OFFSET_NOT_YET_AVAILABLE: _ClassVar[Status]
    WRONG_ROUTE: _ClassVar[Status]
    PROPOSAL_MISMATCH: _ClassVar[Status]
    ETCD_TRANSACTION_FAILED: _ClassVar[Status]
    NOT_ALLOWED: _ClassVar[Status]
    WRONG_APPEND_OFFSET: _ClassVar[Status]
    INDEX_HAS_GREATER_OFFSET: _ClassVar[Status]
    REGISTER_MISMATCH: _ClassVar[Status]
    SUSPENDED: _ClassVar[Status]
    FRAGMENT_STORE_UNHEALTHY: _ClassVar[Status]

class CompressionCodec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INVALID: _ClassVar[CompressionCodec]
    NONE: _ClassVar[CompressionCodec]
    GZIP: _ClassVar[CompressionCodec]
    ZSTANDARD: _ClassVar[CompressionCodec]
    SNAPPY: _ClassVar[CompressionCodec]
    GZIP_OFFLOAD_DECOMPRESSION: _ClassVar[CompressionCodec]
OK: Status
JOURNAL_NOT_FOUND: Status
NO_JOURNAL_PRIMARY_BROKER: Status
NOT_JOURNAL_PRIMARY_BROKER: Status
INSUFFICIENT_JOURNAL_BROKERS: Status
NOT_JOURNAL_BROKER: Status
OFFSET_NOT_YET_AVAILABLE: Status
WRONG_ROUTE: Status
PROPOSAL_MISMATCH: Status
ETCD_TRANSACTION_FAILED: Status
NOT_ALLOWED: Status
WRONG_APPEND_OFFSET: Status
INDEX_HAS_GREATER_OFFSET: Status
REGISTER_MISMATCH: Status
SUSPENDED: Status
FRAGMENT_STORE_UNHEALTHY: Status
INVALID: CompressionCodec
NONE: CompressionCodec
GZIP: CompressionCodec
ZSTANDARD: CompressionCodec
SNAPPY: CompressionCodec
GZIP_OFFLOAD_DECOMPRESSION: CompressionCodec

class Label(_message.Message):
    __slots__ = ("name", "value", "prefix")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    prefix: bool
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ..., prefix: _Optional[bool] = ...) -> None: ...

class LabelSet(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    def __init__(self, labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ...) -> None: ...

class LabelSelector(_message.Message):
    __slots__ = ("include", "exclude")
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    include: LabelSet
    exclude: LabelSet
    def __init__(self, include: _Optional[_Union[LabelSet, _Mapping]] = ..., exclude: _Optional[_Union[LabelSet, _Mapping]] = ...) -> None: ...

class JournalSpec(_message.Message):
    __slots__ = ("name", "replication", "labels", "fragment", "flags", "max_append_rate", "suspend")
    class Flag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NOT_SPECIFIED: _ClassVar[JournalSpec.Flag]
        O_RDONLY: _ClassVar[JournalSpec.Flag]
        O_WRONLY: _ClassVar[JournalSpec.Flag]
        O_RDWR: _ClassVar[JournalSpec.Flag]
    NOT_SPECIFIED: JournalSpec.Flag
    O_RDONLY: JournalSpec.Flag
    O_WRONLY: JournalSpec.Flag
    O_RDWR: JournalSpec.Flag
    class Fragment(_message.Message):
        __slots__ = ("length", "compression_codec", "stores", "refresh_interval", "retention", "flush_interval", "path_postfix_template")
        LENGTH_FIELD_NUMBER: _ClassVar[int]
        COMPRESSION_CODEC_FIELD_NUMBER: _ClassVar[int]
        STORES_FIELD_NUMBER: _ClassVar[int]
        REFRESH_INTERVAL_FIELD_NUMBER: _ClassVar[int]
        RETENTION_FIELD_NUMBER: _ClassVar[int]
        FLUSH_INTERVAL_FIELD_NUMBER: _ClassVar[int]
        PATH_POSTFIX_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
        length: int
        compression_codec: CompressionCodec
        stores: _containers.RepeatedScalarFieldContainer[str]
        refresh_interval: _duration_pb2.Duration
        retention: _duration_pb2.Duration
        flush_interval: _duration_pb2.Duration
        path_postfix_template: str
        def __init__(self, length: _Optional[int] = ..., compression_codec: _Optional[_Union[CompressionCodec, str]] = ..., stores: _Optional[_Iterable[str]] = ..., refresh_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., retention: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., flush_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., path_postfix_template: _Optional[str] = ...) -> None: ...
    class Suspend(_message.Message):
        __slots__ = ("level", "offset")
        class Level(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            NONE: _ClassVar[JournalSpec.Suspend.Level]
            PARTIAL: _ClassVar[JournalSpec.Suspend.Level]
            FULL: _ClassVar[JournalSpec.Suspend.Level]
        NONE: JournalSpec.Suspend.Level
        PARTIAL: JournalSpec.Suspend.Level
        FULL: JournalSpec.Suspend.Level
        LEVEL_FIELD_NUMBER: _ClassVar[int]
        OFFSET_FIELD_NUMBER: _ClassVar[int]
        level: JournalSpec.Suspend.Level
        offset: int
        def __init__(self, level: _Optional[_Union[JournalSpec.Suspend.Level, str]] = ..., offset: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MAX_APPEND_RATE_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_FIELD_NUMBER: _ClassVar[int]
    name: str
    replication: int
    labels: LabelSet
    fragment: JournalSpec.Fragment
    flags: int
    max_append_rate: int
    suspend: JournalSpec.Suspend
    def __init__(self, name: _Optional[str] = ..., replication: _Optional[int] = ..., labels: _Optional[_Union[LabelSet, _Mapping]] = ..., fragment: _Optional[_Union[JournalSpec.Fragment, _Mapping]] = ..., flags: _Optional[int] = ..., max_append_rate: _Optional[int] = ..., suspend: _Optional[_Union[JournalSpec.Suspend, _Mapping]] = ...) -> None: ...

class ProcessSpec(_message.Message):
    __slots__ = ("id", "endpoint")
    class ID(_message.Message):
        __slots__ = ("zone", "suffix")
        ZONE_FIELD_NUMBER: _ClassVar[int]
        SUFFIX_FIELD_NUMBER: _ClassVar[int]
        zone: str
        suffix: str
        def __init__(self, zone: _Optional[str] = ..., suffix: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    id: ProcessSpec.ID
    endpoint: str
    def __init__(self, id: _Optional[_Union[ProcessSpec.ID, _Mapping]] = ..., endpoint: _Optional[str] = ...) -> None: ...

class BrokerSpec(_message.Message):
    __slots__ = ("process_spec", "journal_limit", "exiting")
    PROCESS_SPEC_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_LIMIT_FIELD_NUMBER: _ClassVar[int]
    EXITING_FIELD_NUMBER: _ClassVar[int]
    process_spec: ProcessSpec
    journal_limit: int
    exiting: bool
    def __init__(self, process_spec: _Optional[_Union[ProcessSpec, _Mapping]] = ..., journal_limit: _Optional[int] = ..., exiting: _Optional[bool] = ...) -> None: ...

class Fragment(_message.Message):
    __slots__ = ("journal", "begin", "end", "sum", "compression_codec", "backing_store", "mod_time", "path_postfix")
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_CODEC_FIELD_NUMBER: _ClassVar[int]
    BACKING_STORE_FIELD_NUMBER: _ClassVar[int]
    MOD_TIME_FIELD_NUMBER: _ClassVar[int]
    PATH_POSTFIX_FIELD_NUMBER: _ClassVar[int]
    journal: str
    begin: int
    end: int
    sum: SHA1Sum
    compression_codec: CompressionCodec
    backing_store: str
    mod_time: int
    path_postfix: str
    def __init__(self, journal: _Optional[str] = ..., begin: _Optional[int] = ..., end: _Optional[int] = ..., sum: _Optional[_Union[SHA1Sum, _Mapping]] = ..., compression_codec: _Optional[_Union[CompressionCodec, str]] = ..., backing_store: _Optional[str] = ..., mod_time: _Optional[int] = ..., path_postfix: _Optional[str] = ...) -> None: ...

class SHA1Sum(_message.Message):
    __slots__ = ("part1", "part2", "part3")
    PART1_FIELD_NUMBER: _ClassVar[int]
    PART2_FIELD_NUMBER: _ClassVar[int]
    PART3_FIELD_NUMBER: _ClassVar[int]
    part1: int
    part2: int
    part3: int
    def __init__(self, part1: _Optional[int] = ..., part2: _Optional[int] = ..., part3: _Optional[int] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("header", "journal", "offset", "block", "do_not_proxy", "metadata_only", "end_offset", "begin_mod_time")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    DO_NOT_PROXY_FIELD_NUMBER: _ClassVar[int]
    METADATA_ONLY_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BEGIN_MOD_TIME_FIELD_NUMBER: _ClassVar[int]
    header: Header
    journal: str
    offset: int
    block: bool
    do_not_proxy: bool
    metadata_only: bool
    end_offset: int
    begin_mod_time: int
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., journal: _Optional[str] = ..., offset: _Optional[int] = ..., block: _Optional[bool] = ..., do_not_proxy: _Optional[bool] = ..., metadata_only: _Optional[bool] = ..., end_offset: _Optional[int] = ..., begin_mod_time: _Optional[int] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("status", "header", "offset", "write_head", "fragment", "fragment_url", "content")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    WRITE_HEAD_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_URL_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    status: Status
    header: Header
    offset: int
    write_head: int
    fragment: Fragment
    fragment_url: str
    content: bytes
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[Header, _Mapping]] = ..., offset: _Optional[int] = ..., write_head: _Optional[int] = ..., fragment: _Optional[_Union[Fragment, _Mapping]] = ..., fragment_url: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("header", "journal", "do_not_proxy", "offset", "check_registers", "union_registers", "subtract_registers", "suspend", "content")
    class Suspend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SUSPEND_RESUME: _ClassVar[AppendRequest.Suspend]
        SUSPEND_NO_RESUME: _ClassVar[AppendRequest.Suspend]
        SUSPEND_IF_FLUSHED: _ClassVar[AppendRequest.Suspend]
        SUSPEND_NOW: _ClassVar[AppendRequest.Suspend]
    SUSPEND_RESUME: AppendRequest.Suspend
    SUSPEND_NO_RESUME: AppendRequest.Suspend
    SUSPEND_IF_FLUSHED: AppendRequest.Suspend
    SUSPEND_NOW: AppendRequest.Suspend
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    DO_NOT_PROXY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHECK_REGISTERS_FIELD_NUMBER: _ClassVar[int]
    UNION_REGISTERS_FIELD_NUMBER: _ClassVar[int]
    SUBTRACT_REGISTERS_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    header: Header
    journal: str
    do_not_proxy: bool
    offset: int
    check_registers: LabelSelector
    union_registers: LabelSet
    subtract_registers: LabelSet
    suspend: AppendRequest.Suspend
    content: bytes
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., journal: _Optional[str] = ..., do_not_proxy: _Optional[bool] = ..., offset: _Optional[int] = ..., check_registers: _Optional[_Union[LabelSelector, _Mapping]] = ..., union_registers: _Optional[_Union[LabelSet, _Mapping]] = ..., subtract_registers: _Optional[_Union[LabelSet, _Mapping]] = ..., suspend: _Optional[_Union[AppendRequest.Suspend, str]] = ..., content: _Optional[bytes] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("status", "header", "commit", "registers", "total_chunks", "delayed_chunks", "store_health_error")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    REGISTERS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DELAYED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    STORE_HEALTH_ERROR_FIELD_NUMBER: _ClassVar[int]
    status: Status
    header: Header
    commit: Fragment
    registers: LabelSet
    total_chunks: int
    delayed_chunks: int
    store_health_error: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[Header, _Mapping]] = ..., commit: _Optional[_Union[Fragment, _Mapping]] = ..., registers: _Optional[_Union[LabelSet, _Mapping]] = ..., total_chunks: _Optional[int] = ..., delayed_chunks: _Optional[int] = ..., store_health_error: _Optional[str] = ...) -> None: ...

class ReplicateRequest(_message.Message):
    __slots__ = ("header", "proposal", "registers", "acknowledge", "deprecated_journal", "content", "content_delta")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_FIELD_NUMBER: _ClassVar[int]
    REGISTERS_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGE_FIELD_NUMBER: _ClassVar[int]
    DEPRECATED_JOURNAL_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_DELTA_FIELD_NUMBER: _ClassVar[int]
    header: Header
    proposal: Fragment
    registers: LabelSet
    acknowledge: bool
    deprecated_journal: str
    content: bytes
    content_delta: int
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., proposal: _Optional[_Union[Fragment, _Mapping]] = ..., registers: _Optional[_Union[LabelSet, _Mapping]] = ..., acknowledge: _Optional[bool] = ..., deprecated_journal: _Optional[str] = ..., content: _Optional[bytes] = ..., content_delta: _Optional[int] = ...) -> None: ...

class ReplicateResponse(_message.Message):
    __slots__ = ("status", "header", "fragment", "registers")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    REGISTERS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    header: Header
    fragment: Fragment
    registers: LabelSet
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[Header, _Mapping]] = ..., fragment: _Optional[_Union[Fragment, _Mapping]] = ..., registers: _Optional[_Union[LabelSet, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("selector", "page_limit", "page_token", "watch", "watch_resume")
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PAGE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WATCH_FIELD_NUMBER: _ClassVar[int]
    WATCH_RESUME_FIELD_NUMBER: _ClassVar[int]
    selector: LabelSelector
    page_limit: int
    page_token: str
    watch: bool
    watch_resume: Header
    def __init__(self, selector: _Optional[_Union[LabelSelector, _Mapping]] = ..., page_limit: _Optional[int] = ..., page_token: _Optional[str] = ..., watch: _Optional[bool] = ..., watch_resume: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("status", "header", "journals", "next_page_token")
    class Journal(_message.Message):
        __slots__ = ("spec", "mod_revision", "route", "create_revision")
        SPEC_FIELD_NUMBER: _ClassVar[int]
        MOD_REVISION_FIELD_NUMBER: _ClassVar[int]
        ROUTE_FIELD_NUMBER: _ClassVar[int]
        CREATE_REVISION_FIELD_NUMBER: _ClassVar[int]
        spec: JournalSpec
        mod_revision: int
        route: Route
        create_revision: int
        def __init__(self, spec: _Optional[_Union[JournalSpec, _Mapping]] = ..., mod_revision: _Optional[int] = ..., route: _Optional[_Union[Route, _Mapping]] = ..., create_revision: _Optional[int] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOURNALS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    status: Status
    header: Header
    journals: _containers.RepeatedCompositeFieldContainer[ListResponse.Journal]
    next_page_token: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[Header, _Mapping]] = ..., journals: _Optional[_Iterable[_Union[ListResponse.Journal, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ApplyRequest(_message.Message):
    __slots__ = ("changes",)
    class Change(_message.Message):
        __slots__ = ("expect_mod_revision", "upsert", "delete")
        EXPECT_MOD_REVISION_FIELD_NUMBER: _ClassVar[int]
        UPSERT_FIELD_NUMBER: _ClassVar[int]
        DELETE_FIELD_NUMBER: _ClassVar[int]
        expect_mod_revision: int
        upsert: JournalSpec
        delete: str
        def __init__(self, expect_mod_revision: _Optional[int] = ..., upsert: _Optional[_Union[JournalSpec, _Mapping]] = ..., delete: _Optional[str] = ...) -> None: ...
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[ApplyRequest.Change]
    def __init__(self, changes: _Optional[_Iterable[_Union[ApplyRequest.Change, _Mapping]]] = ...) -> None: ...

class ApplyResponse(_message.Message):
    __slots__ = ("status", "header")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    status: Status
    header: Header
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...

class FragmentsRequest(_message.Message):
    __slots__ = ("header", "journal", "begin_mod_time", "end_mod_time", "next_page_token", "page_limit", "signatureTTL", "do_not_proxy")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    BEGIN_MOD_TIME_FIELD_NUMBER: _ClassVar[int]
    END_MOD_TIME_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PAGE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURETTL_FIELD_NUMBER: _ClassVar[int]
    DO_NOT_PROXY_FIELD_NUMBER: _ClassVar[int]
    header: Header
    journal: str
    begin_mod_time: int
    end_mod_time: int
    next_page_token: int
    page_limit: int
    signatureTTL: _duration_pb2.Duration
    do_not_proxy: bool
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., journal: _Optional[str] = ..., begin_mod_time: _Optional[int] = ..., end_mod_time: _Optional[int] = ..., next_page_token: _Optional[int] = ..., page_limit: _Optional[int] = ..., signatureTTL: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., do_not_proxy: _Optional[bool] = ...) -> None: ...

class FragmentsResponse(_message.Message):
    __slots__ = ("status", "header", "fragments", "next_page_token")
    class _Fragment(_message.Message):
        __slots__ = ("spec", "signed_url")
        SPEC_FIELD_NUMBER: _ClassVar[int]
        SIGNED_URL_FIELD_NUMBER: _ClassVar[int]
        spec: Fragment
        signed_url: str
        def __init__(self, spec: _Optional[_Union[Fragment, _Mapping]] = ..., signed_url: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    status: Status
    header: Header
    fragments: _containers.RepeatedCompositeFieldContainer[FragmentsResponse._Fragment]
    next_page_token: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[Header, _Mapping]] = ..., fragments: _Optional[_Iterable[_Union[FragmentsResponse._Fragment, _Mapping]]] = ..., next_page_token: _Optional[int] = ...) -> None: ...

class Route(_message.Message):
    __slots__ = ("members", "primary", "endpoints")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[ProcessSpec.ID]
    primary: int
    endpoints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, members: _Optional[_Iterable[_Union[ProcessSpec.ID, _Mapping]]] = ..., primary: _Optional[int] = ..., endpoints: _Optional[_Iterable[str]] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("process_id", "route", "etcd")
    class Etcd(_message.Message):
        __slots__ = ("cluster_id", "member_id", "revision", "raft_term")
        CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
        MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
        REVISION_FIELD_NUMBER: _ClassVar[int]
        RAFT_TERM_FIELD_NUMBER: _ClassVar[int]
        cluster_id: int
        member_id: int
        revision: int
        raft_term: int
        def __init__(self, cluster_id: _Optional[int] = ..., member_id: _Optional[int] = ..., revision: _Optional[int] = ..., raft_term: _Optional[int] = ...) -> None: ...
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    ETCD_FIELD_NUMBER: _ClassVar[int]
    process_id: ProcessSpec.ID
    route: Route
    etcd: Header.Etcd
    def __init__(self, process_id: _Optional[_Union[ProcessSpec.ID, _Mapping]] = ..., route: _Optional[_Union[Route, _Mapping]] = ..., etcd: _Optional[_Union[Header.Etcd, _Mapping]] = ...) -> None: ...

class FragmentStoreHealthRequest(_message.Message):
    __slots__ = ("fragment_store",)
    FRAGMENT_STORE_FIELD_NUMBER: _ClassVar[int]
    fragment_store: str
    def __init__(self, fragment_store: _Optional[str] = ...) -> None: ...

class FragmentStoreHealthResponse(_message.Message):
    __slots__ = ("status", "header", "store_health_error")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    STORE_HEALTH_ERROR_FIELD_NUMBER: _ClassVar[int]
    status: Status
    header: Header
    store_health_error: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[Header, _Mapping]] = ..., store_health_error: _Optional[str] = ...) -> None: ...
