"""The reminder management operations, written once over a ``ReminderTable``.

``ReminderOperations`` is what the management grain (``client.reminders``) and
the CLI's direct path (no silo up) both call, so the two cannot drift. Every
write goes through ``self.audit`` (``remindable.audit.Auditor``), which
records the action in the audit log together with the write: the one choke
point of the management path. Every write of a row is a read-modify-write
guarded by the etag read (``ReminderTable.upsert_if``, ``remove``): a row that
a silo's tick, another operator or a start-up declaration moved between the
read and the write is read again and the change re-applied to what is there
now, so no write is lost to a stale copy. After ``audit.ATTEMPTS`` lost races
in a row the operation fails with ``ReminderError`` and nothing of it is
written.

Walks over many rows (``page``, ``count``, ``delete_where``, ``export``) read
the table a page at a time (``ReminderTable.read_page``): memory follows the
page size, never the table. Given a label selector (``labels={"tenant":
"acme"}``, or ``"tenant=acme"`` text: ``labels.parse_selector``) they walk the
table's label index instead (``stores.IndexedReminderTable.read_indexed``),
so they cost the selected rows, never the table; ``pause_where`` and
``resume_where`` pause and resume what a selector selects. Calendars
(``set_calendar``, ...) are ``remindable.calendars``' and backfills
(``backfill``, ...) ``remindable.backfills``'.

A row is *orphaned* when its grain type is hosted by no silo of the cluster
(``hosted_types``, given by the caller): nobody can receive its ticks, and
only an operator can remove it (dotnet/orleans #9114, #2419).

A row's counters (``counters``, ``read_counters``) and the service's dead
letters (``dead_letters``, ``dead_letter``, ``replay``, ``discard``) are read
and changed here too, on tables that keep them (``CountingReminderTable``,
``DeadLetterTable``). ``replay_letter`` needs a silo to deliver the tick (``deliver``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from orleanspy.clock import Clock, from_ms
from orleanspy.errors import ReminderError
from orleanspy.grain import Grain, GrainDefinition, check_overlap, definition_of
from orleanspy.identity import GrainId, GrainKey
from orleanspy.options import ReminderOptions
from orleanspy.remindable.audit import Auditor
from orleanspy.remindable.backfills import BackfillOperations
from orleanspy.remindable.calendars import CalendarChange, CalendarOperations
from orleanspy.reminders.audit import (
    AuditAction,
    AuditedReminderTable,
    AuditQuery,
    AuditRecord,
    AuditRetention,
)
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.calendars import Calendar, StoredCalendar
from orleanspy.reminders.counters import CountingReminderTable, ReminderCounters
from orleanspy.reminders.describe import ReminderDescription, next_fire_times
from orleanspy.reminders.labels import matches, parse_selector, selector_terms
from orleanspy.reminders.letters import (
    MAX_DEAD_LETTER_PAGE,
    DeadLetter,
    DeadLetterPage,
    DeadLetterTable,
    failed_again,
)
from orleanspy.reminders.model import (
    FireRecord,
    MissedReminderAction,
    ReminderEntry,
    TickStatus,
)
from orleanspy.reminders.policies import needed_features
from orleanspy.reminders.schedule import next_slot
from orleanspy.reminders.spec import (
    LATEST_TICK,
    ReminderSpec,
    check_grace,
    new_entry,
    spec_of_row,
)
from orleanspy.reminders.stores import BackfillStore, CalendarStore, IndexedReminderTable
from orleanspy.reminders.table import (
    PausableReminderTable,
    ReminderTable,
    grain_prefix,
)
from orleanspy.serialization import register_type
from orleanspy.versions import PROTOCOL, Feature, FeatureUnavailableError

__all__ = [
    "DeliverTick",
    "ImportResult",
    "ReminderOperations",
    "ReminderPage",
    "grain_target",
    "parse_grain_id",
    "read_counters",
]

#: Rows per table read when walking the table.
PAGE = 500
#: The most rows one page may ask for.
MAX_PAGE = 10_000

EPOCH = from_ms(0)

#: Told of every row written (``entry``) or removed (``None``) through the
#: operations, so the local reminder service hears of it at once.
Notify = Callable[[GrainId, str, ReminderEntry | None], None]
#: Delivers one tick off the schedule, as the reminder service does (a silo's).
DeliverTick = Callable[[GrainId, str, TickStatus], Awaitable[object]]


async def read_counters(table: object, grain: GrainId, name: str) -> ReminderCounters:
    """The counters of ``grain``'s reminder ``name`` (``reminders.counters``):
    all zero for a row without any, a missing row, or a table that keeps none.
    One read; what a reminder's description shows."""
    if not isinstance(table, CountingReminderTable):
        return ReminderCounters()
    return await table.read_counts(grain, name)


