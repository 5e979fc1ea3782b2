"""The reminder management operations, written once over a ``ReminderTable``.

``ReminderOperations`` is what the management grain (``client.reminders``) and
the CLI's direct path (no silo up) both call, so the two cannot drift. Every
write of a row is a read-modify-write guarded by the etag read
(``ReminderTable.upsert_if``, ``remove``): a row that a silo's tick, another
operator or a start-up declaration moved between the read and the write is
read again and the change re-applied to what is there now, so no write is
lost to a stale copy. After ``_ATTEMPTS`` lost races in a row the operation
fails with ``ReminderError`` and nothing of it is written.

Walks over many rows (``page``, ``count``, ``delete_where``, ``export``) read
the table a page at a time (``ReminderTable.read_page``): memory follows the
page size, never the table.

A row is *orphaned* when its grain type is hosted by no silo of the cluster
(``hosted_types``, given by the caller): nobody can receive its ticks, and
only an operator can remove it (dotnet/orleans #9114, #2419).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from orleanspy.clock import Clock, from_ms
from orleanspy.errors import ReminderError
from orleanspy.grain import Grain, definition_of
from orleanspy.identity import GrainId, GrainKey
from orleanspy.options import ReminderOptions
from orleanspy.reminders.model import FireRecord, MissedReminderAction, ReminderEntry
from orleanspy.reminders.schedule import next_slot
from orleanspy.reminders.spec import LATEST_TICK, check_grace, new_entry
from orleanspy.reminders.table import (
    PausableReminderTable,
    ReminderTable,
    grain_prefix,
    remove_current,
)
from orleanspy.serialization import register_type

__all__ = [
    "ImportResult",
    "ReminderOperations",
    "ReminderPage",
    "grain_target",
    "parse_grain_id",
]

#: Lost etag races one operation re-reads and retries before giving up.
_ATTEMPTS = 5
#: Rows per table read when walking the table.
PAGE = 500
#: The most rows one page may ask for.
MAX_PAGE = 10_000

EPOCH = from_ms(0)

#: Told of every row written (``entry``) or removed (``None``) through the
#: operations, so the local reminder service hears of it at once.
Notify = Callable[[GrainId, str, ReminderEntry | None], None]


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
    nothing is called orphaned).
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
    ) -> None:
        self.table = table
        self.service_id = service_id
        self._clock = clock
        self._options = options
        self._notify = notify
        self._hosted_types = hosted_types

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

    async def page(
        self,
        cursor: str | None = None,
        limit: int = PAGE,
        type_name: str | None = None,
        key_prefix: str | None = None,
    ) -> ReminderPage:
        """One page of the table's rows (``ReminderTable.read_page``), filtered by
        grain type and key prefix, with the page's orphaned rows flagged."""
        _check_filter(type_name, key_prefix)
        _check_page(cursor, limit)
        try:
            rows, nxt = await self.table.read_page(
                cursor, limit, type_name=type_name, key_prefix=key_prefix
            )
        except ValueError as exc:  # a cursor of another table, or made up
            raise ReminderError(str(exc)) from None
        hosted = await self.hosted()
        orphaned = [
            r.key for r in rows if hosted is not None and r.grain_id.type_name not in hosted
        ]
        return ReminderPage(rows, nxt, orphaned)

    async def walk(
        self, *, type_name: str | None = None, key_prefix: str | None = None, page: int = PAGE
    ) -> AsyncIterator[ReminderEntry]:
        """Every row (of the filter), ``page`` rows per table read."""
        cursor: str | None = None
        while True:
            rows, cursor = await self.table.read_page(
                cursor, page, type_name=type_name, key_prefix=key_prefix
            )
            for row in rows:
                yield row
            if cursor is None:
                return

    async def count(self, type_name: str | None = None, key_prefix: str | None = None) -> int:
        """How many rows the filter selects: from the index alone for a whole
        type or the whole table, else by walking the selected rows."""
        _check_filter(type_name, key_prefix)
        if key_prefix is None:
            if type_name is None:
                return await self.table.count()
            return (await self.table.count_types()).get(type_name, 0)
        n = 0
        async for _ in self.walk(type_name=type_name, key_prefix=key_prefix):
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
            service_id=self.service_id,
            grain_id=grain,
            name=name,
            now=self._clock.now(),
            options=self._options,
            period=timedelta(days=1),
            priority=priority,
        )
        return await self._modify(grain, name, lambda r: replace(r, priority=int(priority)))

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
        return await self._modify(grain, name, lambda r: replace(r, action=action))

    async def set_grace(
        self, grain: GrainId, name: str, grace: timedelta | float | None
    ) -> ReminderEntry:
        """Change how late the row's ticks may be and still count as on time
        (``None``: back to ``ReminderOptions.missed_tick_grace``). The schedule
        does not move."""
        checked = check_grace(grace)
        return await self._modify(grain, name, lambda r: replace(r, grace=checked))

    async def repair(self, grain: GrainId, name: str) -> ReminderEntry:
        """Move a row's ``next_due`` to its first slot after now (skipping missed ones)."""
        now = self._clock.now()
        return await self._modify(grain, name, lambda r: replace(r, next_due=next_slot(r, now)))

    async def pause(self, grain: GrainId, name: str) -> ReminderEntry:
        """Keep the row but deliver nothing until ``resume`` (the flag is stored)."""
        self._check_pausable("pause", grain, name)
        return await self._modify(grain, name, lambda r: r if r.paused else replace(r, paused=True))

    async def resume(self, grain: GrainId, name: str) -> ReminderEntry:
        """Deliver again from the slot the row stopped at (missed slots follow its action)."""
        self._check_pausable("resume", grain, name)
        return await self._modify(
            grain, name, lambda r: replace(r, paused=False) if r.paused else r
        )

    async def delete(self, grain: GrainId, name: str) -> bool:
        """Remove a row; ``False`` if it did not exist. A row moved between the
        read and the remove is read again (a tick moves it)."""
        removed = await remove_current(self.table, grain, name)
        if removed:
            self._told(grain, name, None)
        return removed

    async def delete_where(
        self, type_name: str, key_prefix: str | None = None, dry_run: bool = False
    ) -> int:
        """Remove every row of ``type_name`` (with a string key starting with
        ``key_prefix``), a page at a time; how many were removed (with
        ``dry_run``: would be). Each remove is checked against the etag read, so
        a row rewritten meanwhile (re-registered by its grain) is kept."""
        if not type_name:
            raise ReminderError("delete_where needs a grain type (it never empties the table)")
        _check_filter(type_name, key_prefix)
        removed = 0
        cursor: str | None = None
        while True:
            rows, cursor = await self.table.read_page(
                cursor, PAGE, type_name=type_name, key_prefix=key_prefix
            )
            for row in rows:
                if dry_run:
                    removed += 1
                elif row.etag is not None and await self.table.remove(
                    row.grain_id, row.name, row.etag
                ):
                    self._told(row.grain_id, row.name, None)
                    removed += 1
            if cursor is None:
                return removed

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
        checked = [_check_row(r, self._options, now) for r in rows]  # all, before any write
        created = exist = replaced = conflicts = 0
        for given in checked:
            row = replace(given, service_id=self.service_id, etag=None)
            current = await self.table.read(row.grain_id, row.name)
            if current is None:
                if dry_run:
                    created += 1
                    continue
                etag = await self.table.upsert_if(row, None)
                if etag is None:
                    exist += 1
                else:
                    created += 1
                    self._told(row.grain_id, row.name, row.with_etag(etag))
            elif not replace_existing:
                exist += 1
            elif dry_run:
                replaced += 1
            else:
                etag = await self.table.upsert_if(row, current.etag)
                if etag is None:
                    conflicts += 1
                else:
                    replaced += 1
                    self._told(row.grain_id, row.name, row.with_etag(etag))
        return ImportResult(created, exist, replaced, conflicts)

    # -- parts ---------------------------------------------------------------------

    async def _modify(
        self, grain: GrainId, name: str, change: Callable[[ReminderEntry], ReminderEntry]
    ) -> ReminderEntry:
        """Apply ``change`` to the row as it is now, guarded by its etag."""
        for _ in range(_ATTEMPTS):
            row = await self.get(grain, name)
            new = change(row)
            if new is row:
                return row
            etag = await self.table.upsert_if(new, row.etag)
            if etag is not None:
                new = new.with_etag(etag)
                self._told(grain, name, new)
                return new
        raise ReminderError(
            f"could not change reminder {name!r} of {grain}: it kept changing "
            f"({_ATTEMPTS} attempts)"
        )

    def _told(self, grain: GrainId, name: str, entry: ReminderEntry | None) -> None:
        if self._notify is not None:
            self._notify(grain, name, entry)

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


