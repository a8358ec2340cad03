from pygazette.protocol.pb import protocol_pb2 as _protocol_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PruneRequest(_message.Message):
    __slots__ = ("journal", "dry_run", "header")
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    journal: str
    dry_run: bool
    header: _protocol_pb2.Header
    def __init__(self, journal: _Optional[str] = ..., dry_run: _Optional[bool] = ..., header: _Optional[_Union[_protocol_pb2.Header, _Mapping]] = ...) -> None: ...

class PruneResponse(_message.Message):
    __slots__ = ("status", "header", "removed", "kept", "errors")
    class Kept(_message.Message):
        __slots__ = ("fragment", "reason")
        FRAGMENT_FIELD_NUMBER: _ClassVar[int]
        REASON_FIELD_NUMBER: _ClassVar[int]
        fragment: _protocol_pb2.Fragment
        reason: str
        def __init__(self, fragment: _Optional[_Union[_protocol_pb2.Fragment, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    status: _protocol_pb2.Status
    header: _protocol_pb2.Header
    removed: _containers.RepeatedCompositeFieldContainer[_protocol_pb2.Fragment]
    kept: _containers.RepeatedCompositeFieldContainer[PruneResponse.Kept]
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[_Union[_protocol_pb2.Status, str]] = ..., header: _Optional[_Union[_protocol_pb2.Header, _Mapping]] = ..., removed: _Optional[_Iterable[_Union[_protocol_pb2.Fragment, _Mapping]]] = ..., kept: _Optional[_Iterable[_Union[PruneResponse.Kept, _Mapping]]] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...