def _where(type_name: str | None, key_prefix: str | None, labels: object) -> dict[str, object]:
    """What a batch action selected, for its audit record (a label selector only
    when one was given)."""
    where: dict[str, object] = {"type": type_name, "key_prefix": key_prefix}
    if labels is not None:
        where["labels"] = labels if isinstance(labels, str | dict) else str(labels)
    return where


def parse_grain_id(text: str) -> GrainId:
    """``Type/key`` (a string key, possibly empty: ``Type/`` is the key ``""``,
    as ``reminders list`` prints it) or the canonical ``Type/s:key``,
    ``Type/i:42``, ``Type/u:<uuid>``; ``ValueError`` saying the forms otherwise."""
    try:
        return GrainId.parse(text)
    except ValueError:
        pass
    type_name, sep, key = text.partition("/")
    if not sep or not type_name:
        raise ValueError(
            f"not a grain id: {text!r}; write TYPE/KEY (a string key, TYPE/ for the "
            "empty key) or TYPE/i:42, TYPE/u:UUID"
        )
    return GrainId(type_name, key)


def grain_target(grain: Any, key: GrainKey | None = None) -> GrainId:
    """The grain a management call names, in any of its forms: a ``GrainId``; a
    grain proxy; ``"Type/key"`` (``parse_grain_id``); a grain class, or a type
    name, with ``key``; or a ``(class or type name, key)`` pair (lists too:
    that is how a pair arrives through the codec). ``ReminderError`` otherwise."""
    if key is not None:
        return GrainId(_type_name(grain), _key(key))
    if isinstance(grain, GrainId):
        return grain
    if isinstance(grain, str):
        try:
            return parse_grain_id(grain)
        except ValueError as exc:
            raise ReminderError(str(exc)) from None
    if isinstance(grain, tuple | list) and len(grain) == 2:
        return GrainId(_type_name(grain[0]), _key(grain[1]))
    of_reference = getattr(grain, "__orleanspy_grain_id__", None)
    if of_reference is not None:
        gid, _ = of_reference()
        if isinstance(gid, GrainId):
            return gid
    raise ReminderError(
        f"not a grain: {grain!r}; pass a GrainId, a grain proxy, 'Type/key', "
        "or a grain class (or type name) and a key"
    )


def _type_name(what: Any) -> str:
    if isinstance(what, str) and what:
        return what
    if isinstance(what, type) and issubclass(what, Grain):
        return definition_of(what).type_name
    raise ReminderError(f"not a grain type: {what!r}; pass a grain class or a type name")


def _key(key: Any) -> GrainKey:
    if isinstance(key, bool) or not isinstance(key, str | int | uuid.UUID):
        raise ReminderError(f"not a grain key: {key!r}; a key is a str, int or UUID")
    return key


@dataclass(frozen=True, slots=True)
class ReminderPage:
    """One page of rows and the cursor of the next (``None``: the walk is done).
    ``orphaned`` holds the keys (``ReminderEntry.key``) of the page's orphaned rows."""

    rows: list[ReminderEntry]
    cursor: str | None
    orphaned: list[str] = field(default_factory=list)

    def is_orphaned(self, row: ReminderEntry) -> bool:
        return row.key in self.orphaned


@dataclass(frozen=True, slots=True)
class ImportResult:
    """What an import did (or, with ``dry_run``, would do): rows ``created``;
    rows that ``exist`` already and were left alone; rows ``replaced``
    (``replace=True``); rows that changed while being replaced (``conflicts``,
    left as they are)."""

    created: int = 0
    exist: int = 0
    replaced: int = 0
    conflicts: int = 0


register_type(ReminderPage, name="orleanspy.ReminderPage")
register_type(ImportResult, name="orleanspy.ImportResult")


