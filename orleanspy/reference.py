"""Grain references (proxies) and the ``CallInvoker`` seam they call through.

A proxy turns ``await ref.add(1)`` into ``invoker.invoke(grain_id, "add", ...)``.
Both the silo (for calls made inside it and by ``silo.client``) and the
``ClusterClient`` implement ``CallInvoker``, so proxies work the same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar, cast, overload

from orleanspy.errors import GrainMethodNotFoundError
from orleanspy.grain import Grain, GrainDefinition, definition_of, registered_definitions
from orleanspy.identity import GrainId, GrainKey

__all__ = ["CallInvoker", "GrainFactory", "GrainReference", "make_reference"]

G = TypeVar("G", bound=Grain)


class CallInvoker(Protocol):
    """Sends a grain call and returns its result (or raises its error)."""

    async def invoke(
        self,
        grain_id: GrainId,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        one_way: bool = False,
    ) -> Any:
        """Call ``method`` on the grain ``grain_id``.

        Raises the grain's exception (same type where safe, else
        ``RemoteGrainError``), ``GrainCallTimeoutError`` after the response
        timeout, ``GrainMethodNotFoundError`` / ``UnknownGrainTypeError`` for
        calls the target cannot take. A one-way call returns ``None`` once sent.
        """
        ...


class GrainReference:
    """A proxy for one grain. Attribute access yields awaitable callables for the
    grain's public ``async def`` methods; anything else raises
    ``GrainMethodNotFoundError`` (an ``AttributeError``). Without a known
    definition (an untyped reference to a class this process never imported),
    any public name is sent and the silo validates it."""

    __slots__ = ("_definition", "_grain_id", "_invoker")

    def __init__(
        self, invoker: CallInvoker, grain_id: GrainId, definition: GrainDefinition | None
    ) -> None:
        self._invoker = invoker
        self._grain_id = grain_id
        self._definition = definition

    @property
    def grain_id(self) -> GrainId:
        return self._grain_id

    def __orleanspy_grain_id__(self) -> tuple[GrainId, str | None]:
        return self._grain_id, None

    def __getattr__(self, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        if name.startswith("_"):
            raise GrainMethodNotFoundError(
                f"{self._grain_id}: {name!r} is private; only public async methods are callable"
            )
        defn = self._definition
        one_way = False
        if defn is not None:
            info = defn.methods.get(name)
            if info is None:
                raise GrainMethodNotFoundError(
                    f"{defn.type_name} has no callable method {name!r} "
                    f"(callable: {', '.join(sorted(defn.methods)) or 'none'})"
                )
            one_way = info.one_way
        invoker, gid = self._invoker, self._grain_id

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await invoker.invoke(gid, name, args, kwargs, one_way=one_way)

        call.__name__ = name
        return call

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GrainReference) and other._grain_id == self._grain_id

    def __hash__(self) -> int:
        return hash(self._grain_id)

    def __repr__(self) -> str:
        return f"<GrainReference {self._grain_id}>"


def make_reference(invoker: CallInvoker, grain_id: GrainId) -> GrainReference:
    """A reference for ``grain_id``, typed by its registered class when known."""
    definition = registered_definitions().get(grain_id.type_name)
    if definition is None:
        return GrainReference(invoker, grain_id, None)
    return _proxy_class(definition)(invoker, grain_id, definition)


# One proxy class per grain class, built on first use: its methods are real
# attributes, so a call is a plain method lookup, not ``__getattr__`` and a new
# closure each time.
_proxy_classes: dict[type[Grain], type[GrainReference]] = {}


def _proxy_class(definition: GrainDefinition) -> type[GrainReference]:
    cls = _proxy_classes.get(definition.cls)
    if cls is None:
        methods: dict[str, Any] = {"__slots__": ()}
        for name, info in definition.methods.items():
            # Names the reference itself defines (``grain_id``) keep their meaning.
            if not hasattr(GrainReference, name):
                methods[name] = _proxy_method(name, info.one_way)
        cls = type(f"{definition.type_name}Reference", (GrainReference,), methods)
        _proxy_classes[definition.cls] = cls
    return cls


def _proxy_method(name: str, one_way: bool) -> Callable[..., Coroutine[Any, Any, Any]]:
    # A plain function returning the invoker's coroutine: awaiting it is the
    # call, without one more coroutine frame per call.
    if one_way:

        def call(self: GrainReference, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
            return self._invoker.invoke(self._grain_id, name, args, kwargs, one_way=True)

    else:
        # No keyword (``one_way`` defaults to False): that spares the invoker's
        # keyword handling on every call.
        def call(self: GrainReference, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
            return self._invoker.invoke(self._grain_id, name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    return call


class GrainFactory:
    """``get_grain`` for a given invoker: the part of a client users touch."""

    __slots__ = ("_invoker",)

    def __init__(self, invoker: CallInvoker) -> None:
        self._invoker = invoker

    @overload
    def get_grain(self, grain: type[G], key: GrainKey) -> G: ...
    @overload
    def get_grain(self, grain: str, key: GrainKey) -> Any: ...
    def get_grain(self, grain: type[G] | str, key: GrainKey) -> Any:
        """A proxy for the grain ``(grain, key)``.

        ``grain`` is a grain class (the proxy is typed as that class, so IDEs
        complete its methods) or a registered type name (untyped).
        """
        if isinstance(grain, str):
            gid = GrainId(grain, key)
            return make_reference(self._invoker, gid)
        defn = definition_of(grain)
        proxy = _proxy_class(defn)(self._invoker, GrainId(defn.type_name, key), defn)
        return cast(G, proxy)

    def reference(self, grain_id: GrainId, _interface: str | None = None) -> GrainReference:
        """A reference for a grain id (used to decode references off the wire)."""
        return make_reference(self._invoker, grain_id)
