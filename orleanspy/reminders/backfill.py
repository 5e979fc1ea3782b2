"""Backfill jobs: every slot of a reminder's schedule in a past range, delivered again.

``BackfillJob`` is what the store keeps of one backfill (``stores.BackfillStore``):
the row it is for, the range ``[start, end)``, its progress ``next`` (every slot
before it is done) and counts. The silo that owns the row runs it
(``reminders._service.backfill``), slot after slot at a bounded rate, and
writes the progress after each slot with a compare-and-swap on the job's
``etag``, so a silo that dies mid-backfill leaves the job where it was and the
next owner goes on from there (the slot in flight is delivered again: at least
once, with the same ``TickStatus.occurrence_id``). Removing the job cancels it:
the runner's next progress write loses, and it stops.

``backfill_schedule`` gives the slots: the row's schedule with its calendar,
without jitter and bounds (a backfill's range is its own bound), an interval
grid extended back before ``start_at`` so that a range before the reminder
existed has slots too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

from orleanspy.clock import from_ms, to_ms
from orleanspy.identity import GrainId
from orleanspy.reminders.calendars import CalendarSchedule, Excluded
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.schedule import IntervalSchedule, OneShotSchedule, Schedule, cron_schedule
from orleanspy.serialization import register_type

__all__ = ["MAX_BACKFILL_SLOTS", "BackfillJob", "backfill_schedule", "count_slots"]

#: The most slots one backfill may deliver (split a larger range).
MAX_BACKFILL_SLOTS: Final = 100_000

_MS = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class BackfillJob:
    """One backfill of reminder ``name`` of ``grain_id`` (module docstring).

    ``start``/``end``: the range, ``[start, end)``; ``next``: the slots before it
    are done (``start`` at first, ``end`` when finished); ``total``: the slots
    the range held when the backfill was asked for; ``delivered``: slots whose
    tick the grain acknowledged; ``failed``: slots whose ``receive_reminder``
    raised (not retried; the backfill goes on). ``overlap``: the overlap
    policy asked for (by name), ``None`` for the reminder's own. ``created``:
    when it was asked for. ``etag``: the store's version, ``None`` until stored.
    """

    grain_id: GrainId
    name: str
    start: datetime
    end: datetime
    next: datetime
    total: int
    delivered: int = 0
    failed: int = 0
    overlap: str | None = None
    created: datetime | None = None
    etag: str | None = None

    @property
    def key(self) -> str:
        """The row's key (``ReminderEntry.key``)."""
        return f"{self.grain_id.canonical}|{self.name}"

    @property
    def done(self) -> int:
        """Slots handled so far (delivered or failed)."""
        return self.delivered + self.failed

    def advanced(self, next_slot: datetime, *, ok: bool) -> BackfillJob:
        """This job after one more slot, the next one at ``next_slot``."""
        return replace(
            self,
            next=next_slot,
            delivered=self.delivered + ok,
            failed=self.failed + (not ok),
        )

    def with_etag(self, etag: str | None) -> BackfillJob:
        return replace(self, etag=etag)

    def to_record(self) -> dict[str, Any]:
        """Storage form (plain msgpack types; the etag is the store's)."""
        rec: dict[str, Any] = {
            "g": self.grain_id.canonical,
            "n": self.name,
            "s": to_ms(self.start),
            "e": to_ms(self.end),
            "x": to_ms(self.next),
            "t": self.total,
            "d": self.delivered,
            "f": self.failed,
        }
        if self.overlap is not None:
            rec["o"] = self.overlap
        if self.created is not None:
            rec["c"] = to_ms(self.created)
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any], etag: str | None = None) -> BackfillJob:
        created = rec.get("c")
        return cls(
            grain_id=GrainId.parse(str(rec["g"])),
            name=str(rec["n"]),
            start=from_ms(int(rec["s"])),
            end=from_ms(int(rec["e"])),
            next=from_ms(int(rec["x"])),
            total=int(rec["t"]),
            delivered=int(rec.get("d", 0)),
            failed=int(rec.get("f", 0)),
            overlap=None if rec.get("o") is None else str(rec["o"]),
            created=None if created is None else from_ms(int(created)),
            etag=etag,
        )


def backfill_schedule(row: ReminderEntry, start: datetime) -> Schedule:
    """The slots a backfill of ``row`` from ``start`` on delivers (module
    docstring): no jitter, no bounds; an interval grid anchored on the row's
    ``start_at``, extended back to ``start``."""
    base: Schedule
    if row.cron is not None:
        base = cron_schedule(row.cron, row.tz)
    elif row.period is not None:
        period_ms = row.period // _MS
        behind = max(0, to_ms(row.start_at) - to_ms(start))
        steps = -(-behind // period_ms)
        base = IntervalSchedule(from_ms(to_ms(row.start_at) - steps * period_ms), row.period)
    else:
        base = OneShotSchedule(row.start_at)
    rules = row.calendar_rules
    if rules is not None:
        base = CalendarSchedule(base, rules, row.on_excluded or Excluded.SKIP)
    return base


def count_slots(schedule: Schedule, start: datetime, end: datetime, cap: int) -> int:
    """The slots in ``[start, end)``, counting at most ``cap + 1`` (so a caller
    can tell "more than ``cap``")."""
    return schedule.slots_between(start - _MS, end - _MS, cap=cap + 1)


register_type(BackfillJob, name="orleanspy.BackfillJob")
