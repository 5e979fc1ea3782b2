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

Effectively-once ticks: ``write(tick=status)`` stores the state and, in the same
record, that the tick's occurrence is done: format 2, ``[value, commits]``, where
``commits`` maps a reminder name to ``[registration, slot, trigger]`` (ms: the
registration's ``first_tick_time``, the latest scheduled slot committed, the last
trigger committed), with a fourth item, the last backfilled slot committed, once one
was (a backfill's slots lie before the scheduled ones, so they are matched like
triggers, not against the scheduled slot's watermark). One record, so one
etag-checked write of the provider commits both, on every provider. Bounded: one entry
per reminder name, replaced by a new registration. Before a tick runs, the runtime
asks every state of the grain whether its occurrence is committed (``committed``, in
memory: no store read) and does not run it again if one says yes. A plain
``write()`` keeps the commits. Format 2 is written only once the cluster's feature
level reaches ``Feature.TICK_COMMIT`` (0.1 cannot read it); below it
``write(tick=)`` is a plain write and ticks stay at least once.

The outbox (``orleanspy.outbox``): ``write(after=[...])`` stores messages to send
once the write commits in the same record, ``[value, commits, outbox]``, each
``[message id, kind, target, name, body]`` (kind 0: a call of method ``name``
on grain ``target`` with the arguments ``body``; kind 1: ``body`` published on
stream ``target``). The activation's sender sends them (``on_outbox`` wakes it)
and marks each sent (``outbox_sent``); a sent message leaves the record at the
next write, or at ``outbox_flush`` (a write of the stored value as it was, so
the runtime never stores a change the grain did not write). Needs
``Feature.OUTBOX``; below it ``after=`` is refused and nothing is written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, overload

from orleanspy.clock import to_ms
from orleanspy.errors import (
    ConfigurationError,
    InconsistentStateError,
    SerializationError,
    StorageError,
)
from orleanspy.identity import GrainId
from orleanspy.outbox import MAX_MESSAGES, OutboxCall, OutboxPublish
from orleanspy.versions import PROTOCOL, Feature

if TYPE_CHECKING:
    from collections.abc import Callable

    from orleanspy.reminders.model import TickStatus
    from orleanspy.serialization import Codec
    from orleanspy.storage.contract import GrainStorage

__all__ = [
    "OUTBOX_CALL",
    "OUTBOX_PUBLISH",
    "STATE_FORMAT_VERSION",
    "TICK_FORMAT_VERSION",
    "PersistentState",
    "StateDeclaration",
    "decode_record",
    "decode_state",
    "encode_record",
    "encode_state",
    "encode_value",
    "persistent_state",
]

T = TypeVar("T")

STATE_FORMAT_VERSION: Final = 1
"""The first byte of a stored state without committed ticks (what 0.1 writes)."""

TICK_FORMAT_VERSION: Final = 2
"""The first byte of a stored state with the reminder ticks it committed."""

#: A reminder's commit: [registration ms, latest scheduled slot ms, last trigger ms].
Commits = dict[str, list[int]]

#: A queued outbox message as stored: [message id, kind, target, name, body].
Outbox = list[list[Any]]
OUTBOX_CALL: Final = 0
OUTBOX_PUBLISH: Final = 1

# Names end storage keys (``...:<name>`` in Redis), so they hold no ':' or '}'.
_NAME: Final = re.compile(r"[\w.\-]{1,128}")


# -- the stored form --------------------------------------------------------------------


def encode_value(value: Any, codec: Codec) -> bytes:
    """``value``'s msgpack as a record holds it: a dataclass as a map of its fields
    by name. ``SerializationError`` names what cannot be stored."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return codec.encode(value)


def encode_record(
    value: bytes, codec: Codec, commits: Commits | None = None, outbox: Outbox | None = None
) -> bytes:
    """A stored record of ``value`` (``encode_value``'s bytes): format 1 when there
    is nothing else to keep, else format 2, ``[value, commits]`` or, with queued
    messages, ``[value, commits, outbox]``. The array is written around the
    value's bytes (a msgpack array of n < 16 items is one byte, then its items),
    so the outbox can be rewritten without encoding the value again."""
    if outbox:
        return b"%c\x93%b%b%b" % (
            TICK_FORMAT_VERSION,
            value,
            codec.encode(commits or {}),
            codec.encode(outbox),
        )
    if commits:
        return b"%c\x92%b%b" % (TICK_FORMAT_VERSION, value, codec.encode(commits))
    return bytes((STATE_FORMAT_VERSION,)) + value


def encode_state(value: Any, codec: Codec, commits: Commits | None = None) -> bytes:
    """``value`` in the stored form: the format byte, then msgpack; with
    ``commits`` (not empty), format 2 with them. A dataclass goes as a map of its
    fields by name. ``SerializationError`` names what cannot be stored."""
    return encode_record(encode_value(value, codec), codec, commits)


def decode_state(data: bytes, state_type: type[T], codec: Codec, *, what: str) -> T:
    """The value ``encode_state`` stored, as ``state_type``; ``StorageError`` (naming
    ``what``) for bytes in another format or that do not make a ``state_type``."""
    return decode_record(data, state_type, codec, what=what)[0]


def decode_record(
    data: bytes, state_type: type[T], codec: Codec, *, what: str
) -> tuple[T, Commits]:
    """``decode_state`` and the commits the record holds (empty in format 1)."""
    value, commits, _outbox = _decode_parts(data, codec, what)
    return _value_as(value, state_type, what), commits


def _decode_parts(data: bytes, codec: Codec, what: str) -> tuple[Any, Commits, Outbox]:
    """A record's stored value (as msgpack gave it), commits and outbox."""
    if not data:
        raise StorageError(f"{what}: the stored state is empty (no format byte)")
    if data[0] not in (STATE_FORMAT_VERSION, TICK_FORMAT_VERSION):
        raise StorageError(
            f"{what}: the stored state has format version {data[0]}; this release reads "
            f"versions {STATE_FORMAT_VERSION} and {TICK_FORMAT_VERSION} (was it written by a "
            "newer release, or by something else?)"
        )
    try:
        value = codec.decode(data[1:])
    except SerializationError as exc:
        raise StorageError(f"{what}: the stored state does not decode: {exc}") from exc
    commits: Commits = {}
    outbox: Outbox = []
    if data[0] == TICK_FORMAT_VERSION:
        if not (isinstance(value, list) and len(value) in (2, 3) and isinstance(value[1], dict)):
            raise StorageError(f"{what}: a format 2 state is not [value, commits(, outbox)]")
        if len(value) == 3:
            outbox = _stored_outbox(value[2], what)
        value, stored = value[0], value[1]
        for name, entry in stored.items():
            try:
                if not (isinstance(entry, list) and len(entry) in (3, 4)):
                    raise TypeError("not [registration, slot, trigger(, backfill)]")
                commits[str(name)] = [int(x) for x in entry]
            except (TypeError, ValueError) as exc:
                raise StorageError(
                    f"{what}: malformed commit of reminder {name!r}: {exc}"
                ) from None
    return value, commits, outbox


def _stored_outbox(stored: Any, what: str) -> Outbox:
    if not isinstance(stored, list) or not all(
        isinstance(e, list)
        and len(e) == 5
        and isinstance(e[0], str)
        and e[1] in (OUTBOX_CALL, OUTBOX_PUBLISH)
        and isinstance(e[2], str)
        and isinstance(e[3], str)
        for e in stored
    ):
        raise StorageError(f"{what}: a malformed outbox (not [id, kind, target, name, body]s)")
    return stored


def _value_as(value: Any, state_type: type[T], what: str) -> T:
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


def _this_release() -> int:
    return PROTOCOL


def _commit(commits: Commits, tick: TickStatus) -> Commits:
    """The commit entry ``tick`` makes: ``{name: [registration, slot, trigger]}``,
    with ``backfill`` fourth once a backfilled slot was committed."""
    name = tick.reminder
    if name is None:
        raise ValueError(
            "write(tick=...) takes the TickStatus receive_reminder was given (this one "
            "was not delivered by a silo)"
        )
    registration = to_ms(tick.first_tick_time)
    at = to_ms(tick.current_tick_time)
    old = commits.get(name)
    same = old is not None and old[0] == registration
    slot, trigger = (old[1], old[2]) if same and old is not None else (-1, -1)
    backfill = old[3] if same and old is not None and len(old) > 3 else -1
    if tick.triggered:
        trigger = at
    elif tick.backfill:
        backfill = at
    else:
        slot = max(slot, at)
    entry = [registration, slot, trigger]
    return {name: entry if backfill < 0 else [*entry, backfill]}


# -- what a grain holds -----------------------------------------------------------------


class PersistentState(Generic[T]):
    """One declared state of one activation (``self.<attribute>`` in the grain).

    Maps onto Orleans' ``IPersistentState<T>``: ``state`` is ``State``, ``etag``
    is ``Etag``, ``exists`` is ``RecordExists``, and ``read``/``write``/``clear``
    are ``ReadStateAsync``/``WriteStateAsync``/``ClearStateAsync``.
    """

    __slots__ = (
        "_codec",
        "_commits",
        "_drained",
        "_etag",
        "_grain_id",
        "_level",
        "_name",
        "_on_outbox",
        "_outbox",
        "_seq",
        "_storage",
        "_type",
        "_unsent",
        "_value",
        "state",
    )

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
        level: Callable[[], int] | None = None,
        on_outbox: Callable[[PersistentState[Any]], None] | None = None,
    ) -> None:
        self._type = state_type
        self._grain_id = grain_id
        self._name = name
        self._storage = storage
        self._codec = codec
        self._etag: str | None = None
        self._commits: Commits = {}
        # The cluster's feature level (``membership.agreement.cluster_level``);
        # an embedded silo is its own cluster.
        self._level = level or _this_release
        # The outbox: the messages the stored record holds, the ids of those not
        # sent yet, the stored value's bytes while the record holds messages (for
        # ``outbox_flush``), who sends them, and an event set when none is unsent.
        self._outbox: Outbox = []
        self._unsent: set[str] = set()
        self._value: bytes | None = None
        self._on_outbox = on_outbox
        self._drained: asyncio.Event | None = None
        self._seq = 0
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
            self._commits = {}
            self._set_outbox([], None)
            return
        value, self._commits, outbox = _decode_parts(stored.data, self._codec, self._what)
        self.state = _value_as(value, self._type, self._what)
        self._etag = stored.etag
        # Messages a previous activation committed and may not have sent: all
        # of them go (again); their receivers drop repeats by message id.
        self._set_outbox(outbox, self._codec.encode(value) if outbox else None)

    async def write(
        self, *, tick: TickStatus | None = None, after: Sequence[OutboxCall | OutboxPublish] = ()
    ) -> None:
        """Store ``state``; with ``tick`` (the status ``receive_reminder`` was
        given), record in the same write that this tick's occurrence is done, so
        that it does not run again (the module docstring). With ``after``
        (``orleanspy.outbox.call``/``publish``), queue those messages in the same
        record, to be sent once the write commits. One write either way.

        ``InconsistentStateError`` if the stored etag is not the one this
        activation holds (nothing is written then, and neither the commit nor
        the messages are kept); ``ValueError`` for a ``tick`` no silo delivered
        or an ``after`` that is not outbox messages; ``ConfigurationError`` for
        ``after`` before every silo of the cluster has the outbox
        (``Feature.OUTBOX``); ``SerializationError`` for a message that cannot
        travel. On any error nothing is written."""
        commits = self._commits
        if tick is not None:
            commits = {**commits, **_commit(commits, tick)}
        level = self._level()
        outbox = self._outbox
        if after:
            outbox = [e for e in outbox if e[0] in self._unsent] + self._queue(after, tick, level)
        elif len(outbox) != len(self._unsent):
            outbox = [e for e in outbox if e[0] in self._unsent]
        value = encode_value(self.state, self._codec)
        data = encode_record(
            value, self._codec, commits if level >= Feature.TICK_COMMIT else None, outbox
        )
        etag = await self._storage.write(self._grain_id, self._name, data, self._etag)
        if etag is None:
            raise self._conflict("write")
        self._etag = etag
        self._commits = commits
        if outbox or self._outbox:
            self._set_outbox(outbox, value if outbox else None)

    def _queue(
        self, after: Sequence[OutboxCall | OutboxPublish], tick: TickStatus | None, level: int
    ) -> Outbox:
        """``after`` as stored outbox entries, each with a new message id."""
        if level < Feature.OUTBOX:
            raise ConfigurationError(
                f"{self._what}: write(after=...) needs every silo of the cluster to have "
                f"the outbox (feature level {int(Feature.OUTBOX)}); the cluster is at level "
                f"{level} while silos of an older release run. Nothing was written"
            )
        if isinstance(after, (str, bytes)) or not isinstance(after, Sequence):
            raise ValueError(
                "write(after=...) takes a list of outbox.call(...)/outbox.publish(...)"
            )
        if len(after) + len(self._unsent) > MAX_MESSAGES:
            raise ValueError(
                f"{self._what}: at most {MAX_MESSAGES} outbox messages may wait in a state "
                f"({len(self._unsent)} wait, {len(after)} more were given)"
            )
        base = tick.occurrence_id if tick is not None else uuid.uuid4().hex
        entries: Outbox = []
        for message in after:
            self._seq += 1
            mid = f"{base}.{self._seq}"
            if isinstance(message, OutboxCall):
                entries.append(
                    [mid, OUTBOX_CALL, message.grain.canonical, message.method, list(message.args)]
                )
            elif isinstance(message, OutboxPublish):
                entries.append([mid, OUTBOX_PUBLISH, message.stream, "", message.item])
            else:
                raise ValueError(
                    f"write(after=...) takes outbox.call(...) and outbox.publish(...) "
                    f"messages, not {type(message).__name__}"
                )
        return entries

    def _set_outbox(self, outbox: Outbox, value: bytes | None) -> None:
        """The stored record now holds ``outbox`` (and ``value``)."""
        # Sent stays sent (the sender may have sent more while the write was under
        # way); what the record holds that it did not hold before is unsent.
        stored = {e[0] for e in outbox}
        fresh = stored - {e[0] for e in self._outbox}
        self._outbox = outbox
        self._value = value
        self._unsent = (self._unsent & stored) | fresh
        if self._unsent:
            if self._drained is None or self._drained.is_set():
                self._drained = asyncio.Event()
            if self._on_outbox is not None:
                self._on_outbox(self)
        elif self._drained is not None:
            self._drained.set()

    # -- the outbox, for the activation's sender -----------------------------------------

    def outbox_unsent(self) -> list[list[Any]]:
        """The queued messages not sent yet, in order: ``[id, kind, target, name, body]``."""
        return [e for e in self._outbox if e[0] in self._unsent]

    def outbox_sent(self, message_id: str) -> None:
        """Message ``message_id`` was sent (or can never be): it is not sent again
        by this activation, and leaves the record at the next write."""
        self._unsent.discard(message_id)
        if not self._unsent and self._drained is not None:
            self._drained.set()

    @property
    def outbox_waiting(self) -> bool:
        """Whether queued messages wait to be sent."""
        return bool(self._unsent)

    async def outbox_drained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no queued message is unsent;
        whether none is."""
        drained = self._drained
        if drained is None or drained.is_set():
            return True
        try:
            async with asyncio.timeout(timeout):
                await drained.wait()
        except TimeoutError:
            return False
        return True

    async def outbox_flush(self) -> None:
        """Drop the sent messages from the stored record (run as a turn of the
        grain): the stored value as it was, with the commits and the unsent
        messages. Nothing when none was sent since the last write. A write lost
        to another activation changes nothing here (that one holds the record)."""
        if self._value is None or len(self._outbox) == len(self._unsent):
            return
        outbox = [e for e in self._outbox if e[0] in self._unsent]
        level = self._level()
        data = encode_record(
            self._value,
            self._codec,
            self._commits if level >= Feature.TICK_COMMIT else None,
            outbox,
        )
        etag = await self._storage.write(self._grain_id, self._name, data, self._etag)
        if etag is not None:
            self._etag = etag
            self._set_outbox(outbox, self._value if outbox else None)

    def committed(self, name: str, tick: TickStatus) -> bool:
        """Whether this state recorded ``tick``'s occurrence of reminder ``name``
        as done (as of this activation's last read or write)."""
        entry = self._commits.get(name)
        if entry is None or entry[0] != to_ms(tick.first_tick_time):
            return False
        at = to_ms(tick.current_tick_time)
        if tick.backfill:
            return len(entry) > 3 and at == entry[3]
        return at == entry[2] if tick.triggered else at <= entry[1]

    async def clear(self) -> None:
        """Remove the stored state and reset ``state`` to ``state_type()``.
        ``InconsistentStateError`` if the stored etag is not the one held."""
        if not await self._storage.clear(self._grain_id, self._name, self._etag):
            raise self._conflict("clear")
        self.state = self._type()
        self._etag = None
        self._commits = {}
        self._set_outbox([], None)

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
        level: Callable[[], int] | None = None,
        on_outbox: Callable[[PersistentState[Any]], None] | None = None,
    ) -> PersistentState[T]:
        """Give ``instance`` (an activation's grain) its ``PersistentState``; not loaded
        yet. ``level``: the cluster's feature level (default: this release's);
        ``on_outbox``: called when the state holds messages to send."""
        state = PersistentState(
            self.state_type,
            grain_id=grain_id,
            name=self.name,
            storage=storage,
            codec=codec,
            level=level,
            on_outbox=on_outbox,
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