class ReminderOperations:
    """Inspect and change reminder rows over ``table`` (module docstring).

    ``service_id`` is the service whose rows the table holds (imported rows
    are rewritten to it); ``notify`` hears of every write; ``hosted_types``
    gives the grain types some silo of the cluster hosts (``None``: unknown,
    nothing is called orphaned); ``require`` checks that the cluster has a
    feature a write needs (``FeatureUnavailableError``; ``None``: a process of
    its own, which has them all); ``definitions`` gives the grain classes
    known here (imported rows are checked against them); ``backfill_started``
    is told of each backfill asked for here.
    """

    def __init__(
        self,
        table: ReminderTable,
        *,
        service_id: str,
        clock: Clock,
        options: ReminderOptions,
        notify: Notify | None = None,
        hosted_types: Callable[[], Awaitable[Iterable[str]]] | None = None,
        level: Callable[[], int] = lambda: PROTOCOL,
        via: str | None = None,
        require: Callable[[Feature | str, str], None] | None = None,
        definitions: Callable[[str], GrainDefinition | None] | None = None,
        backfill_started: Callable[[], None] | None = None,
    ) -> None:
        self.table = table
        self.service_id = service_id
        self._clock = clock
        self._options = options
        self._hosted_types = hosted_types
        #: Every write of the operations goes through it (module docstring).
        self.audit = Auditor(
            table,
            clock=clock,
            retention=AuditRetention(options.audit_retention, options.audit_max_records),
            notify=notify,
            level=level,
            via=via,
        )
        self._require = require
        self._definitions = definitions
        self._backfill_started = backfill_started
        self._calendars = CalendarOperations(self)
        self._backfills = BackfillOperations(self)

    def require(self, feature: Feature | str, what: str = "") -> None:
        """``FeatureUnavailableError`` unless the cluster has ``feature`` on."""
        if self._require is not None:
            self._require(feature, what)

    def backfill_started(self) -> None:
        if self._backfill_started is not None:
            self._backfill_started()

    # -- calendars and backfills (``remindable.calendars``, ``remindable.backfills``) --

    async def set_calendar(self, name: str, calendar: Calendar) -> CalendarChange:
        """Store calendar ``name`` and move every reminder that uses it to it."""
        async with self.audit.pending(
            AuditAction.SET_CALENDAR, detail={"calendar": str(name)[:200]}
        ) as action:
            change = await self._calendars.set(name, calendar)
            # Checked by now: the rules as stored.
            action.detail.update(
                rules=calendar.to_record(),
                version=change.version,
                updated=change.updated,
                paused=change.paused,
            )
        return change

    async def get_calendar(self, name: str) -> Calendar:
        """The calendar ``name``, or ``ReminderError``."""
        return (await self._calendars.get(name)).calendar

    async def calendars(self) -> list[StoredCalendar]:
        """Every calendar, by name, with its version."""
        return await self._calendars.all()

    async def delete_calendar(self, name: str, force: bool = False) -> int:
        """Remove calendar ``name`` (refused while used, unless ``force``); how
        many reminders were detached."""
        async with self.audit.pending(
            AuditAction.DELETE_CALENDAR, detail={"calendar": name, "force": force}
        ) as action:
            detached = await self._calendars.delete(name, force=force)
            action.detail["detached"] = detached
        return detached

    async def refresh_calendar(self, name: str) -> CalendarChange:
        """Move the reminders still on an older version of calendar ``name``."""
        return await self._calendars.refresh(name)

    async def backfill(
        self, grain: GrainId, name: str, start: datetime, end: datetime, overlap: object = None
    ) -> BackfillJob:
        """Deliver every slot of the reminder in ``[start, end)`` again, in order."""
        # Said as text: validated by the backfill, after the pending record.
        asked = {
            "from": str(start),
            "to": str(end),
            "overlap": None if overlap is None else str(overlap),
        }
        async with self.audit.pending(AuditAction.BACKFILL, grain, name, detail=asked) as action:
            job = await self._backfills.start(grain, name, start, end, overlap)
            action.detail["slots"] = job.total
        return job

    async def cancel_backfill(self, grain: GrainId, name: str) -> bool:
        """Cancel the reminder's backfill; ``False`` if none runs."""
        async with self.audit.pending(AuditAction.CANCEL_BACKFILL, grain, name) as action:
            cancelled = await self._backfills.cancel(grain, name)
            action.detail["cancelled"] = cancelled
        return cancelled

    async def backfills(self) -> list[BackfillJob]:
        """Every running backfill, with its progress."""
        return await self._backfills.all()

    # -- reads ---------------------------------------------------------------------

    async def get(self, grain: GrainId, name: str) -> ReminderEntry:
        """The row, or ``ReminderError`` if there is none."""
        row = await self.table.read(grain, name)
        if row is None:
            raise ReminderError(f"{grain} has no reminder {name!r}")
        return row

    async def list_for_grain(self, grain: GrainId) -> list[ReminderEntry]:
        return await self.table.read_grain(grain)

    async def upcoming(self, horizon: timedelta, limit: int = 1000) -> list[ReminderEntry]:
        """Rows due within ``horizon`` from now, in the due order (priority first)."""
        return await self.table.upcoming(self._clock.now() + horizon, limit)

    async def count_all(self) -> int:
        return await self.table.count()

    async def history(self, grain: GrainId, name: str) -> list[FireRecord]:
        """The row's last deliveries, newest first (empty on a table without history)."""
        if not isinstance(self.table, PausableReminderTable):
            return []
        return await self.table.read_history(grain, name)

    async def audit_log(self, query: AuditQuery) -> list[AuditRecord]:
        """The audit records ``query`` selects, newest first (empty on a table
        that keeps no log); never one older than ``audit_retention`` (a store
        may hold such a record until its part of the store trims)."""
        if not isinstance(self.table, AuditedReminderTable):
            return []
        oldest = self._clock.now() - self._options.audit_retention
        if query.since is None or query.since < oldest:
            query = replace(query, since=oldest)
        return await self.table.read_audit(query)

    async def page(
        self,
        cursor: str | None = None,
        limit: int = PAGE,
        type_name: str | None = None,
        key_prefix: str | None = None,
        labels: object = None,
    ) -> ReminderPage:
        """One page of the table's rows (``ReminderTable.read_page``), filtered by
        grain type and key prefix, with the page's orphaned rows flagged. With
        ``labels`` (a selector), the rows that carry every pair, from the label
        index (the type and prefix filter those; a page may then come short)."""
        _check_filter(type_name, key_prefix)
        _check_page(cursor, limit)
        try:
            rows, nxt = await self._read(cursor, limit, type_name, key_prefix, labels)
        except ValueError as exc:  # a cursor of another table, or made up
            raise ReminderError(str(exc)) from None
        hosted = await self.hosted()
        orphaned = [
            r.key for r in rows if hosted is not None and r.grain_id.type_name not in hosted
        ]
        return ReminderPage(rows, nxt, orphaned)

    async def _read(
        self,
        cursor: str | None,
        limit: int,
        type_name: str | None,
        key_prefix: str | None,
        labels: object,
    ) -> tuple[list[ReminderEntry], str | None]:
        """A page of the filter: the grain index, or with ``labels`` the label index."""
        if labels is None:
            return await self.table.read_page(
                cursor, limit, type_name=type_name, key_prefix=key_prefix
            )
        selector = parse_selector(labels)
        table = self.table
        if not isinstance(table, IndexedReminderTable):
            raise ReminderError(
                f"the reminder table ({type(table).__name__}) has no label index: "
                "select rows by grain type instead"
            )
        rows, nxt = await table.read_indexed(selector_terms(selector), cursor, limit)
        prefix = grain_prefix(type_name, key_prefix)
        return [
            r
            for r in rows
            if matches(r.labels, selector) and r.grain_id.canonical.startswith(prefix)
        ], nxt

    async def walk(
        self,
        *,
        type_name: str | None = None,
        key_prefix: str | None = None,
        page: int = PAGE,
        labels: object = None,
    ) -> AsyncIterator[ReminderEntry]:
        """Every row (of the filter, or of the label selector), ``page`` rows per
        table read."""
        cursor: str | None = None
        while True:
            rows, cursor = await self._read(cursor, page, type_name, key_prefix, labels)
            for row in rows:
                yield row
            if cursor is None:
                return

    async def count(
        self, type_name: str | None = None, key_prefix: str | None = None, labels: object = None
    ) -> int:
        """How many rows the filter selects: from the index alone for a whole
        type, the whole table or one label pair, else by walking the selected
        rows (the label index's, with a selector)."""
        _check_filter(type_name, key_prefix)
        if labels is not None:
            selector = parse_selector(labels)
            table = self.table
            if len(selector) == 1 and type_name is None and isinstance(table, IndexedReminderTable):
                return await table.count_indexed(selector_terms(selector)[0])
        elif key_prefix is None:
            if type_name is None:
                return await self.table.count()
            return (await self.table.count_types()).get(type_name, 0)
        n = 0
        async for _ in self.walk(type_name=type_name, key_prefix=key_prefix, labels=labels):
            n += 1
        return n

    async def hosted(self) -> frozenset[str] | None:
        """The grain types some silo hosts, or ``None`` when not known."""
        if self._hosted_types is None:
            return None
        return frozenset(await self._hosted_types())

    async def orphans(self) -> dict[str, int]:
        """Rows per grain type that no silo hosts (empty when that is not known)."""
        hosted = await self.hosted()
        if hosted is None:
            return {}
        counts = await self.table.count_types()
        return {t: n for t, n in sorted(counts.items()) if t not in hosted}

    # -- writes --------------------------------------------------------------------

    async def set_priority(self, grain: GrainId, name: str, priority: int) -> ReminderEntry:
        """Change a row's priority (validated like a registration)."""
        new_entry(  # validation only
            ReminderSpec(period=timedelta(days=1), priority=priority),
            service_id=self.service_id,
            grain_id=grain,
            name=name,
            now=self._clock.now(),
            options=self._options,
        )
        return await self.audit.change(
            AuditAction.SET_PRIORITY,
            grain,
            name,
            lambda r: r if r.priority == priority else replace(r, priority=int(priority)),
            detail={"priority": int(priority)},
        )

    async def set_action(
        self, grain: GrainId, name: str, action: MissedReminderAction
    ) -> ReminderEntry:
        """Change what happens to the row's missed ticks."""
        try:
            action = MissedReminderAction(action)
        except ValueError:
            raise ReminderError(
                f"not a missed-tick action: {action!r}; use "
                + ", ".join(a.name.lower() for a in MissedReminderAction)
            ) from None
        chosen = action
        return await self.audit.change(
            AuditAction.SET_ACTION,
            grain,
            name,
            lambda r: r if r.action is chosen else replace(r, action=chosen),
            detail={"action": chosen.name.lower()},
        )

    async def set_grace(
        self, grain: GrainId, name: str, grace: timedelta | float | None
    ) -> ReminderEntry:
        """Change how late the row's ticks may be and still count as on time
        (``None``: back to ``ReminderOptions.missed_tick_grace``). The schedule
        does not move."""
        checked = check_grace(grace)
        return await self.audit.change(
            AuditAction.SET_GRACE,
            grain,
            name,
            lambda r: r if r.grace == checked else replace(r, grace=checked),
            detail={"grace_s": None if checked is None else checked.total_seconds()},
        )

    async def repair(self, grain: GrainId, name: str) -> ReminderEntry:
        """Move a row's ``next_due`` to its first slot after now (skipping missed ones)."""
        now = self._clock.now()
        return await self.audit.change(
            AuditAction.REPAIR, grain, name, lambda r: replace(r, next_due=next_slot(r, now))
        )

    async def pause(self, grain: GrainId, name: str) -> ReminderEntry:
        """Keep the row but deliver nothing until ``resume`` (the flag is stored)."""
        self._check_pausable("pause", grain, name)
        return await self.audit.change(
            AuditAction.PAUSE, grain, name, lambda r: r if r.paused else replace(r, paused=True)
        )

    async def resume(self, grain: GrainId, name: str) -> ReminderEntry:
        """Deliver again from the slot the row stopped at (missed slots follow its
        action, and count as skipped while paused: ``resumed_at``, once the
        cluster keeps counters)."""
        self._check_pausable("resume", grain, name)
        now = self._clock.now() if self._has("REMINDER_COUNTERS") else None
        return await self.audit.change(
            AuditAction.RESUME,
            grain,
            name,
            lambda r: replace(r, paused=False, resumed_at=now or r.resumed_at) if r.paused else r,
        )

    # -- counters and dead letters -----------------------------------------------

    async def counters(self, grain: GrainId, name: str) -> ReminderCounters:
        """The row's counters (``read_counters``); ``ReminderError`` if there is no row."""
        counts = await read_counters(self.table, grain, name)
        await self.get(grain, name)
        return counts

    async def describe(
        self, grain: GrainId, name: str, count: int = 10, after: datetime | None = None
    ) -> ReminderDescription:
        """The row, its next ``count`` fire times after ``after`` (default now),
        its counters, its latest deliveries, its backfill and how many of its
        ticks are dead letters; ``ReminderError`` if there is no row, for a
        ``count`` outside 1..``MAX_FIRE_TIMES`` or a naive ``after``."""
        row = await self.get(grain, name)
        when = self._clock.now() if after is None else after
        # The row read from the table carries its calendar's rules.
        fires = next_fire_times(row, None, count, when)
        counts, recent = await asyncio.gather(
            read_counters(self.table, grain, name), self.history(grain, name)
        )
        table = self.table
        job = await table.read_backfill(grain, name) if isinstance(table, BackfillStore) else None
        letters = 0
        if isinstance(table, DeadLetterTable):
            page, _next = await table.read_dead_letters(
                None, MAX_DEAD_LETTER_PAGE, grain_id=grain, name=name
            )
            letters = len(page)
        return ReminderDescription(row, fires, counts, recent, job, letters)

    async def dead_letters(
        self,
        grain: GrainId | None = None,
        name: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> DeadLetterPage:
        """A page of dead letters, newest first, only ``grain``'s and/or only of
        reminder ``name`` when given; pass the page's cursor for the next."""
        if not isinstance(cursor, str | None):
            raise ReminderError(f"a page cursor is a string from the previous page, got {cursor!r}")
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_DEAD_LETTER_PAGE
        ):
            raise ReminderError(
                f"a page holds 1..{MAX_DEAD_LETTER_PAGE} dead letters, got {limit!r}"
            )
        if name is not None and (not isinstance(name, str) or not name):
            raise ReminderError(f"a reminder name is a non-empty string, got {name!r}")
        table = self.table
        if not isinstance(table, DeadLetterTable):
            return DeadLetterPage([], None)
        try:
            letters, nxt = await table.read_dead_letters(cursor, limit, grain_id=grain, name=name)
        except ValueError as exc:  # a cursor of another table, or made up
            raise ReminderError(str(exc)) from None
        return DeadLetterPage(letters, nxt)

    async def count_dead_letters(self) -> int:
        """How many dead letters the service has."""
        table = self.table
        return await table.count_dead_letters() if isinstance(table, DeadLetterTable) else 0

    async def dead_letter(self, letter_id: str) -> DeadLetter:
        """The dead letter ``letter_id``; ``ReminderError`` if there is none."""
        table = self.table
        if not isinstance(letter_id, str) or not letter_id or len(letter_id) > 128:
            raise ReminderError(f"not a dead letter id: {letter_id!r}")
        letter = None
        if isinstance(table, DeadLetterTable):
            letter = await table.read_dead_letter(letter_id)
        if letter is None:
            raise ReminderError(
                f"no dead letter {letter_id!r}: it was replayed, discarded or expired "
                "(orleanspy reminders dead-letters lists those kept)"
            )
        return letter

    async def discard(self, letter_id: str) -> DeadLetter:
        """Remove the dead letter ``letter_id`` without delivering it; the letter
        removed. ``ReminderError`` if there is none (nothing changes)."""
        letter = await self.dead_letter(letter_id)
        assert isinstance(self.table, DeadLetterTable)
        async with self.audit.pending(
            AuditAction.DISCARD, letter.grain_id, letter.name, detail={"letter": letter_id}
        ):
            if not await self.table.remove_dead_letter(letter_id):
                raise ReminderError(f"no dead letter {letter_id!r}: it was removed meanwhile")
        return letter

    async def replay_letter(
        self, letter_id: str, deliver: DeliverTick | None, silo: str = ""
    ) -> TickStatus:
        """Deliver the dead letter ``letter_id`` again as its slot, with its
        occurrence id (a state that committed it dedupes it), through
        ``deliver``; remove it once that succeeds, and return the status
        delivered. If the grain raises again, the letter is kept with that
        failure (one more attempt, the new error, dead-lettered now by ``silo``)
        and the exception reaches the caller. ``ReminderError`` for an unknown
        id or without a silo to deliver it."""
        letter = await self.dead_letter(letter_id)
        if deliver is None:
            raise ReminderError(
                f"cannot replay dead letter {letter_id!r}: a tick is delivered by a silo, and "
                "no gateway of the cluster answered"
            )
        table = self.table
        assert isinstance(table, DeadLetterTable)
        now = self._clock.now()
        status = letter.status(now)
        async with self.audit.pending(
            AuditAction.REPLAY, letter.grain_id, letter.name, detail={"letter": letter_id}
        ):
            try:
                await deliver(letter.grain_id, letter.name, status)
            except Exception as exc:
                options = self._options
                await table.add_dead_letters(
                    [failed_again(letter, exc, now, silo)],
                    keep=options.max_dead_letters,
                    expire_before=now - options.dead_letter_retention,
                )
                raise
            await table.remove_dead_letter(letter_id)
        return status

    async def import_dead_letters(
        self, letters: Iterable[DeadLetter], dry_run: bool = False
    ) -> int:
        """Write exported dead letters into this table as they were (a letter
        whose id is kept already is replaced), bounded as the service bounds
        them; how many were written (with ``dry_run``: would be). Needs the
        cluster's ``DEAD_LETTERS`` feature; ``ReminderError`` for a table that
        keeps none."""
        checked = list(letters)
        for letter in checked:
            if not isinstance(letter, DeadLetter):
                raise ReminderError(f"not a dead letter: {type(letter).__name__}")
        if not checked:
            return 0
        if self._require is not None:
            self._require("DEAD_LETTERS", f"an import of {len(checked)} dead letters")
        table = self.table
        if not isinstance(table, DeadLetterTable):
            raise ReminderError(
                f"the reminder table ({type(table).__name__}) keeps no dead letters"
            )
        if not dry_run:
            options = self._options
            await table.add_dead_letters(
                checked,
                keep=options.max_dead_letters,
                expire_before=self._clock.now() - options.dead_letter_retention,
            )
        return len(checked)

    async def delete(self, grain: GrainId, name: str) -> bool:
        """Remove a row; ``False`` if it did not exist. A row moved between the
        read and the remove is read again (a tick moves it)."""
        return await self.audit.remove(AuditAction.DELETE, grain, name)

    async def delete_where(
        self,
        type_name: str | None = None,
        key_prefix: str | None = None,
        dry_run: bool = False,
        labels: object = None,
    ) -> int:
        """Remove every row of ``type_name`` (with a string key starting with
        ``key_prefix``), or of the label selector ``labels`` (and the type, if
        given), a page at a time; how many were removed (with ``dry_run``: would
        be). Each remove is checked against the etag read, so a row rewritten
        meanwhile (re-registered by its grain) is kept."""
        if not type_name and labels is None:
            raise ReminderError(
                "delete_where needs a grain type or a label selector (it never empties the table)"
            )
        _check_filter(type_name, key_prefix)
        if dry_run:
            return await self.count(type_name=type_name, key_prefix=key_prefix, labels=labels)
        removed = 0
        where = _where(type_name, key_prefix, labels)
        async with self.audit.pending(AuditAction.DELETE_WHERE, detail=where) as batch:
            try:
                async for row in self.walk(
                    type_name=type_name, key_prefix=key_prefix, labels=labels
                ):
                    if await self.audit.remove(
                        AuditAction.DELETE_WHERE, row.grain_id, row.name, expect=row,
                        batch=batch.id,
                    ):  # fmt: skip
                        removed += 1
            finally:
                batch.detail["removed"] = removed
        return removed

    async def pause_where(
        self,
        labels: object = None,
        type_name: str | None = None,
        key_prefix: str | None = None,
        dry_run: bool = False,
    ) -> int:
        """Pause every row the label selector (and type filter) selects; how many
        were paused (already paused rows are not counted)."""
        return await self._pause_where(True, labels, type_name, key_prefix, dry_run)

    async def resume_where(
        self,
        labels: object = None,
        type_name: str | None = None,
        key_prefix: str | None = None,
        dry_run: bool = False,
    ) -> int:
        """Resume every paused row the label selector (and type filter) selects;
        how many were resumed."""
        return await self._pause_where(False, labels, type_name, key_prefix, dry_run)

    async def _pause_where(
        self,
        pause: bool,
        labels: object,
        type_name: str | None,
        key_prefix: str | None,
        dry_run: bool,
    ) -> int:
        what = "pause" if pause else "resume"
        if labels is None and not type_name:
            raise ReminderError(f"{what}_where needs a label selector or a grain type")
        if not isinstance(self.table, PausableReminderTable):
            raise ReminderError(
                f"cannot {what} rows: the reminder table ({type(self.table).__name__}) "
                "does not support pausing rows"
            )
        _check_filter(type_name, key_prefix)
        # Collected first: a paused row leaves no index, but a walk must not see
        # its own writes either way.
        keys = [
            (r.grain_id, r.name)
            async for r in self.walk(type_name=type_name, key_prefix=key_prefix, labels=labels)
            if r.paused != pause
        ]
        if dry_run:
            return len(keys)
        # A resumed row's skipped slots count as skipped while paused (``resume``).
        now = None if pause or not self._has("REMINDER_COUNTERS") else self._clock.now()

        def flip(r: ReminderEntry) -> ReminderEntry:
            if r.paused == pause:
                return r
            return replace(r, paused=pause, resumed_at=now or r.resumed_at)

        action = AuditAction.PAUSE_WHERE if pause else AuditAction.RESUME_WHERE
        where = _where(type_name, key_prefix, labels)
        changed = 0
        async with self.audit.pending(action, detail=where) as batch:
            try:
                for grain, name in keys:
                    try:
                        row = await self.audit.change(action, grain, name, flip, batch=batch.id)
                    except ReminderError:
                        continue  # removed meanwhile
                    changed += row.paused == pause
            finally:
                batch.detail["changed"] = changed
        return changed

    async def import_rows(
        self,
        rows: Iterable[ReminderEntry],
        replace_existing: bool = False,
        dry_run: bool = False,
    ) -> ImportResult:
        """Write exported rows into this table as they were: schedule, ``next_due``,
        ``last_fire``, paused and declared flags kept. A row absent here is
        created (``upsert_if`` on absence, so a row a silo registers meanwhile
        wins). A row present here is left alone, or with ``replace_existing``
        replaced on the etag just read (a row that changes meanwhile is a
        conflict, kept). With ``dry_run`` nothing is written; the counts say
        what would be done."""
        now = self._clock.now()
        rows = list(rows)
        calendars = await self._import_calendars(rows)
        # All checked before any write; rows naming a calendar take its rules here.
        checked = [_check_row(r, self._options, now, calendars) for r in rows]
        for row in checked:
            self._check_cluster(row, f"imported reminder {row.name!r} of {row.grain_id}")
        if dry_run:
            return await self._import_plan(checked, replace_existing)
        counts = {"created": 0, "exist": 0, "replaced": 0, "conflicts": 0}
        given = {"rows": len(checked), "replace_existing": replace_existing}
        async with self.audit.pending(AuditAction.IMPORT, detail=given) as batch:
            try:
                for row in checked:
                    counts[await self._import_one(row, replace_existing, batch.id)] += 1
            finally:
                batch.detail.update(counts)
        return ImportResult(**counts)

    async def _import_one(
        self, given: ReminderEntry, replace_existing: bool, batch: str | None
    ) -> str:
        """Write one imported row; which ``ImportResult`` count it adds to."""
        row = replace(given, service_id=self.service_id, etag=None)
        current = await self.table.read(row.grain_id, row.name)
        if current is not None and not replace_existing:
            return "exist"
        etag = await self.audit.write(
            AuditAction.IMPORT, row, None if current is None else current.etag,
            before=current, batch=batch,
        )  # fmt: skip
        if current is None:
            return "exist" if etag is None else "created"
        return "conflicts" if etag is None else "replaced"

    async def _import_plan(self, rows: list[ReminderEntry], replace_existing: bool) -> ImportResult:
        """What an import of ``rows`` would do (a dry run: nothing written)."""
        created = exist = replaced = 0
        for row in rows:
            current = await self.table.read(row.grain_id, row.name)
            if current is None:
                created += 1
            elif replace_existing:
                replaced += 1
            else:
                exist += 1
        return ImportResult(created, exist, replaced, 0)

    async def _import_calendars(self, rows: list[ReminderEntry]) -> dict[str, StoredCalendar]:
        """The calendars imported rows name, as stored here (``ReminderError`` for
        one this table lacks: set it first); the features their options need."""
        names = {r.calendar for r in rows if isinstance(r, ReminderEntry) and r.calendar}
        if any(isinstance(r, ReminderEntry) and r.labels for r in rows):
            self.require(Feature.REMINDER_LABELS)
        if not names:
            return {}
        self.require(Feature.REMINDER_CALENDARS)
        table = self.table
        if not isinstance(table, CalendarStore):
            raise ReminderError(f"the reminder table ({type(table).__name__}) keeps no calendars")
        found: dict[str, StoredCalendar] = {}
        for name in sorted(names):
            stored = await table.read_calendar(name)
            if stored is None:
                raise ReminderError(
                    f"imported rows use calendar {name!r}, which this table lacks: set it "
                    "first (orleanspy reminders calendar set); nothing was imported"
                )
            found[name] = stored
        return found

    # -- parts ---------------------------------------------------------------------

    def _check_cluster(self, row: ReminderEntry, what: str) -> None:
        """What a row needs of the cluster: every silo knows its options, and a
        grain class known here that interleaves ticks for ``ALLOW_ALL``."""
        if self._require is not None:
            for feature in needed_features(row):
                self._require(feature, what)
        defn = None if self._definitions is None else self._definitions(row.grain_id.type_name)
        if defn is not None:
            check_overlap(defn, row.overlap, what)

    def _has(self, feature: str) -> bool:
        if self._require is None:
            return True
        try:
            self._require(feature, "")
        except FeatureUnavailableError:
            return False
        return True

    def told(self, entry: ReminderEntry) -> None:
        """Tell the local service of a row written (the calendar walk's)."""
        self.audit.told(entry.grain_id, entry.name, entry)

    def _check_pausable(self, what: str, grain: GrainId, name: str) -> None:
        if not isinstance(self.table, PausableReminderTable):
            raise ReminderError(
                f"cannot {what} {grain} {name!r}: the reminder table "
                f"({type(self.table).__name__}) does not support pausing rows"
            )

    def now(self) -> datetime:
        return self._clock.now()


