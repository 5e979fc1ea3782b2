"""Reminder rows, priorities, missed-tick actions, tick status, change records."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from orleanspy.clock import from_ms, to_ms
from orleanspy.identity import GrainId
from orleanspy.serialization import register_type

__all__ = [
    "MAX_ERROR_TEXT",
    "FireOutcome",
    "FireRecord",
    "MissedReminder",
    "MissedReminderAction",
    "ReminderChange",
    "ReminderEntry",
    "ReminderPriority",
    "ScheduleUpdate",
    "TickStatus",
    "error_text",
    "row_key",
]


def row_key(grain_id: GrainId, name: str) -> str:
    """``grain_id.canonical|name``: a row's key inside its shard, and its identity in
    the service's memory. (Names cannot contain ``|``; registration refuses them.)"""
    return f"{grain_id.canonical}|{name}"


class ReminderPriority(enum.IntEnum):
    """Named priorities; any int in -128..127 is accepted where a priority is asked."""

    CRITICAL = 100
    NORMAL = 0
    BACKGROUND = -100


class MissedReminderAction(enum.IntEnum):
    """What to do with missed ticks: a tick reached later than its grace after its
    slot (the row's ``grace``, else ``ReminderOptions.missed_tick_grace``), or once
    a further slot of the row has passed too (catch-up is never a burst).

    ``FIRE_IMMEDIATELY``: deliver one tick now for the latest passed slot
    (``TickStatus.missed_ticks`` counts the earlier ones), then resume the grid.
    ``SKIP``: move on to the next future slot (Orleans' only behaviour; the default).
    ``NOTIFY``: skip, and publish a ``MissedReminder`` on ``orleanspy.reminders.missed``.
    """

    FIRE_IMMEDIATELY = 1
    SKIP = 2
    NOTIFY = 3