def _check_row(row: object, options: ReminderOptions, now: datetime) -> ReminderEntry:
    """An imported row, validated as a registration of its schedule would be
    (``ReminderError`` naming what is wrong: a one-shot row as ``at=`` its
    ``start_at``, a repeating one with its jitter, bounds, ``max_ticks``,
    payload, retry policy and grace), its times inside the tables' range."""
    if not isinstance(row, ReminderEntry):
        raise ReminderError(f"not a reminder row: {type(row).__name__}")
    for what, at in (("start_at", row.start_at), ("next_due", row.next_due)):
        if not isinstance(at, datetime) or at.tzinfo is None or not EPOCH <= at < LATEST_TICK:
            raise ReminderError(f"{row.grain_id} {row.name!r}: {what} {at!r} is out of range")
    one_shot = row.period is None and row.cron is None
    new_entry(  # validation only: the exported times are kept
        service_id=row.service_id,
        grain_id=row.grain_id,
        name=row.name,
        now=now,
        options=options,
        due=None if one_shot else 0,
        at=row.start_at if one_shot else None,
        period=row.period,
        cron=row.cron,
        tz=row.tz,
        priority=row.priority,
        action=row.action,
        grace=row.grace,
        jitter=row.jitter,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        max_ticks=row.max_ticks,
        payload=row.payload,
        retry=row.retry,
    )
    return row
