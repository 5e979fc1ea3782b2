"""Optional contracts of a reminder table's store: the label index, calendars, backfills.

Each is a ``typing.Protocol`` a table may offer beside ``ReminderTable``; the
memory, Redis and PostgreSQL tables offer all three. The management
operations check for them and say clearly when a table lacks one.

The label index (``IndexedReminderTable``). Every row carries *terms*
(``ReminderEntry.index_terms``: ``l:<key>=<value>`` per label, ``c:<name>``
for its calendar), and the table keeps an index from each term to the rows
that carry it, maintained atomically with the row by every whole-row write
and removal (Redis: per shard a sorted set per term under the shard's hash
tag, written by the same script as the row; PostgreSQL: an index table
written by the same statement). ``read_indexed`` pages through the rows that
carry *every* given term, a page costing the rows of the first term it walks
(plus, on Redis, the shards it steps over), never the table. A row written or
removed during a walk may or may not be returned; one present throughout is
returned once. The index may briefly hold a row that no longer carries a term
(written by a release that does not keep the index): readers check the rows
they get (``ReminderEntry.index_terms``), and tables leave such rows out.
Schedule CASes do not change terms and do not touch the index.

Calendars (``CalendarStore``). Named ``Calendar`` rules of the service, each
with a version that grows with every write (``StoredCalendar``).
``write_calendar`` replaces unconditionally and returns the new version;
``remove_calendar`` removes only while the calendar is still at the version
given. The rows that use a calendar are found through the index
(``calendar_term``).

Backfills (``BackfillStore``). At most one ``BackfillJob`` per row.
``add_backfill`` stores a new one only if the row has none (else ``None``);
``update_backfill`` is a compare-and-swap on the job's etag (``None``: gone or
moved on); ``remove_backfill`` removes it (with an etag: only at that etag).
``read_backfills`` returns every job of the service (there are few: a job
exists only while it runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from orleanspy.identity import GrainId
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.calendars import Calendar, StoredCalendar
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.table import ReminderTable

__all__ = ["BackfillStore", "CalendarStore", "IndexedReminderTable", "has_terms"]


@runtime_checkable
class IndexedReminderTable(ReminderTable, Protocol):
    """A table with a label index (module docstring)."""

    async def read_indexed(
        self, terms: Sequence[str], cursor: str | None, limit: int
    ) -> tuple[list[ReminderEntry], str | None]:
        """One page (at most ``limit`` >= 1 rows) of the rows carrying every term
        of ``terms`` (at least one), after ``cursor`` (``None``: from the start),
        in a stable order of the table's; the next cursor, ``None`` once the
        walk is done (a short page does not by itself mean the end)."""
        ...

    async def count_indexed(self, term: str) -> int:
        """How many rows carry ``term``, from the index (never by reading rows;
        a row the index holds stale may be counted)."""
        ...


@runtime_checkable
class CalendarStore(Protocol):
    """Named calendars (module docstring)."""

    async def write_calendar(self, name: str, calendar: Calendar) -> StoredCalendar:
        """Store ``calendar`` under ``name`` (replacing any); the stored calendar
        with its new version, above every version the store gave before."""
        ...

    async def read_calendar(self, name: str) -> StoredCalendar | None:
        """The calendar ``name``, or ``None``."""
        ...

    async def read_calendars(self) -> list[StoredCalendar]:
        """Every calendar of the service, by name."""
        ...

    async def remove_calendar(self, name: str, version: int) -> bool:
        """Remove calendar ``name`` if it is still at ``version``; ``True`` if removed."""
        ...


@runtime_checkable
class BackfillStore(Protocol):
    """Backfill jobs (module docstring)."""

    async def add_backfill(self, job: BackfillJob) -> BackfillJob | None:
        """Store ``job`` if its row has no job; the job with its etag, else ``None``."""
        ...

    async def read_backfill(self, grain_id: GrainId, name: str) -> BackfillJob | None: ...

    async def read_backfills(self) -> list[BackfillJob]:
        """Every job of the service, in key order."""
        ...

    async def update_backfill(self, job: BackfillJob, etag: str) -> str | None:
        """Replace the row's job with ``job`` if its etag is ``etag``; the new
        etag, or ``None`` when it is gone or moved on."""
        ...

    async def remove_backfill(self, grain_id: GrainId, name: str, etag: str | None = None) -> bool:
        """Remove the row's job (only at ``etag`` when given); ``True`` if removed."""
        ...


def has_terms(row: ReminderEntry, terms: Sequence[str]) -> bool:
    """Whether ``row`` carries every term of ``terms`` (a reader's check of what
    the index gave it)."""
    mine = row.index_terms()
    return all(t in mine for t in terms)