@dataclass(frozen=True, slots=True)
class ReminderEntry:
    """One reminder row. ``(service_id, grain_id, name)`` identify it.

    Exactly one of ``period`` (interval on the grid ``start_at + k * period``) and
    ``cron`` (with zone ``tz``, default UTC) is set. ``next_due`` is always set
    and is what the due index orders by. ``etag`` is ``None`` until stored.
    ``declared`` marks a row created by a ``@register_reminder`` declaration
    (removed when its declaration goes); rows registered from code have
    ``False`` and are never removed that way.
    ``paused``: the row is kept but out of the due index, so nothing is delivered
    until it is resumed; ``next_due`` keeps the slot it stopped at.
    ``fingerprint`` (declared rows): the declaration that last wrote the row
    (``remindable.declarations.fingerprint``), so a silo re-applies a
    declaration only when the code changed it; ``None`` on other rows.
    ``grace``: how late a tick may be reached and still count as on time (see
    ``MissedReminderAction``); ``None`` means ``ReminderOptions.missed_tick_grace``.
    """

    service_id: str
    grain_id: GrainId
    name: str
    start_at: datetime
    next_due: datetime
    period: timedelta | None = None
    cron: str | None = None
    tz: str | None = None
    last_fire: datetime | None = None
    priority: int = ReminderPriority.NORMAL
    action: MissedReminderAction = MissedReminderAction.SKIP
    etag: str | None = None
    declared: bool = False
    paused: bool = False
    fingerprint: str | None = None
    grace: timedelta | None = None

    def __post_init__(self) -> None:
        # Ints arrive where enums left (msgpack carries IntEnums as ints).
        if type(self.action) is not MissedReminderAction:
            object.__setattr__(self, "action", MissedReminderAction(self.action))

    @property
    def key(self) -> str:
        """``grain_id.canonical|name``: the row's key inside its shard."""
        return row_key(self.grain_id, self.name)

    @property
    def hash(self) -> int:
        """The grain's uniform hash: decides the ring owner and the shard."""
        return self.grain_id.uniform_hash()

    def with_etag(self, etag: str | None) -> ReminderEntry:
        return replace(self, etag=etag)

    def rescheduled(
        self, next_due: datetime, last_fire: datetime | None, etag: str | None
    ) -> ReminderEntry:
        """This row with a new schedule and etag (what a schedule CAS stores).

        Same as ``dataclasses.replace`` with those three fields, at about half
        its cost: a table calls it once per tick.
        """
        return ReminderEntry(
            service_id=self.service_id,
            grain_id=self.grain_id,
            name=self.name,
            start_at=self.start_at,
            next_due=next_due,
            period=self.period,
            cron=self.cron,
            tz=self.tz,
            last_fire=last_fire,
            priority=self.priority,
            action=self.action,
            etag=etag,
            declared=self.declared,
            paused=self.paused,
            fingerprint=self.fingerprint,
            grace=self.grace,
        )

    def to_record(self) -> dict[str, Any]:
        """Storage form: plain msgpack types, times as integer ms since the epoch.
        ``"u"`` (paused) is present only on paused rows, ``"gr"`` (grace, ms) only
        on rows with a grace of their own, ``"f"`` (fingerprint) only on declared
        rows that have one."""
        rec: dict[str, Any] = {
            "s": self.service_id,
            "g": self.grain_id.canonical,
            "n": self.name,
            "a": to_ms(self.start_at),
            "d": to_ms(self.next_due),
            "p": None if self.period is None else self.period // timedelta(milliseconds=1),
            "c": self.cron,
            "z": self.tz,
            "l": None if self.last_fire is None else to_ms(self.last_fire),
            "r": int(self.priority),
            "x": int(self.action),
            "e": self.etag,
            "o": 1 if self.declared else None,
        }
        if self.paused:
            rec["u"] = True
        if self.fingerprint is not None:
            rec["f"] = self.fingerprint
        if self.grace is not None:
            rec["gr"] = self.grace // timedelta(milliseconds=1)
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> ReminderEntry:
        """Inverse of ``to_record``."""
        return cls(
            service_id=rec["s"],
            grain_id=GrainId.parse(rec["g"]),
            name=rec["n"],
            start_at=from_ms(rec["a"]),
            next_due=from_ms(rec["d"]),
            period=None if rec["p"] is None else timedelta(milliseconds=rec["p"]),
            cron=rec["c"],
            tz=rec["z"],
            last_fire=None if rec["l"] is None else from_ms(rec["l"]),
            priority=rec["r"],
            action=MissedReminderAction(rec["x"]),
            etag=rec["e"],
            # Absent in records written before the field existed.
            declared=bool(rec.get("o")),
            paused=bool(rec.get("u", False)),
            fingerprint=rec.get("f"),
            grace=None if rec.get("gr") is None else timedelta(milliseconds=rec["gr"]),
        )


#: The longest exception text a fire record keeps.
MAX_ERROR_TEXT = 500


