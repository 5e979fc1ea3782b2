"""Calendar operations: set, read and delete named calendars, and move their users.

A calendar is stored by name (``stores.CalendarStore``) and each row that uses
it keeps a copy of its rules (``ReminderEntry``), so owners compute slots from
the row alone. ``set_calendar`` stores the new rules under a new version,
then walks the rows that use the calendar (the label index's ``c:<name>``
term: the cost follows those rows, never the table) and rewrites each one
still on an older version: the new rules, and ``next_due`` moved to its first
fire time after now (as ``repair`` moves a row; a paused row to the first fire
time at or after the slot it stopped at). Each rewrite is a whole-row write
guarded by the etag read (``upsert_if``; a lost race is read again), published
on the change feed like any management write, so the silo that holds the row
applies it at once and the others find it in the table: every reminder that
uses the calendar gets the change once, live, whether held in memory or not.
A row the new rules leave without any slot is paused (and counted). A
registration that raced the walk is written again by the registry, and a
walk that was cut short (the caller died) is finished by calling
``set_calendar`` again, or ``refresh``: rows already on the current version
are skipped.

``delete_calendar`` refuses while a reminder uses the calendar, unless
``force``: then each user is detached (no calendar, ``next_due`` moved to its
first slot after now) before the calendar goes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId
from orleanspy.reminders.calendars import Calendar, StoredCalendar, check_calendar_name
from orleanspy.reminders.labels import calendar_term
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.schedule import schedule_for
from orleanspy.reminders.stores import CalendarStore, IndexedReminderTable
from orleanspy.reminders.table import ReminderTable
from orleanspy.serialization import register_type
from orleanspy.versions import Feature

__all__ = ["CalendarChange", "CalendarOperations", "Operations"]


class Operations(Protocol):
    """What the calendar and backfill operations use of ``ReminderOperations``."""

    @property
    def table(self) -> ReminderTable: ...

    def now(self) -> datetime: ...

    def require(self, feature: Feature | str, what: str = "") -> None: ...

    def told(self, entry: ReminderEntry) -> None: ...

    def backfill_started(self) -> None: ...

    async def get(self, grain: GrainId, name: str) -> ReminderEntry: ...


_MS = timedelta(milliseconds=1)
#: Lost etag races one row's rewrite takes before the walk gives up on it.
_ATTEMPTS = 5
#: Rows per index read of a walk.
_PAGE = 500


@dataclass(frozen=True, slots=True)
class CalendarChange:
    """What ``set_calendar`` (or ``refresh``) did: the calendar's ``version``, the
    reminders moved to it (``updated``), and those it left without any slot,
    paused (``paused``)."""

    name: str
    version: int
    updated: int = 0
    paused: int = 0


register_type(CalendarChange, name="orleanspy.CalendarChange")


class CalendarOperations:
    """The calendar operations over ``ops``' table (module docstring)."""

    def __init__(self, ops: Operations) -> None:
        self._ops = ops

    @property
    def _store(self) -> CalendarStore:
        table = self._ops.table
        if not isinstance(table, CalendarStore) or not isinstance(table, IndexedReminderTable):
            raise ReminderError(f"the reminder table ({type(table).__name__}) keeps no calendars")
        return table

    async def set(self, name: str, calendar: Calendar) -> CalendarChange:
        """Store ``calendar`` as ``name`` and move every reminder using it to it."""
        check_calendar_name(name)
        if not isinstance(calendar, Calendar):
            raise ReminderError(
                f"set_calendar takes a Calendar(tz=..., exclude_dates=..., ...), got "
                f"{type(calendar).__name__}"
            )
        self._ops.require(Feature.REMINDER_CALENDARS)
        stored = await self._store.write_calendar(name, calendar)
        return await self._walk(stored)

    async def refresh(self, name: str) -> CalendarChange:
        """Move the reminders still on an older version of calendar ``name`` to
        the current one (what a cut-short ``set`` left)."""
        stored = await self.get(name)
        return await self._walk(stored)

    async def get(self, name: str) -> StoredCalendar:
        """The stored calendar, or ``ReminderError``."""
        check_calendar_name(name)
        stored = await self._store.read_calendar(name)
        if stored is None:
            raise ReminderError(f"unknown calendar {name!r}")
        return stored

    async def all(self) -> list[StoredCalendar]:
        return await self._store.read_calendars()

    async def users(self, name: str, limit: int = 10) -> tuple[int, list[ReminderEntry]]:
        """How many reminders use calendar ``name``, and the first ``limit`` of them."""
        count = 0
        first: list[ReminderEntry] = []
        async for row in self._rows(name):
            count += 1
            if len(first) < limit:
                first.append(row)
        return count, first

    async def delete(self, name: str, *, force: bool = False) -> int:
        """Remove calendar ``name``; refused (``ReminderError`` naming users) while
        a reminder uses it, unless ``force``, which detaches them first. Returns
        how many reminders were detached."""
        stored = await self.get(name)
        count, first = await self.users(name, limit=3)
        if count and not force:
            named = ", ".join(f"{r.grain_id} {r.name!r}" for r in first)
            more = ", ..." if count > len(first) else ""
            raise ReminderError(
                f"calendar {name!r} is used by {count} reminder(s) ({named}{more}): move them "
                "to another calendar, delete them, or delete with force to detach them"
            )
        detached = 0
        if force:
            async for row in self._rows(name):
                if await self._rewrite(row, lambda r: _detached(r, self._ops.now())):
                    detached += 1
        if not await self._store.remove_calendar(name, stored.version):
            raise ReminderError(
                f"calendar {name!r} changed while it was being deleted: delete it again"
            )
        return detached

    # -- parts ---------------------------------------------------------------------

    async def _rows(self, name: str) -> AsyncIterator[ReminderEntry]:
        """Every row that uses calendar ``name`` (index entries of rows that no
        longer do are left out)."""
        table = self._store
        assert isinstance(table, IndexedReminderTable)
        cursor: str | None = None
        while True:
            rows, cursor = await table.read_indexed([calendar_term(name)], cursor, _PAGE)
            for row in rows:
                if row.calendar == name:
                    yield row
            if cursor is None:
                return

    async def _walk(self, stored: StoredCalendar) -> CalendarChange:
        updated = paused = 0
        async for row in self._rows(stored.name):
            if (row.calendar_version or 0) >= stored.version:
                continue
            new = await self._rewrite(row, lambda r: _moved(r, stored, self._ops.now()))
            if new is not None:
                updated += 1
                paused += new.paused and not row.paused
        return CalendarChange(stored.name, stored.version, updated, paused)

    async def _rewrite(self, row: ReminderEntry, change: _Change) -> ReminderEntry | None:
        """Write ``change(row)`` on the etag read, reading again after a lost race;
        ``None`` if the row went, or no longer needs it."""
        for _ in range(_ATTEMPTS):
            new = change(row)
            if new is None:
                return None
            assert row.etag is not None
            etag = await self._ops.table.upsert_if(new, row.etag)
            if etag is not None:
                written = new.with_etag(etag)
                self._ops.told(written)
                return written
            current = await self._ops.table.read(row.grain_id, row.name)
            if current is None:
                return None
            row = current
        raise ReminderError(
            f"could not move reminder {row.name!r} of {row.grain_id} to its calendar's change: "
            f"it kept changing ({_ATTEMPTS} attempts); set the calendar again to finish"
        )


_Change = Callable[[ReminderEntry], ReminderEntry | None]


def _moved(row: ReminderEntry, stored: StoredCalendar, now: datetime) -> ReminderEntry | None:
    """``row`` on ``stored``'s rules, at its first fire time under them (module
    docstring); ``None`` if it uses another calendar now or is already there."""
    if row.calendar != stored.name or (row.calendar_version or 0) >= stored.version:
        return None
    new = replace(row, calendar_version=stored.version, _calendar_rules=stored.calendar)
    schedule = schedule_for(new)
    nxt = schedule.next_after(row.next_due - _MS if row.paused else now)
    if nxt is None:
        return replace(new, paused=True)
    return replace(new, next_due=nxt)


def _detached(row: ReminderEntry, now: datetime) -> ReminderEntry | None:
    """``row`` without its calendar, at its first slot after now (the same
    slot for a paused row, as the calendar did not move it)."""
    if row.calendar is None:
        return None
    new = replace(row, calendar=None, on_excluded=None, calendar_version=None, _calendar_rules=None)
    if row.paused:
        return new
    nxt = schedule_for(new).next_after(now)
    return new if nxt is None else replace(new, next_due=nxt)
