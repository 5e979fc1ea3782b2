"""Grains: the base class users subclass, its decorators, and the type registry.

A grain class is read once, when it is defined: ``__init_subclass__`` builds a
frozen ``GrainDefinition`` (type name, callable methods and their interleaving
flags, placement, collection age, declared reminders) and registers it. The
runtime reads only that definition.

Only public ``async def`` methods declared by the user's classes are callable
through a proxy; the ``Grain`` base class's own methods (``on_activate``,
``register_timer``, ...) are not.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, TypeVar, Unpack, overload

from orleanspy.clock import Clock
from orleanspy.errors import ConfigurationError, ReminderError, UnknownGrainTypeError
from orleanspy.identity import GrainId, GrainKey, SiloAddress
from orleanspy.reminders.model import (
    MissedReminderAction,
    OverlapPolicy,
    ReminderEntry,
    ReminderPriority,
    TickStatus,
)
from orleanspy.reminders.spec import (
    DURATION_OPTIONS,
    ReminderArgs,
    ReminderSpec,
    RepeatingArgs,
    check_keywords,
)
from orleanspy.state import StateDeclaration

__all__ = [
    "DeclaredReminder",
    "Grain",
    "GrainDefinition",
    "GrainMethodInfo",
    "GrainReminders",
    "GrainRuntime",
    "GrainTimer",
    "Remindable",
    "always_interleave",
    "check_overlap",
    "definition_of",
    "interleaves_ticks",
    "lookup_definition",
    "one_way",
    "read_only",
    "reentrant",
    "register_reminder",
    "registered_definitions",
]

log = logging.getLogger(__name__)

G = TypeVar("G", bound="Grain")
C = TypeVar("C", bound=type)
F = TypeVar("F", bound=Callable[..., Any])

_ALWAYS_INTERLEAVE = "__orleanspy_always_interleave__"
_READ_ONLY = "__orleanspy_read_only__"
_ONE_WAY = "__orleanspy_one_way__"


class GrainTimer(Protocol):
    """A running grain timer, as ``Grain.register_timer`` returns it
    (``orleanspy.TimerHandle``)."""

    ticks: int

    @property
    def disposed(self) -> bool: ...

    def dispose(self) -> None:
        """Stop the timer; a tick already running finishes its turn."""
        ...


class GrainReminders(Protocol):
    """The reminder operations grain code calls, for any grain of the silo
    (served by ``orleanspy.remindable.registry.ReminderRegistry``)."""

    async def register(self, grain_id: GrainId, name: str, spec: ReminderSpec) -> ReminderEntry:
        """Validate ``spec`` and upsert its row (``ReminderError`` on bad input)."""
        ...

    async def unregister(self, grain_id: GrainId, name: str) -> bool:
        """Remove the row; ``False`` if there was none."""
        ...

    async def get(self, grain_id: GrainId, name: str) -> ReminderEntry | None: ...

    async def list(self, grain_id: GrainId) -> list[ReminderEntry]: ...


class GrainRuntime(Protocol):
    """Everything grain code reaches of the runtime that hosts it.

    The runtime gives each grain instance one (its activation, in
    ``orleanspy.runtime.activation``), so this module depends on no runtime
    module: the runtime depends on it.
    """

    @property
    def grain_id(self) -> GrainId: ...

    @property
    def silo_address(self) -> SiloAddress:
        """The address of the silo the grain runs on."""
        ...

    @property
    def clock(self) -> Clock: ...

    @property
    def reminders(self) -> GrainReminders:
        """The silo's reminder registry (``RuntimeError`` if it has no reminder service)."""
        ...

    def get_grain(self, grain: Any, key: GrainKey) -> Any:
        """A proxy for a grain, called from inside this one."""
        ...

    def register_timer(
        self,
        callback: Callable[[], Awaitable[None]],
        due: timedelta | float,
        period: timedelta | float | None,
    ) -> GrainTimer: ...

    def request_deactivation(self) -> None:
        """Deactivate once no turn is running."""
        ...


@dataclass(frozen=True, slots=True)
class GrainMethodInfo:
    """How one callable method may run: interleaved always, read-only, one-way."""

    name: str
    always_interleave: bool = False
    read_only: bool = False
    one_way: bool = False


