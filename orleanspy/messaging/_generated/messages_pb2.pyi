from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST: _ClassVar[Kind]
    RESPONSE: _ClassVar[Kind]
    ONE_WAY: _ClassVar[Kind]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Status]
    ERROR: _ClassVar[Status]
    REJECTED: _ClassVar[Status]
REQUEST: Kind
RESPONSE: Kind
ONE_WAY: Kind
OK: Status
ERROR: Status
REJECTED: Status

class Envelope(_message.Message):
    __slots__ = ("id", "kind", "grain_type", "s", "i", "uuid", "method", "sender_silo", "sender_client", "target_silo", "correlation_id", "expires_at_ms", "forward_count", "status", "body", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GRAIN_TYPE_FIELD_NUMBER: _ClassVar[int]
    S_FIELD_NUMBER: _ClassVar[int]
    I_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    SENDER_SILO_FIELD_NUMBER: _ClassVar[int]
    SENDER_CLIENT_FIELD_NUMBER: _ClassVar[int]
    TARGET_SILO_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    id: int
    kind: Kind
    grain_type: str
    s: str
    i: int
    uuid: bytes
    method: str
    sender_silo: str
    sender_client: str
    target_silo: str
    correlation_id: int
    expires_at_ms: int
    forward_count: int
    status: Status
    body: bytes
    headers: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[int] = ..., kind: _Optional[_Union[Kind, str]] = ..., grain_type: _Optional[str] = ..., s: _Optional[str] = ..., i: _Optional[int] = ..., uuid: _Optional[bytes] = ..., method: _Optional[str] = ..., sender_silo: _Optional[str] = ..., sender_client: _Optional[str] = ..., target_silo: _Optional[str] = ..., correlation_id: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., forward_count: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., body: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Envelope]
    def __init__(self, messages: _Optional[_Iterable[_Union[Envelope, _Mapping]]] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ("table_version",)
    FROM_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    table_version: int
    def __init__(self, table_version: _Optional[int] = ..., **kwargs) -> None: ...

class PingReply(_message.Message):
    __slots__ = ("silo",)
    SILO_FIELD_NUMBER: _ClassVar[int]
    silo: str
    def __init__(self, silo: _Optional[str] = ...) -> None: ...
