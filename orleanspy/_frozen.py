"""Fast construction of frozen, slotted dataclasses on the reminder tick path.

A frozen dataclass's generated ``__init__`` stores every field through
``object.__setattr__`` (its own ``__setattr__`` refuses), several times the cost
of a plain assignment: on CPython 3.11 a ``TickStatus`` (12 fields) took
1.7-4 us to build, a slotted class with a plain ``__init__`` 0.4 us, and a tick
builds a ``TickStatus``, a ``TickPlan``, a ``ScheduleUpdate`` and a
``FireRecord``. A slotted class keeps each field in a member descriptor whose
``__set__`` stores the value directly, which is where ``object.__setattr__``
ends up. ``maker(cls)`` returns a function with the parameters of ``cls``'s
``__init__`` (names, order, defaults) that builds the instance through those
descriptors: equal to, hashed and printed like one the class builds.

It does not run ``__post_init__``: a caller passes values that need no
conversion or check (an enum member where the class would convert a string).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["maker"]

T = TypeVar("T")


def maker(cls: type[T]) -> Callable[..., T]:
    """A constructor for the frozen, slotted dataclass ``cls`` (module docstring).

    Raises ``TypeError`` for a class that is not one, or with a field that has a
    default factory or is keyword-only (the tick path's classes have neither).
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in vars(cls):
        raise TypeError(f"{cls.__qualname__} is not a frozen dataclass with slots")
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    signature, body = [], []
    for i, f in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
        if f.default_factory is not dataclasses.MISSING or f.kw_only:
            raise TypeError(f"{cls.__qualname__}.{f.name}: default factories and keyword-only")
        if f.default is dataclasses.MISSING:
            signature.append(f.name)
        else:
            namespace[f"_d{i}"] = f.default
            signature.append(f"{f.name}=_d{i}")
        namespace[f"_s{i}"] = vars(cls)[f.name].__set__
        body.append(f"    _s{i}(o, {f.name})")
    source = f"def make({', '.join(signature)}):\n    o = _new(_cls)\n" + "\n".join(body)
    exec(source + "\n    return o\n", namespace)
    make: Callable[..., T] = namespace["make"]
    make.__qualname__ = make.__name__ = f"make_{cls.__name__}"
    make.__doc__ = f"Build a {cls.__qualname__} without its frozen __init__ (orleanspy._frozen)."
    return make