@dataclass(frozen=True, slots=True)
class DeclaredReminder(ReminderSpec):
    """A reminder declared with ``@register_reminder`` on a grain class: its name,
    the keys it is declared for, and what it asks for (the ``ReminderSpec``
    fields; ``at`` and ``max_ticks`` stay ``None``)."""

    name: str
    #: The grain keys to create the row for; ``None``: the class's ``reminder_keys``.
    keys: tuple[GrainKey, ...] | None = field(default=None, kw_only=True)


@dataclass(frozen=True, slots=True)
class GrainDefinition:
    """Everything the runtime needs to know about a grain class, built once.

    ``reminder_keys`` are the keys for which ``@register_reminder`` rows are
    created at silo start-up (default: the single key ``""``). ``states`` are the
    ``persistent_state`` declarations, loaded at every activation.
    """

    type_name: str
    cls: type[Grain]
    methods: Mapping[str, GrainMethodInfo]
    reentrant: bool = False
    placement: Any = None
    collection_age: timedelta | None = None
    reminders: tuple[DeclaredReminder, ...] = ()
    reminder_keys: tuple[GrainKey, ...] = ("",)
    remindable: bool = False
    states: tuple[StateDeclaration[Any], ...] = ()
    reminder_affinity: bool = True

    def grain_id(self, key: GrainKey) -> GrainId:
        return GrainId(self.type_name, key)


_registry: dict[str, GrainDefinition] = {}


def interleaves_ticks(defn: GrainDefinition) -> bool:
    """Whether the grain's ``receive_reminder`` may run beside its other turns
    (a ``@reentrant`` class, or ``@always_interleave`` on the method): what
    ``OverlapPolicy.ALLOW_ALL`` needs, or its ticks would queue anyway."""
    info = defn.methods.get("receive_reminder")
    return defn.reentrant or (info is not None and info.always_interleave)


def check_overlap(defn: GrainDefinition, overlap: object, what: str) -> None:
    """``ConfigurationError`` for ``OverlapPolicy.ALLOW_ALL`` on a grain whose
    ticks cannot interleave (``interleaves_ticks``); ``what`` names the reminder."""
    if overlap == OverlapPolicy.ALLOW_ALL and not interleaves_ticks(defn):
        raise ConfigurationError(
            f"{what}: overlap=ALLOW_ALL runs ticks of one reminder side by side, but "
            f"{defn.cls.__qualname__} is not reentrant, so its turns would queue them: mark "
            "the class @reentrant (or receive_reminder @always_interleave), or choose "
            "another OverlapPolicy (BUFFER_ONE, the default, queues one)"
        )


def _register(defn: GrainDefinition) -> None:
    existing = _registry.get(defn.type_name)
    if existing is not None and existing.cls is not defn.cls:
        same = (existing.cls.__module__, existing.cls.__qualname__) == (
            defn.cls.__module__,
            defn.cls.__qualname__,
        )
        if not same:
            raise ConfigurationError(
                f"grain type name {defn.type_name!r} is used by both "
                f"{existing.cls.__module__}.{existing.cls.__qualname__} and "
                f"{defn.cls.__module__}.{defn.cls.__qualname__}; pass type_name=... to one of them"
            )
    _registry[defn.type_name] = defn


def registered_definitions() -> dict[str, GrainDefinition]:
    """A copy of the registry: type name to definition."""
    return dict(_registry)


def lookup_definition(type_name: str) -> GrainDefinition:
    """The definition registered under ``type_name`` or ``UnknownGrainTypeError``."""
    try:
        return _registry[type_name]
    except KeyError:
        raise UnknownGrainTypeError.known(
            f"no grain class is registered as {type_name!r}", _registry
        ) from None


def definition_of(cls: type[Grain]) -> GrainDefinition:
    """The definition of a grain class."""
    defn = cls.__dict__.get("__grain_definition__")
    if defn is None:
        raise ConfigurationError(f"{cls!r} is not a grain class")
    return defn  # type: ignore[no-any-return]


def _replace_definition(cls: type[Grain], **changes: Any) -> None:
    defn = replace(definition_of(cls), **changes)
    cls.__grain_definition__ = defn
    _registry[defn.type_name] = defn


def _collect_methods(cls: type) -> dict[str, GrainMethodInfo]:
    methods: dict[str, GrainMethodInfo] = {}
    for klass in reversed(cls.__mro__):
        if klass in (object, Grain) or (klass.__module__ == __name__ and klass is not Remindable):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in _BASE_NAMES:
                continue
            if isinstance(value, (staticmethod, classmethod)):
                methods.pop(name, None)
                continue
            if inspect.iscoroutinefunction(value):
                methods[name] = GrainMethodInfo(
                    name=name,
                    always_interleave=bool(getattr(value, _ALWAYS_INTERLEAVE, False)),
                    read_only=bool(getattr(value, _READ_ONLY, False)),
                    one_way=bool(getattr(value, _ONE_WAY, False)),
                )
            else:
                methods.pop(name, None)
    return methods


