"""The wire codec: msgpack plus a few extension types. The only msgpack importer.

What travels: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, lists,
tuples (arrive as lists), dicts, and these extension types:

====  =====================================================================
code  type
====  =====================================================================
1     ``GrainId``
2     a grain reference (anything with ``__orleanspy_grain_id__``); decoded
      through the codec's ``reference_factory`` into a live proxy
3     ``datetime`` (naive, fixed offset, or ``zoneinfo.ZoneInfo`` zone)
4     ``timedelta``
5     ``uuid.UUID``
6     a dataclass registered with ``register_type`` (fields by name)
7     ``set`` or ``frozenset`` (its items, each any type here; they must be
      hashable once decoded, else the value is refused)
====  =====================================================================

A set arrives as a set, a frozenset as a frozenset. Anything else raises ``SerializationError``
naming the type and how to make it travel. Pickle is never used: bytes from the
network can only build the types above.

Decoding is bounded (``DecodeLimits``): container nesting per msgpack document,
extension nesting (a registered dataclass inside a dataclass, which decodes
through a nested ``unpackb``, so each level costs C stack), container sizes and
string, binary and extension lengths. Bytes that break a limit raise
``SerializationError`` like any other garbage, so a hostile body fails its own
call and never the process.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import msgpack

from orleanspy.errors import SerializationError
from orleanspy.identity import GrainId

__all__ = ["Codec", "DecodeLimits", "pack", "pack_lua", "register_type", "unpack"]

_T = TypeVar("_T")

_EXT_GRAIN_ID = 1
_EXT_GRAIN_REF = 2
_EXT_DATETIME = 3
_EXT_TIMEDELTA = 4
_EXT_UUID = 5
_EXT_DATACLASS = 6
_EXT_SET = 7

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_US = timedelta(microseconds=1)

# Every byte that can open a msgpack container (fixmap, fixarray, array16/32,
# map16/32). Counting them in a body bounds its nesting depth from above at C
# speed, so the exact (Python) depth walk runs only for bodies that could be deep.
_CONTAINER_BYTES = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_NOT_CONTAINER = bytes(b for b in range(256) if b not in _CONTAINER_BYTES)


@dataclasses.dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Bounds on what decoding one body may build (see the module docstring).

    ``max_depth``: containers nested in one msgpack document (the body, or one
    extension's payload). ``max_ext_depth``: extension values nested in one
    another. ``max_container_len``: items of one list or map. ``max_str_len`` /
    ``max_bin_len`` / ``max_ext_len``: bytes of one string, binary or extension
    payload. Together they bound the total nesting by
    ``max_depth * (max_ext_depth + 1)``.
    """

    max_depth: int = 100
    max_ext_depth: int = 16
    max_container_len: int = 1_000_000
    max_str_len: int = 4 * 1024 * 1024
    max_bin_len: int = 4 * 1024 * 1024
    max_ext_len: int = 4 * 1024 * 1024

    @classmethod
    def of(cls, options: Any) -> DecodeLimits:
        """The limits a ``MessagingOptions`` sets."""
        longest = options.max_string_length or options.max_message_size
        return cls(
            max_depth=options.max_nesting_depth,
            max_ext_depth=options.max_extension_depth,
            max_container_len=options.max_container_length,
            max_str_len=longest,
            max_bin_len=longest,
            max_ext_len=longest,
        )


_registry: dict[str, type[Any]] = {}
_names: dict[type[Any], str] = {}
#: Per registered class: each field's name and its scalar default (else _NO_DEFAULT).
_fields: dict[type[Any], tuple[tuple[str, Any], ...]] = {}
#: Per registered class: the fields its constructor takes.
_init_names: dict[type[Any], frozenset[str]] = {}
_NO_DEFAULT: Any = object()
# Defaults compared by value to leave a field off the wire; other defaults (and
# default factories) always travel.
_SCALAR_DEFAULTS = frozenset({type(None), bool, int, float, str})


def register_type(cls: type[_T] | None = None, *, name: str | None = None) -> Any:
    """Let a dataclass travel in grain calls. Usable as ``@register_type`` or a call.

    ``name`` (default ``module.QualName``) is what the wire carries; both sides must
    register the class under the same name. Fields travel by name, and a field
    whose value is its declared default (a scalar: ``None``, a bool, a number, a
    string) does not travel at all; a receiver drops fields its class does not
    have. So adding a field with a default stays compatible both ways: an older
    receiver never sees the field until a sender sets it, and a newer one takes
    the default from a sender that does not know it. A field whose name starts
    with an underscore never travels (the receiver gets its default).
    """

    def apply(c: type[_T]) -> type[_T]:
        if not dataclasses.is_dataclass(c):
            raise SerializationError(f"register_type needs a dataclass, got {c!r}")
        key = name or f"{c.__module__}.{c.__qualname__}"
        existing = _registry.get(key)
        if existing is not None and existing is not c and existing.__qualname__ != c.__qualname__:
            raise SerializationError(f"type name {key!r} is already registered for {existing!r}")
        _registry[key] = c
        _names[c] = key
        _fields[c] = tuple(
            (f.name, f.default if type(f.default) in _SCALAR_DEFAULTS else _NO_DEFAULT)
            for f in dataclasses.fields(c)
            # A field named with a leading underscore is the process's own (it
            # must have a default): it never travels.
            if not f.name.startswith("_")
        )
        _init_names[c] = frozenset(f.name for f in dataclasses.fields(c) if f.init)
        return c

    return apply(cls) if cls is not None else apply


