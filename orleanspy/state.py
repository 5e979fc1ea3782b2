"""Grain persistent state: the ``persistent_state`` descriptor and what grains hold.

::

    @dataclass
    class Profile:
        name: str = ""
        plan: str = "free"

    class Account(Grain):
        profile = persistent_state(Profile, storage="default")

        async def set_plan(self, plan: str) -> None:
            self.profile.state.plan = plan
            await self.profile.write()

When the runtime activates a grain it loads every declared state before the
grain's ``__init__`` and ``on_activate`` run; a state with nothing stored starts
as ``Profile()``. ``write``, ``read`` and ``clear`` store, reload and remove it;
``etag`` is the stored version (``None`` when nothing is stored) and ``exists``
whether something is stored.

Optimistic concurrency: every write and clear carries the etag this activation
last read or wrote. If the store holds another one (a second activation of the
grain wrote in between), the write changes nothing and raises
``InconsistentStateError``; when that escapes a grain call the activation is
deactivated, so the next call reloads the state.

Stored form: one format-version byte, then msgpack through the project's codec.
A dataclass state is stored as a map of its fields by name, so a later release
can add fields (they take their defaults when an older record is loaded) or
remove them (stored values of removed fields are ignored). Nested dataclasses
travel as ``register_type`` values. Bytes that do not decode raise
``StorageError`` naming the grain and the state.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, overload

from orleanspy.errors import (
    ConfigurationError,
    InconsistentStateError,
    SerializationError,
    StorageError,
)
from orleanspy.identity import GrainId

if TYPE_CHECKING:
    from orleanspy.serialization import Codec
    from orleanspy.storage.contract import GrainStorage

__all__ = [
    "STATE_FORMAT_VERSION",
    "PersistentState",
    "StateDeclaration",
    "decode_state",
    "encode_state",
    "persistent_state",
]

T = TypeVar("T")

STATE_FORMAT_VERSION: Final = 1
"""The first byte of every stored state; a later format gets a new number."""

# Names end storage keys (``...:<name>`` in Redis), so they hold no ':' or '}'.
_NAME: Final = re.compile(r"[\w.\-]{1,128}")


# -- the stored form --------------------------------------------------------------------


def encode_state(value: Any, codec: Codec) -> bytes:
    """``value`` in the stored form: the format byte, then msgpack. A dataclass
    goes as a map of its fields by name. ``SerializationError`` names what cannot
    be stored."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return bytes((STATE_FORMAT_VERSION,)) + codec.encode(value)


def decode_state(data: bytes, state_type: type[T], codec: Codec, *, what: str) -> T:
    """The value ``encode_state`` stored, as ``state_type``; ``StorageError`` (naming
    ``what``) for bytes in another format or that do not make a ``state_type``."""
    if not data:
        raise StorageError(f"{what}: the stored state is empty (no format byte)")
    if data[0] != STATE_FORMAT_VERSION:
        raise StorageError(
            f"{what}: the stored state has format version {data[0]}; this release reads "
            f"version {STATE_FORMAT_VERSION} (was it written by a newer release, or by "
            "something else?)"
        )
    try:
        value = codec.decode(data[1:])
    except SerializationError as exc:
        raise StorageError(f"{what}: the stored state does not decode: {exc}") from exc
    if dataclasses.is_dataclass(state_type):
        if not isinstance(value, dict):
            raise StorageError(
                f"{what}: expected the fields of {state_type.__qualname__}, "
                f"found a stored {type(value).__name__}"
            )
        # Fields added since the record was written take their defaults; stored
        # fields the class no longer has are dropped.
        known = {f.name for f in dataclasses.fields(state_type) if f.init}
        try:
            return state_type(**{k: v for k, v in value.items() if k in known})
        except (TypeError, ValueError) as exc:
            raise StorageError(
                f"{what}: the stored fields do not make a {state_type.__qualname__}: {exc}"
            ) from exc
    if not isinstance(value, state_type):
        raise StorageError(
            f"{what}: expected a {state_type.__qualname__}, found a stored {type(value).__name__}"
        )
    return value


# -- what a grain holds -----------------------------------------------------------------