def _collect_states(cls: type) -> tuple[StateDeclaration[Any], ...]:
    by_attribute: dict[str, StateDeclaration[Any]] = {}
    for klass in reversed(cls.__mro__):
        for attribute, value in vars(klass).items():
            if isinstance(value, StateDeclaration):
                by_attribute[attribute] = value
            else:
                by_attribute.pop(attribute, None)
    names: dict[str, str] = {}
    for attribute, decl in by_attribute.items():
        if decl.name in names:
            raise ConfigurationError(
                f"{cls.__qualname__}: states {names[decl.name]!r} and {attribute!r} are both "
                f"named {decl.name!r} in storage; pass name=... to one of them"
            )
        names[decl.name] = attribute
    return tuple(by_attribute.values())


def _reject_sync_methods(cls: type) -> None:
    """A public plain ``def`` on a grain class is almost always a forgotten
    ``async``: callers would get an error at call time, far from the cause."""
    for name, value in vars(cls).items():
        if name.startswith("_") or name in _BASE_NAMES or not inspect.isfunction(value):
            continue
        if not inspect.iscoroutinefunction(value):
            raise ConfigurationError(
                f"{cls.__qualname__}.{name} is a public grain method but not 'async def': "
                "grain methods run as messages and must be coroutines. Write "
                f"'async def {name}', or rename it '_{name}' to keep it a local helper"
            )