def _check_filter(type_name: str | None, key_prefix: str | None) -> None:
    if key_prefix is not None and not type_name:
        raise ReminderError("a key prefix needs a grain type: pass type_name as well")
    if not isinstance(type_name, str | None) or not isinstance(key_prefix, str | None):
        raise ReminderError("a grain type and a key prefix are strings")
    try:
        grain_prefix(type_name, key_prefix)
    except ValueError as exc:
        raise ReminderError(str(exc)) from None


def _check_page(cursor: object, limit: object) -> None:
    if not isinstance(cursor, str | None):
        raise ReminderError(f"a page cursor is a string from the previous page, got {cursor!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise ReminderError(f"a page holds 1..{MAX_PAGE} rows, got {limit!r}")


def _check_row(
    row: object,
    options: ReminderOptions,
    now: datetime,
    calendars: dict[str, StoredCalendar] | None = None,
) -> ReminderEntry:
    """An imported row, validated as a registration of its schedule would be
    (``ReminderError`` naming what is wrong: a one-shot row as ``at=`` its
    ``start_at``, a repeating one with its jitter, bounds, ``max_ticks``,
    payload, retry policy, grace, labels and calendar), its times inside the
    tables' range; a row naming a calendar takes its rules as stored here
    (``calendars``)."""
    if not isinstance(row, ReminderEntry):
        raise ReminderError(f"not a reminder row: {type(row).__name__}")
    calendar = None
    if row.calendar is not None:
        calendar = (calendars or {}).get(row.calendar)
        if calendar is not None:
            row = replace(row, calendar_version=calendar.version, _calendar_rules=calendar.calendar)
    for what, at in (("start_at", row.start_at), ("next_due", row.next_due)):
        if not isinstance(at, datetime) or at.tzinfo is None or not EPOCH <= at < LATEST_TICK:
            raise ReminderError(f"{row.grain_id} {row.name!r}: {what} {at!r} is out of range")
    new_entry(  # validation only: the exported times are kept
        spec_of_row(row),
        service_id=row.service_id,
        grain_id=row.grain_id,
        name=row.name,
        now=now,
        options=options,
        calendar=calendar,
    )
    return row