def error_text(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` for a fire record (the remote type for a
    ``RemoteGrainError``), cut to ``MAX_ERROR_TEXT`` characters."""
    kind = getattr(exc, "remote_type", None) or type(exc).__name__
    message = getattr(exc, "remote_message", None)
    text = f"{kind}: {exc if message is None else message}"
    return text if len(text) <= MAX_ERROR_TEXT else text[: MAX_ERROR_TEXT - 1] + "…"


class FireOutcome(enum.StrEnum):
    """What became of one slot of a reminder (an entry of its fire history)."""

    OK = "ok"  #: delivered; receive_reminder returned
    GRAIN_ERROR = "grain_error"  #: delivered; receive_reminder raised (not retried)
    MISSED_SKIPPED = "missed_skipped"  #: reached past the grace and skipped (SKIP)
    NOTIFIED = "notified"  #: skipped, and a MissedReminder published (NOTIFY)


@dataclass(frozen=True, slots=True)
class FireRecord:
    """One entry of a reminder's fire history.

    ``slot``: the scheduled slot (for a triggered tick, when it was asked for);
    ``at``: when the silo delivered or skipped it; ``silo``: that silo's name (its
    address for a triggered tick, which the management grain delivers); ``error``:
    for ``GRAIN_ERROR``, the exception ``receive_reminder`` raised, as
    ``Type: message`` (at most ``MAX_ERROR_TEXT`` characters), else ``None``.
    """

    grain_id: GrainId
    name: str
    slot: datetime
    at: datetime
    outcome: FireOutcome
    silo: str
    triggered: bool = False
    error: str | None = None

    def __post_init__(self) -> None:
        # Strings arrive where the enum left (msgpack carries StrEnums as str).
        if type(self.outcome) is not FireOutcome:
            object.__setattr__(self, "outcome", FireOutcome(self.outcome))

    @property
    def lateness(self) -> timedelta:
        return self.at - self.slot

    def to_record(self) -> dict[str, Any]:
        """Storage form (the row is known from where it is stored)."""
        rec: dict[str, Any] = {
            "t": to_ms(self.slot),
            "a": to_ms(self.at),
            "o": self.outcome.value,
            "s": self.silo,
        }
        if self.triggered:
            rec["x"] = True
        if self.error is not None:
            rec["m"] = self.error
        return rec

    @classmethod
    def from_record(cls, grain_id: GrainId, name: str, rec: dict[str, Any]) -> FireRecord:
        return cls(
            grain_id=grain_id,
            name=name,
            slot=from_ms(rec["t"]),
            at=from_ms(rec["a"]),
            outcome=FireOutcome(rec["o"]),
            silo=str(rec["s"]),
            triggered=bool(rec.get("x", False)),
            error=None if rec.get("m") is None else str(rec["m"]),
        )


@dataclass(frozen=True, slots=True)
class ReminderChange:
    """A write to the reminder table: ``next_due`` is ``None`` when the row was removed.

    ``priority`` is set by writes that replace the whole row (``upsert``: a
    registration or a management call) to the row's priority, and ``None`` for
    schedule CASes and removals (see ``ReminderTable``). ``entry``: the row as
    written, with its new etag, when the writer is in this process (a local
    registration or management call; tables' change feeds never carry it), so
    the reminder service applies it at once, without reading it back. Neither
    takes part in equality.
    """

    grain_id: GrainId
    name: str
    next_due: datetime | None
    priority: int | None = field(default=None, compare=False)
    entry: ReminderEntry | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ScheduleUpdate:
    """One compare-and-swap of a row's schedule (see ``ReminderTable.update_schedule``)."""

    grain_id: GrainId
    name: str
    etag: str
    next_due: datetime
    last_fire: datetime | None


@dataclass(frozen=True, slots=True)
class TickStatus:
    """What ``receive_reminder`` is told about a tick.

    ``current_tick_time`` is the scheduled slot (Orleans gives the delivery start
    time there; we give it as ``delivered_at``). ``missed_ticks`` counts the slots
    that passed undelivered and are coalesced into this tick (FIRE_IMMEDIATELY).
    ``triggered``: an extra tick asked for by an operator (``trigger``), off the
    schedule; ``current_tick_time`` is then the time it was asked for.
    """

    first_tick_time: datetime
    period: timedelta | None
    cron: str | None
    current_tick_time: datetime
    delivered_at: datetime
    missed_ticks: int = 0
    priority: int = ReminderPriority.NORMAL
    triggered: bool = False


@dataclass(frozen=True, slots=True)
class MissedReminder:
    """Published on ``orleanspy.reminders.missed`` for rows whose action is NOTIFY."""

    service_id: str
    grain_id: GrainId
    name: str
    scheduled: datetime
    detected_at: datetime
    missed_ticks: int
    next_due: datetime


register_type(ReminderEntry, name="orleanspy.ReminderEntry")
register_type(TickStatus, name="orleanspy.TickStatus")
register_type(MissedReminder, name="orleanspy.MissedReminder")
register_type(FireRecord, name="orleanspy.FireRecord")
