"""Which call arguments may reach a local activation without being copied.

A call normally copies its arguments through the codec (msgpack), so a grain
never shares a mutable object with its caller, wherever it lives. That copy is
pure cost for values nobody can change; as Orleans does for immutable types,
such arguments are handed over as they are when the target is local:

- the codec's scalars: ``None``, ``bool``, ``int`` (and ``IntEnum`` members),
  ``float``, ``str``, ``bytes``, ``datetime``, ``timedelta``, ``UUID``, ``GrainId``;
- frozen dataclasses registered with ``register_type`` (``TickStatus`` is one)
  whose field values are themselves immutable;
- tuples of immutable values.

Anything else (lists, dicts, sets, mutable dataclasses, grain references) is
still copied. Two visible differences remain, both harmless for an immutable
value: a tuple argument arrives as the same tuple (through the codec it would
arrive as a list), and an ``IntEnum`` member stays a member.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Final
from zoneinfo import ZoneInfo

from orleanspy.identity import GrainId
from orleanspy.serialization import is_registered

__all__ = ["INT_END", "INT_MIN", "SCALARS", "all_immutable", "result_immutable"]

#: Types whose every value is immutable and carried by the codec (``int`` aside:
#: only ``INT_MIN <= value < INT_END`` is). Public for the local-call fast path,
#: which decides the common arguments and results without a call.
SCALARS: Final = frozenset({type(None), bool, float, str, bytes, timedelta, uuid.UUID, GrainId})
#: The tz kinds the codec can carry (a datetime with another tzinfo must fail as it would).
_ZONES: Final = frozenset({type(None), timezone, ZoneInfo})
#: msgpack's integer range: a bigger int must fail as it would through the codec.
INT_MIN: Final = -(1 << 63)
INT_END: Final = 1 << 64
#: Per class: the field names of an eligible frozen dataclass, or None.
_FROZEN: dict[type[Any], tuple[str, ...] | None] = {}
#: Nesting deeper than this is copied rather than inspected.
_MAX_DEPTH: Final = 4


def _frozen_fields(cls: type[Any]) -> tuple[str, ...] | None:
    try:
        return _FROZEN[cls]
    except KeyError:
        pass
    fields: tuple[str, ...] | None = None
    params = getattr(cls, "__dataclass_params__", None)
    if params is not None and params.frozen and is_registered(cls):
        fields = tuple(f.name for f in dataclasses.fields(cls))
    _FROZEN[cls] = fields
    return fields


def _immutable(value: Any, depth: int) -> bool:
    cls = type(value)
    if cls in SCALARS:
        return True
    if cls is int:
        return bool(INT_MIN <= value < INT_END)
    if cls is datetime:
        return type(value.tzinfo) in _ZONES
    if depth >= _MAX_DEPTH:
        return False
    if cls is tuple:
        return all(_immutable(v, depth + 1) for v in value)
    if isinstance(value, enum.IntEnum):
        return bool(INT_MIN <= value < INT_END)
    fields = _frozen_fields(cls)
    if fields is None:
        return False
    return all(_immutable(getattr(value, name), depth + 1) for name in fields)


def all_immutable(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether every positional and keyword argument is immutable (see the module)."""
    # The common arguments (str, in-range int, the other scalars) are decided
    # here without a call: this runs on every local grain call.
    for value in args:
        cls = type(value)
        if cls is str or cls in SCALARS:
            continue
        if cls is int:
            if INT_MIN <= value < INT_END:
                continue
            return False
        if not _immutable(value, 0):
            return False
    return not kwargs or all(_immutable(value, 0) for value in kwargs.values())


def result_immutable(value: Any) -> bool:
    """Whether a call's result may reach a local caller uncopied: immutable, and
    not a tuple (through the codec a tuple arrives as a list, and a result must
    look the same to a local and a remote caller)."""
    cls = type(value)
    if cls is str or cls in SCALARS:
        return True
    if cls is int:
        return bool(INT_MIN <= value < INT_END)
    return cls is not tuple and _immutable(value, 0)