def is_registered(cls: type[Any]) -> bool:
    """Whether ``cls`` was registered with ``register_type`` (so it can travel)."""
    return cls in _names


def pack_lua(value: Any) -> bytes:
    """Plain msgpack (no extension types) for a Redis script's ``cmsgpack.unpack``:
    bytes as the old raw type (Lua's cmsgpack has no bin types), so they arrive
    in Lua as strings."""
    packed: bytes = msgpack.packb(value, use_bin_type=False)
    return packed


def _packb(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, default=_default, use_bin_type=True, datetime=False)
    return data


def _encode_datetime(value: datetime) -> bytes:
    tz = value.tzinfo
    if tz is None:
        return _packb([0, (value - _EPOCH_NAIVE) // _US])
    micros = (value - _EPOCH) // _US
    if isinstance(tz, ZoneInfo):
        return _packb([2, micros, tz.key])
    offset = value.utcoffset() or timedelta(0)
    return _packb([1, micros, offset // _US])


def _decode_datetime(data: bytes) -> datetime:
    parts: list[Any] = msgpack.unpackb(data)
    kind: int = parts[0]
    micros: int = parts[1]
    if kind == 0:
        return _EPOCH_NAIVE + micros * _US
    utc = _EPOCH + micros * _US
    if kind == 2:
        return utc.astimezone(ZoneInfo(str(parts[2])))
    offset = int(parts[2]) * _US
    return utc.astimezone(UTC if not offset else timezone(offset))


class Codec:
    """Encodes and decodes values; one per silo or client.

    ``reference_factory(grain_id, interface)`` turns a decoded grain reference into
    a proxy bound to the receiving side's runtime; without one, references
    decode to their ``GrainId``. ``limits`` bound what ``decode`` builds.
    """

    __slots__ = ("_ext_depth", "_limits", "_packer", "_packing", "_reference_factory")

    def __init__(
        self,
        reference_factory: Callable[[GrainId, str | None], Any] | None = None,
        limits: DecodeLimits | None = None,
    ):
        self._reference_factory = reference_factory
        self._limits = limits or DecodeLimits()
        self._ext_depth = 0
        # One packer reused for every top-level encode (``msgpack.packb`` builds
        # a new one per call, which costs more than packing a small call). It
        # is not re-entrant, so a nested encode (one from inside the default
        # hook) packs with a fresh one. A codec belongs to one event loop (one thread).
        self._packer = msgpack.Packer(default=_default, use_bin_type=True, datetime=False)
        self._packing = False

    def encode(self, value: Any) -> bytes:
        """``value`` as bytes, or ``SerializationError`` naming what cannot travel."""
        if self._packing:
            return _encode(_packb, value)
        self._packing = True
        try:
            return _encode(self._packer.pack, value)
        finally:
            self._packing = False

    def decode(self, data: bytes) -> Any:
        """The value ``encode`` produced, or ``SerializationError`` for bad bytes
        or bytes that break the codec's ``DecodeLimits``."""
        self._ext_depth = 0
        try:
            return self._unpack(data)
        except SerializationError:
            raise
        except RecursionError as exc:
            raise SerializationError(
                f"cannot deserialize {len(data)} bytes: nested too deeply"
            ) from exc
        except Exception as exc:  # msgpack raises a zoo of types on garbage
            raise SerializationError(f"cannot deserialize {len(data)} bytes: {exc}") from exc

    def _unpack(self, data: bytes) -> Any:
        limits = self._limits
        value = msgpack.unpackb(
            data,
            ext_hook=self._ext_hook,
            raw=False,
            strict_map_key=False,
            use_list=True,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_container_len,
            max_map_len=limits.max_container_len,
            max_ext_len=limits.max_ext_len,
        )
        # Depth can exceed the limit only if the body has more container bytes
        # (so only if it is longer than the limit, too).
        if (
            len(data) > limits.max_depth
            and len(data.translate(None, _NOT_CONTAINER)) > limits.max_depth
        ):
            _check_depth(value, limits.max_depth)
        return value

    def _ext_hook(self, code: int, data: bytes) -> Any:
        if code == _EXT_GRAIN_ID:
            return GrainId.parse(data.decode())
        if code == _EXT_GRAIN_REF:
            canonical, interface = msgpack.unpackb(data)
            gid = GrainId.parse(canonical)
            if self._reference_factory is None:
                return gid
            return self._reference_factory(gid, interface)
        if code == _EXT_DATETIME:
            return _decode_datetime(data)
        if code == _EXT_TIMEDELTA:
            return int.from_bytes(data, "big", signed=True) * _US
        if code == _EXT_UUID:
            return uuid.UUID(bytes=data)
        if code == _EXT_SET:
            frozen, items = self._nested(data)
            if not isinstance(items, list):
                raise SerializationError("malformed set extension value")
            try:
                return frozenset(items) if frozen else set(items)
            except TypeError as exc:
                raise SerializationError(f"a set item is not hashable: {exc}") from None
        if code == _EXT_DATACLASS:
            name, fields = self._nested(data)
            if not isinstance(name, str) or not isinstance(fields, dict):
                raise SerializationError("malformed dataclass extension value")
            cls = _registry.get(name)
            if cls is None:
                raise SerializationError(
                    f"unknown type {name!r}: register it with orleanspy.register_type on this side"
                )
            known = _init_names[cls]
            if not known.issuperset(fields):
                # A newer sender's fields: dropped, so that adding a field stays
                # compatible with receivers of the release before.
                fields = {k: v for k, v in fields.items() if k in known}
            try:
                return cls(**fields)
            except TypeError as exc:
                raise SerializationError(f"a {name} value does not decode: {exc}") from None
        raise SerializationError(f"unknown msgpack extension type {code}")

    def _nested(self, data: bytes) -> Any:
        """Decode an extension value's own msgpack document. Each level is a nested
        unpackb, i.e. C stack: bounded before recursing."""
        if self._ext_depth >= self._limits.max_ext_depth:
            raise SerializationError(
                f"extension values nested more than {self._limits.max_ext_depth} deep"
            )
        self._ext_depth += 1
        try:
            return self._unpack(data)
        finally:
            self._ext_depth -= 1


def _check_depth(value: Any, max_depth: int) -> None:
    """``SerializationError`` if lists/maps in ``value`` nest deeper than ``max_depth``
    (iterative: a deep value must not exhaust the stack while being measured)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        if depth > max_depth:
            raise SerializationError(f"containers nested more than {max_depth} deep")
        stack.extend((child, depth) for child in children if isinstance(child, (list, dict)))


def _default(value: Any) -> Any:
    if isinstance(value, GrainId):
        return msgpack.ExtType(_EXT_GRAIN_ID, value.canonical.encode())
    ref = getattr(type(value), "__orleanspy_grain_id__", None)
    if ref is not None:
        gid, interface = value.__orleanspy_grain_id__()
        return msgpack.ExtType(_EXT_GRAIN_REF, _packb([gid.canonical, interface]))
    if isinstance(value, datetime):
        return msgpack.ExtType(_EXT_DATETIME, _encode_datetime(value))
    if isinstance(value, timedelta):
        micros = value // _US
        return msgpack.ExtType(_EXT_TIMEDELTA, micros.to_bytes(9, "big", signed=True))
    if isinstance(value, uuid.UUID):
        return msgpack.ExtType(_EXT_UUID, value.bytes)
    name = _names.get(type(value))
    if name is not None:
        fields = {}
        for field_name, default in _fields[type(value)]:
            item = getattr(value, field_name)
            # A scalar at its default stays home (its type too: True is not 1).
            if item is default or (
                default is not _NO_DEFAULT and type(item) is type(default) and item == default
            ):
                continue
            fields[field_name] = item
        return msgpack.ExtType(
            _EXT_DATACLASS,
            _packb([name, fields]),
        )
    if isinstance(value, (set, frozenset)):
        return msgpack.ExtType(_EXT_SET, _packb([isinstance(value, frozenset), list(value)]))
    hint = (
        " (decorate the dataclass with @orleanspy.register_type)"
        if dataclasses.is_dataclass(value)
        else ""
    )
    raise SerializationError(
        f"cannot serialize object of type {type(value).__module__}.{type(value).__qualname__}"
        f"{hint}; grain arguments and results must be msgpack types, GrainId, grain "
        "references, datetime, timedelta, UUID or registered dataclasses"
    )


_plain = Codec()


def pack(value: Any) -> bytes:
    """Encode with no reference factory (storage rows, tests); safe from any thread."""
    return _encode(_packb, value)


def _encode(packer: Callable[[Any], bytes], value: Any) -> bytes:
    try:
        return packer(value)
    except SerializationError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(f"cannot serialize value: {exc}") from exc


def unpack(data: bytes) -> Any:
    """Decode with a codec that has no reference factory."""
    return _plain.decode(data)