class Grain:
    """Base class of every grain. Subclass it and write public ``async def`` methods.

    Class keywords: ``type_name`` (default: the class name), ``placement`` (a
    strategy from ``orleanspy.placement``), ``collection_age`` (idle time before
    the activation is collected; default the silo's), ``reminder_keys`` (keys for
    which ``@register_reminder`` rows are created at start-up), ``reminder_affinity``
    (default ``True``: a grain that a reminder tick activates is placed on the
    silo that owns the reminder; ``False`` places it with ``placement`` like any
    other call).

    The runtime creates instances; ``__init__`` takes no arguments and runs after
    ``grain_id`` is available and every ``persistent_state`` attribute is loaded.
    """

    __grain_definition__: ClassVar[GrainDefinition]
    # Set by the runtime before ``__init__`` runs (see ``GrainRuntime``).
    _activation: GrainRuntime

    def __init_subclass__(
        cls,
        *,
        type_name: str | None = None,
        placement: Any = None,
        collection_age: timedelta | None = None,
        reminder_keys: tuple[GrainKey, ...] | None = None,
        reminder_affinity: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        name = type_name or cls.__name__
        if "/" in name or "|" in name or not name:
            raise ConfigurationError(f"grain type name {name!r} must be non-empty, no '/' or '|'")
        if collection_age is not None and (
            not isinstance(collection_age, timedelta) or collection_age <= timedelta(0)
        ):
            raise ConfigurationError("collection_age must be a positive datetime.timedelta")
        _reject_sync_methods(cls)
        parent = next(
            (b.__dict__["__grain_definition__"] for b in cls.__mro__[1:]
             if "__grain_definition__" in b.__dict__),
            None,
        )  # fmt: skip
        defn = GrainDefinition(
            type_name=name,
            cls=cls,
            methods=MappingProxyType(_collect_methods(cls)),
            reentrant=parent.reentrant if parent else False,
            placement=placement
            if placement is not None
            else (parent.placement if parent else None),
            collection_age=collection_age or (parent.collection_age if parent else None),
            reminders=parent.reminders if parent else (),
            reminder_keys=tuple(reminder_keys) if reminder_keys is not None else ("",),
            remindable=issubclass(cls, Remindable),
            states=_collect_states(cls),
            reminder_affinity=reminder_affinity
            if reminder_affinity is not None
            else (parent.reminder_affinity if parent else True),
        )
        cls.__grain_definition__ = defn
        _register(defn)

    # -- identity and calls -------------------------------------------------------------

    @property
    def grain_id(self) -> GrainId:
        """This grain's identity."""
        return self._activation.grain_id

    @property
    def grain_key(self) -> GrainKey:
        """This grain's key."""
        return self._activation.grain_id.key

    @overload
    def get_grain(self, grain: type[G], key: GrainKey) -> G: ...
    @overload
    def get_grain(self, grain: str, key: GrainKey) -> Any: ...
    def get_grain(self, grain: type[G] | str, key: GrainKey) -> Any:
        """A proxy for another grain (or this one), called from inside this grain."""
        return self._activation.get_grain(grain, key)

    # -- lifecycle ----------------------------------------------------------------------

    async def on_activate(self) -> None:
        """Called before the first message; an exception fails that call and
        discards the activation."""

    async def on_deactivate(self) -> None:
        """Called when the activation is collected, deactivated or the silo stops."""

    def deactivate_on_idle(self) -> None:
        """Deactivate this activation once the current turn (and any running) ends."""
        self._activation.request_deactivation()

    def register_timer(
        self,
        callback: Callable[[], Awaitable[None]],
        due: timedelta | float,
        period: timedelta | float | None = None,
    ) -> GrainTimer:
        """Call ``callback`` after ``due``, then every ``period`` (``None``: once).

        Ticks run as turns of this activation (they never interleave with a
        non-reentrant grain's calls); the next period starts when the callback
        returns. Timers are not durable and die with the activation; they do
        not keep it from being collected. ``dispose()`` the handle to stop it.
        """
        return self._activation.register_timer(callback, due, period)

    # -- reminders ----------------------------------------------------------------------

    @property
    def _orleanspy_reminders(self) -> GrainReminders:
        return self._activation.reminders

    async def register_or_update_reminder(
        self, name: str, **options: Unpack[ReminderArgs]
    ) -> ReminderEntry:
        """Register (or replace) a durable reminder for this grain.

        Interval form: ``period`` (and optional ``due``, default ``period``); cron
        form: ``cron`` with optional IANA ``tz``; one-shot form: ``at`` (an aware
        datetime) or ``due`` alone: it fires once, then its row is removed.
        Options: ``grace`` (how late a tick may be delivered and still be on
        time, default ``ReminderOptions.missed_tick_grace``, 10 s; later, or
        once a further slot has passed, ``action`` decides), ``jitter`` (a stable
        offset in ``[0, jitter)`` per slot, never reaching the next slot),
        ``starts_at``/``ends_at``/``max_ticks`` (bounds; the row is removed after
        its last slot), ``payload`` (a small value of the codec's types, given
        back in ``TickStatus.payload``) and ``retry`` (``RetryPolicy``:
        re-deliver a tick whose ``receive_reminder`` raised, within the slot).
        ``overlap`` (``OverlapPolicy``: what a slot that falls due while the
        previous tick still runs becomes; default ``BUFFER_ONE``; ``ALLOW_ALL``
        needs a reentrant grain, ``ConfigurationError`` otherwise),
        ``catchup_window`` (with ``action=FIRE_IMMEDIATELY``: how old the latest
        missed slot may be and still get its catch-up tick) and ``deadline``
        (how long ``receive_reminder`` may run before it is cancelled; default
        ``ReminderOptions.tick_deadline``) need every silo of the cluster on
        0.2 (``FeatureUnavailableError`` before, nothing written).
        Registering again re-anchors the schedule at now. Invalid input raises
        ``ReminderError``. The grain class must derive from ``Remindable``.
        """
        check_keywords(options, _REMINDER_KEYWORDS, "register_or_update_reminder")
        spec = ReminderSpec(**options)
        return await self._orleanspy_reminders.register(self.grain_id, name, spec)

    async def unregister_reminder(self, name: str) -> bool:
        """Remove the reminder; ``False`` if there was none (not an error)."""
        return await self._orleanspy_reminders.unregister(self.grain_id, name)

    async def get_reminder(self, name: str) -> ReminderEntry | None:
        """This grain's reminder ``name``, or ``None``."""
        return await self._orleanspy_reminders.get(self.grain_id, name)

    async def get_reminders(self) -> list[ReminderEntry]:
        """All reminders of this grain."""
        return await self._orleanspy_reminders.list(self.grain_id)

    def now(self) -> datetime:
        """The silo clock's current time (use it instead of ``datetime.now``, so
        tests with a manual clock see consistent time)."""
        return self._activation.clock.now()


class Remindable:
    """Mixin for grains that receive reminders: implement ``receive_reminder``."""

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        """Called for every tick of every reminder of this grain (a normal grain call).

        Only a silo's reminder service calls it: a client's or another grain's
        call is refused (``MessageRejectedError``). Tests deliver a tick with
        ``orleanspy.testing.simulate_tick``."""
        raise NotImplementedError(f"{type(self).__name__} must implement receive_reminder")


_BASE_NAMES = frozenset(n for n in vars(Grain) if not n.startswith("_")) - {"receive_reminder"}


# -- decorators ---------------------------------------------------------------------------


def reentrant(cls: C) -> C:
    """Let every call of this grain class interleave with others (no turn exclusion)."""
    _replace_definition(cls, reentrant=True)
    return cls


def always_interleave(fn: F) -> F:
    """This method may run while other calls of the activation are running."""
    setattr(fn, _ALWAYS_INTERLEAVE, True)
    return fn


def read_only(fn: F) -> F:
    """Read-only calls may interleave with each other (never with other calls)."""
    setattr(fn, _READ_ONLY, True)
    return fn


def one_way(fn: F) -> F:
    """Callers do not wait for this method: the proxy returns once the call is sent."""
    setattr(fn, _ONE_WAY, True)
    return fn


def _seconds(value: timedelta | float | None, what: str) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{what} must be seconds or a timedelta, got {value!r}")
    return timedelta(seconds=value)


def _declared_action(cls: type, name: str, action: Any) -> MissedReminderAction:
    if action is None:
        return MissedReminderAction.SKIP
    try:
        return MissedReminderAction(action)
    except ValueError:
        raise ReminderError(
            f"@register_reminder({name!r}) on {cls.__qualname__} is invalid: "
            f"action {action!r} is not a MissedReminderAction"
        ) from None


_REMINDER_KEYWORDS = ReminderArgs.__optional_keys__
_DECLARATION_KEYWORDS = RepeatingArgs.__optional_keys__


def register_reminder(
    name: str, *, keys: Iterable[GrainKey] | None = None, **options: Unpack[RepeatingArgs]
) -> Callable[[C], C]:
    """Declare a reminder on a ``Remindable`` grain class.

    At silo start-up the silo registers-or-updates each declared reminder for
    each key in ``keys`` (default: the class's ``reminder_keys``, itself
    defaulting to the key ``""``), straight in the table and without activating
    the grain: a missing row is created, a row whose period, cron, zone,
    priority, action or grace differs from the declaration is updated, an unchanged
    row keeps its ``next_due`` and ``last_fire``. A row a declaration created
    is removed once the class no longer declares it for that key. The
    schedule is validated when the silo registers it (``ReminderError`` naming
    the class and the reminder). ``jitter``, ``starts_at``, ``ends_at``,
    ``payload``, ``retry``, ``overlap``, ``catchup_window`` and ``deadline``
    mean what they mean for ``register_or_update_reminder`` (``ALLOW_ALL`` on a
    class that is not reentrant, or an option the cluster's silos do not all
    know yet, stops the silo at start with ``ConfigurationError``, before it
    writes a row); a declaration whose ``ends_at`` has passed
    creates no row. A declaration is applied at every start, so it cannot be a
    one-shot (it would fire again after each restart) nor take ``max_ticks``
    (the count would start again): register those from code
    (``ConfigurationError``).
    """
    check_keywords(options, _DECLARATION_KEYWORDS, "register_reminder")

    def apply(cls: C) -> C:
        defn = definition_of(cls)
        if not defn.remindable:
            raise ConfigurationError(
                f"@register_reminder needs a Remindable grain; {cls.__qualname__} is not"
            )
        if options.get("period") is None and options.get("cron") is None:
            raise ConfigurationError(
                f"@register_reminder({name!r}) on {cls.__qualname__} needs a period or a "
                "cron: a declaration is applied at every silo start, so a one-shot would "
                "fire again after each restart; register one-shots from code "
                "(register_or_update_reminder(name, at=...))"
            )
        declared = DeclaredReminder(name, keys=None if keys is None else tuple(keys), **options)
        # Durations become timedeltas (the fingerprint hashes them), the action an enum.
        durations: dict[str, Any] = {
            what: _seconds(getattr(declared, what), what) for what in DURATION_OPTIONS
        }
        declared = replace(
            declared,
            priority=ReminderPriority.NORMAL if declared.priority is None else declared.priority,
            action=_declared_action(cls, name, declared.action),
            **durations,
        )
        others = tuple(r for r in defn.reminders if r.name != name)
        _replace_definition(cls, reminders=(declared, *others))
        return cls

    return apply
