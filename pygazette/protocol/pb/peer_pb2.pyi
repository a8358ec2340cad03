from pygazette.protocol.pb import protocol_pb2 as _protocol_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WholeAppend(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[_protocol_pb2.AppendRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[_protocol_pb2.AppendRequest, _Mapping]]] = ...) -> None: ...

class WholeReplicate(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[_protocol_pb2.ReplicateRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[_protocol_pb2.ReplicateRequest, _Mapping]]] = ...) -> None: ...

class WholeReplicateResponse(_message.Message):
    __slots__ = ("responses", "refused")
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[_protocol_pb2.ReplicateResponse]
    refused: str
    def __init__(self, responses: _Optional[_Iterable[_Union[_protocol_pb2.ReplicateResponse, _Mapping]]] = ..., refused: _Optional[str] = ...) -> None: ...