class PersistentState(Generic[T]):
    """One declared state of one activation (``self.<attribute>`` in the grain).

    Maps onto Orleans' ``IPersistentState<T>``: ``state`` is ``State``, ``etag``
    is ``Etag``, ``exists`` is ``RecordExists``, and ``read``/``write``/``clear``
    are ``ReadStateAsync``/``WriteStateAsync``/``ClearStateAsync``.
    """

    __slots__ = ("_codec", "_etag", "_grain_id", "_name", "_storage", "_type", "state")

    state: T
    """The state value; change it in place or assign a new one, then ``write()``."""

    def __init__(
        self,
        state_type: type[T],
        *,
        grain_id: GrainId,
        name: str,
        storage: GrainStorage,
        codec: Codec,
    ) -> None:
        self._type = state_type
        self._grain_id = grain_id
        self._name = name
        self._storage = storage
        self._codec = codec
        self._etag: str | None = None
        self.state = state_type()

    @property
    def etag(self) -> str | None:
        """The version this activation last read or wrote; ``None`` when nothing is stored."""
        return self._etag

    @property
    def exists(self) -> bool:
        """Whether a stored state exists (as of the last read, write or clear)."""
        return self._etag is not None

    @property
    def _what(self) -> str:
        return f"grain {self._grain_id} state {self._name!r}"

    async def read(self) -> None:
        """Load the stored state (``state_type()`` when nothing is stored), replacing
        ``state`` and ``etag``. ``StorageError`` if the stored bytes are not a state."""
        stored = await self._storage.read(self._grain_id, self._name)
        if stored is None:
            self.state = self._type()
            self._etag = None
            return
        self.state = decode_state(stored.data, self._type, self._codec, what=self._what)
        self._etag = stored.etag

    async def write(self) -> None:
        """Store ``state``. ``InconsistentStateError`` if the stored etag is not the
        one this activation holds (nothing is written then)."""
        data = encode_state(self.state, self._codec)
        etag = await self._storage.write(self._grain_id, self._name, data, self._etag)
        if etag is None:
            raise self._conflict("write")
        self._etag = etag

    async def clear(self) -> None:
        """Remove the stored state and reset ``state`` to ``state_type()``.
        ``InconsistentStateError`` if the stored etag is not the one held."""
        if not await self._storage.clear(self._grain_id, self._name, self._etag):
            raise self._conflict("clear")
        self.state = self._type()
        self._etag = None

    def _conflict(self, what: str) -> InconsistentStateError:
        return InconsistentStateError(
            f"{self._what}: {what} refused, the stored state is no longer the one this "
            f"activation read (etag {self._etag!r}); another activation changed it. The "
            "activation is deactivated when this error leaves the grain call; the next "
            "call reloads the state"
        )

    def __repr__(self) -> str:
        return f"<PersistentState {self._what} etag={self._etag!r} state={self.state!r}>"


class StateDeclaration(Generic[T]):
    """What ``persistent_state`` returns: a class attribute of a grain class.

    Read on the class it is the declaration (``state_type``, ``storage``,
    ``name``); read on a grain instance it is that activation's ``PersistentState``.
    """

    def __init__(self, state_type: type[T], storage: str, name: str | None) -> None:
        self.state_type = state_type
        self.storage = storage
        self.name = name or ""
        self.attribute = ""

    def __set_name__(self, owner: type, attribute: str) -> None:
        # An attribute name is always a valid state name (1-128 long is checked
        # by the grain class collecting its states).
        self.attribute = attribute
        if not self.name:
            self.name = attribute

    @overload
    def __get__(self, instance: None, owner: type) -> StateDeclaration[T]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> PersistentState[T]: ...
    def __get__(self, instance: object | None, owner: type) -> Any:
        if instance is None:
            return self
        try:
            return instance.__dict__[self.attribute]
        except KeyError:
            raise AttributeError(
                f"{type(instance).__qualname__}.{self.attribute}: persistent state is bound "
                "when the runtime activates the grain; grain objects made by hand have none"
            ) from None

    def __set__(self, instance: object, value: object) -> None:
        raise AttributeError(
            f"{type(instance).__qualname__}.{self.attribute} is persistent state: assign to "
            f"self.{self.attribute}.state instead"
        )

    def bind(
        self,
        instance: object,
        *,
        grain_id: GrainId,
        storage: GrainStorage,
        codec: Codec,
    ) -> PersistentState[T]:
        """Give ``instance`` (an activation's grain) its ``PersistentState``; not loaded yet."""
        state = PersistentState(
            self.state_type, grain_id=grain_id, name=self.name, storage=storage, codec=codec
        )
        instance.__dict__[self.attribute] = state
        return state

    def __repr__(self) -> str:
        return (
            f"persistent_state({self.state_type.__qualname__}, storage={self.storage!r}, "
            f"name={self.name!r})"
        )


def persistent_state(
    state_type: type[T],
    storage: str = "default",
    *,
    name: str | None = None,
) -> StateDeclaration[T]:
    """Declare a persistent state on a grain class (a class attribute).

    ``state_type`` is a dataclass (or any type the codec handles) that can be made
    with no arguments: that is the state when nothing is stored. ``storage`` names
    a provider of ``SiloOptions.storage``. ``name`` (default: the attribute name)
    identifies the state in storage; renaming the attribute with ``name`` kept
    keeps the stored data.
    """
    if not isinstance(state_type, type):
        raise ConfigurationError(f"persistent_state needs a type, got {state_type!r}")
    if name is not None and not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"persistent_state name {name!r} must be 1-128 letters, digits, '_', '.' or '-'"
        )
    if not isinstance(storage, str) or not storage:
        raise ConfigurationError("persistent_state storage must be a non-empty provider name")
    try:
        state_type()
    except Exception as exc:
        raise ConfigurationError(
            f"persistent_state({state_type.__qualname__}): the state type must be "
            f"constructible with no arguments (give every field a default): {exc}"
        ) from exc
    return StateDeclaration(state_type, storage, name)
