"""The reminder commands of ``orleanspy``: the same operations through a gateway
(the management grain of a running cluster) or directly on the Redis or
PostgreSQL table when no silo of the cluster is up.

Both paths run ``ReminderOperations`` (the gateway's management grain runs it
in a silo; the direct path runs it here), so they validate alike and write
alike: every change of a row is guarded by the etag it was read with
(``ReminderTable.upsert_if``), and a silo that moves the row meanwhile makes
the change re-read and re-apply instead of being overwritten.

``open_reminders`` tries a gateway first and falls back to the table when no
silo of the cluster is up; the returned ``ReminderAccess.via`` says which.

Export and import move rows as JSON lines, one row a line, in the storage form
of ``ReminderEntry.to_record`` (every field: schedule, ``next_due``,
``last_fire``, paused, declared and its fingerprint, and 0.2's overlap policy,
catch-up window, deadline, labels and calendar's name) plus the line's format
``"v"``. The etag is exported for reference and never imported: etags belong to
the table that made them. A row naming a calendar is bound to the calendar of
that name in the table it is imported into (set it there first). With
``--dead-letters`` the export also holds the dead letters, one a line (``{"v":
1, "dead_letter": DeadLetter.to_record()}``), after the rows; an import writes
them back (0.1 reads only row lines).

The commands of calendars (``reminders calendar set|get|list|delete``),
backfills (``reminders backfill``, ``backfills``, ``backfill-cancel``) and the
label selections that change rows (``pause-many``, ``resume-many``) are
``add_schedule_commands`` and ``run_schedule_command``; ``--label KEY=VALUE``
(``label_item``) selects rows for ``list``, ``count``, ``export`` and
``delete-many`` too.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, date, datetime, timedelta
from typing import Any, Protocol

from orleanspy.clock import SystemClock
from orleanspy.errors import (
    AuthenticationError,
    ReminderError,
    SiloUnavailableError,
    StorageError,
)
from orleanspy.identity import GrainId
from orleanspy.options import MessagingOptions, ReminderOptions
from orleanspy.remindable.calendars import CalendarChange
from orleanspy.remindable.operations import (
    ImportResult,
    ReminderOperations,
    ReminderPage,
    parse_grain_id,
)
from orleanspy.reminders.audit import AuditQuery, AuditRecord
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.calendars import Calendar, StoredCalendar
from orleanspy.reminders.counters import ReminderCounters
from orleanspy.reminders.describe import ReminderDescription
from orleanspy.reminders.labels import parse_selector
from orleanspy.reminders.letters import DeadLetter, DeadLetterPage
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import FireRecord, MissedReminderAction, ReminderEntry, TickStatus
from orleanspy.reminders.table import ReminderTable

__all__ = [
    "EXPORT_FORMAT",
    "ReminderAccess",
    "add_schedule_commands",
    "backfill_json",
    "calendar_json",
    "counters_json",
    "describe_json",
    "describe_text",
    "entry_json",
    "export_line",
    "fire_json",
    "instant_arg",
    "json_value",
    "label_item",
    "letter_json",
    "letter_line",
    "open_reminders",
    "parse_export",
    "parse_export_all",
    "parse_grain_id",
    "run_schedule_command",
]

#: How far ahead ``reminders list`` looks: every row, in the due order.
FOREVER = timedelta(days=365 * 200)
#: The ``"v"`` of an export line.
EXPORT_FORMAT = 1


def entry_json(entry: ReminderEntry, *, orphaned: bool | None = None) -> dict[str, Any]:
    """A row for ``--json``: times in ISO 8601 UTC, the period in seconds.
    ``orphaned`` is included when known (no silo hosts the row's grain type)."""

    def iso(t: datetime | None) -> str | None:
        return None if t is None else t.astimezone(UTC).isoformat()

    doc: dict[str, Any] = {
        "grain_id": entry.grain_id.canonical,
        "grain": str(entry.grain_id),
        "name": entry.name,
        "next_due": iso(entry.next_due),
        "start_at": iso(entry.start_at),
        "last_fire": iso(entry.last_fire),
        "period_seconds": None if entry.period is None else entry.period.total_seconds(),
        "cron": entry.cron,
        "tz": entry.tz,
        "priority": int(entry.priority),
        "action": entry.action.name,
        "paused": entry.paused,
        "grace_seconds": None if entry.grace is None else entry.grace.total_seconds(),
        "declared": entry.declared,
        "one_shot": entry.one_shot,
        "jitter_seconds": None if entry.jitter is None else entry.jitter.total_seconds(),
        "starts_at": iso(entry.starts_at),
        "ends_at": iso(entry.ends_at),
        "max_ticks": entry.max_ticks,
        "final_due": iso(entry.final_due),
        "payload": json_value(entry.payload),
        "retry": None
        if entry.retry is None
        else {
            "max_attempts": entry.retry.max_attempts,
            "backoff_seconds": entry.retry.backoff.total_seconds(),
        },
        "overlap": None if entry.overlap is None else entry.overlap.name,
        "catchup_window_seconds": None
        if entry.catchup_window is None
        else entry.catchup_window.total_seconds(),
        "deadline_seconds": None if entry.deadline is None else entry.deadline.total_seconds(),
        "resumed_at": iso(entry.resumed_at),
        "labels": entry.labels,
        "calendar": entry.calendar,
        "on_excluded": None if entry.on_excluded is None else entry.on_excluded.name,
    }
    if orphaned is not None:
        doc["orphaned"] = orphaned
    return doc


def json_value(value: Any) -> Any:
    """A payload as JSON: codec types that JSON lacks as text (datetimes in ISO
    8601, UUIDs and grain ids as strings, bytes as base64, durations in seconds,
    registered dataclasses as objects)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_value(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, GrainId):
        return value.canonical
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return str(value)


def fire_json(rec: FireRecord) -> dict[str, Any]:
    """A fire record for ``--json``."""
    return {
        "slot": rec.slot.astimezone(UTC).isoformat(),
        "at": rec.at.astimezone(UTC).isoformat(),
        "lateness_seconds": round(rec.lateness.total_seconds(), 3),
        "outcome": rec.outcome.value,
        "silo": rec.silo,
        "triggered": rec.triggered,
        "error": rec.error,
        "attempt": rec.attempt,
        "final": rec.final,
    }


def letter_json(letter: DeadLetter) -> dict[str, Any]:
    """A dead letter for ``--json`` (and ``dead-letters --show``)."""

    def iso(t: datetime | None) -> str | None:
        return None if t is None else t.astimezone(UTC).isoformat()

    return {
        "id": letter.id,
        "grain": str(letter.grain_id),
        "grain_id": letter.grain_id.canonical,
        "name": letter.name,
        "slot": iso(letter.slot),
        "due_at": iso(letter.due_at),
        "first_tick_time": iso(letter.first_tick_time),
        "period_seconds": None if letter.period is None else letter.period.total_seconds(),
        "cron": letter.cron,
        "attempts": letter.attempts,
        "error_type": letter.error_type,
        "message": letter.message,
        "dead_lettered_at": iso(letter.at),
        "silo": letter.silo,
        "final": letter.final,
        "deadline_seconds": None if letter.deadline is None else letter.deadline.total_seconds(),
        "payload": json_value(letter.payload),
        "traceback": letter.traceback,
    }


def counters_json(counters: ReminderCounters) -> dict[str, Any]:
    """A row's counters for ``--json``: every counter, the skips by reason and in
    all, the last error."""
    doc: dict[str, Any] = {f.name: getattr(counters, f.name) for f in dataclasses.fields(counters)}
    doc["skipped"] = counters.skipped()
    at = counters.last_error_at
    doc["last_error_at"] = None if at is None else at.astimezone(UTC).isoformat()
    return doc


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$b64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _from_jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$b64"}:
            return base64.b64decode(value["$b64"])
        return {k: _from_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_jsonable(v) for v in value]
    return value


def export_line(entry: ReminderEntry) -> str:
    """One row as an export line (module docstring)."""
    return json.dumps({"v": EXPORT_FORMAT, "row": _jsonable(entry.to_record())}, sort_keys=True)


def letter_line(letter: DeadLetter) -> str:
    """One dead letter as an export line (module docstring)."""
    return json.dumps(
        {"v": EXPORT_FORMAT, "dead_letter": _jsonable(letter.to_record())}, sort_keys=True
    )


def parse_export(lines: Iterable[str]) -> Iterator[ReminderEntry]:
    """The rows of export lines (blank lines and dead letter lines skipped);
    ``ReminderError`` naming the line number of the first line that is not an
    export line."""
    for item in parse_export_all(lines):
        if isinstance(item, ReminderEntry):
            yield item


def parse_export_all(lines: Iterable[str]) -> Iterator[ReminderEntry | DeadLetter]:
    """The rows and dead letters of export lines, in their order (blank lines
    skipped); ``ReminderError`` naming the line number of the first line that
    is not an export line."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            if not isinstance(doc, dict) or doc.get("v") != EXPORT_FORMAT:
                raise ValueError(f"not format {EXPORT_FORMAT}")
            item: ReminderEntry | DeadLetter
            if "dead_letter" in doc:
                item = DeadLetter.from_record(_from_jsonable(doc["dead_letter"]))
            else:
                item = ReminderEntry.from_record(_from_jsonable(doc["row"]))
        except (ValueError, KeyError, TypeError, StorageError) as exc:
            raise ReminderError(f"line {n} is not a reminder export line: {exc}") from None
        yield item


class ReminderAccess(Protocol):
    """The reminder operations of the CLI (``ReminderOperations``' names);
    ``via`` names the path taken."""

    via: str

    async def list_for_grain(self, grain: GrainId) -> list[ReminderEntry]: ...
    async def get(self, grain: GrainId, name: str) -> ReminderEntry: ...
    async def upcoming(self, horizon: timedelta, limit: int) -> list[ReminderEntry]: ...
    async def count_all(self) -> int: ...
    async def count(self, type_name: str | None, key_prefix: str | None, labels: Any) -> int: ...
    async def orphans(self) -> dict[str, int]: ...
    async def page(
        self,
        cursor: str | None,
        limit: int,
        type_name: str | None,
        key_prefix: str | None,
        labels: Any,
    ) -> ReminderPage: ...
    async def delete_where(
        self, type_name: str | None, key_prefix: str | None, dry_run: bool, labels: Any
    ) -> int: ...
    async def pause_where(
        self, labels: Any, type_name: str | None, key_prefix: str | None, dry_run: bool
    ) -> int: ...
    async def resume_where(
        self, labels: Any, type_name: str | None, key_prefix: str | None, dry_run: bool
    ) -> int: ...
    async def set_calendar(self, name: str, calendar: Calendar) -> CalendarChange: ...
    async def get_calendar(self, name: str) -> Calendar: ...
    async def calendars(self) -> list[StoredCalendar]: ...
    async def delete_calendar(self, name: str, force: bool) -> int: ...
    async def backfill(
        self, grain: GrainId, name: str, start: datetime, end: datetime, overlap: Any
    ) -> BackfillJob: ...
    async def cancel_backfill(self, grain: GrainId, name: str) -> bool: ...
    async def backfills(self) -> list[BackfillJob]: ...
    async def import_rows(
        self, rows: list[ReminderEntry], replace_existing: bool, dry_run: bool
    ) -> ImportResult: ...
    async def set_priority(self, grain: GrainId, name: str, priority: int) -> ReminderEntry: ...
    async def set_action(
        self, grain: GrainId, name: str, action: MissedReminderAction
    ) -> ReminderEntry: ...
    async def set_grace(
        self, grain: GrainId, name: str, grace: timedelta | None
    ) -> ReminderEntry: ...
    async def repair(self, grain: GrainId, name: str) -> ReminderEntry: ...
    async def delete(self, grain: GrainId, name: str) -> bool: ...
    async def pause(self, grain: GrainId, name: str) -> ReminderEntry: ...
    async def resume(self, grain: GrainId, name: str) -> ReminderEntry: ...
    async def trigger(self, grain: GrainId, name: str) -> TickStatus: ...
    async def history(self, grain: GrainId, name: str) -> list[FireRecord]: ...
    async def audit_log(self, query: AuditQuery) -> list[AuditRecord]: ...
    async def counters(self, grain: GrainId, name: str) -> ReminderCounters: ...
    async def describe(
        self, grain: GrainId, name: str, count: int = 10, after: datetime | None = None
    ) -> ReminderDescription: ...
    async def dead_letters(
        self, grain: GrainId | None, name: str | None, cursor: str | None, limit: int
    ) -> DeadLetterPage: ...
    async def replay(self, letter_id: str) -> TickStatus: ...
    async def discard(self, letter_id: str) -> DeadLetter: ...
    async def import_dead_letters(self, letters: list[DeadLetter], dry_run: bool) -> int: ...


class _ViaGateway:
    """The management grain of a running cluster; every call is the grain's."""

    def __init__(self, mgmt: Any, endpoint: str) -> None:
        self._m = mgmt
        self.via = f"gateway {endpoint}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._m, name)

    async def count(self, type_name: str | None, key_prefix: str | None, labels: Any) -> int:
        if labels is None:  # a gateway of an earlier release takes no labels
            return int(await self._m.count(type_name, key_prefix))
        return int(await self._m.count(type_name, key_prefix, labels))

    async def page(
        self,
        cursor: str | None,
        limit: int,
        type_name: str | None,
        key_prefix: str | None,
        labels: Any,
    ) -> ReminderPage:
        if labels is None:
            page: ReminderPage = await self._m.page(cursor, limit, type_name, key_prefix)
        else:
            page = await self._m.page(cursor, limit, type_name, key_prefix, labels)
        return page

    async def audit_log(self, query: AuditQuery) -> list[AuditRecord]:
        return list(await self._m.audit(query))

    async def delete_where(
        self, type_name: str | None, key_prefix: str | None, dry_run: bool, labels: Any
    ) -> int:
        if labels is None:
            return int(await self._m.delete_where(type_name, key_prefix, dry_run))
        return int(await self._m.delete_where(type_name, key_prefix, dry_run, labels))


class _Direct(ReminderOperations):
    """``ReminderOperations`` on the table itself (no silo is up, so no silo's
    hosted types are known and nothing is called orphaned)."""

    def __init__(self, table: ReminderTable, service_id: str, via: str) -> None:
        # Its actions are audited as the principal "local", run "via" the CLI.
        super().__init__(
            table, service_id=service_id, clock=SystemClock(), options=ReminderOptions(), via="cli"
        )
        self.via = via

    async def trigger(self, grain: GrainId, name: str) -> TickStatus:
        await self.get(grain, name)
        raise ReminderError(
            f"cannot trigger {grain} {name!r}: a tick is delivered by a silo, and no gateway "
            "of the cluster answered"
        )

    async def replay(self, letter_id: str) -> TickStatus:
        """No silo delivers it: ``ReminderError`` (after checking the id)."""
        return await self.replay_letter(letter_id, None)


@asynccontextmanager
async def open_reminders(
    membership_url: str,
    cluster_id: str,
    service_id: str,
    messaging: MessagingOptions,
    *,
    table_url: str | None = None,
    create: bool = False,
) -> AsyncIterator[ReminderAccess]:
    """A gateway's management grain if a silo of the cluster answers (found in
    the membership table at ``membership_url``), else the reminder table at
    ``table_url`` (default ``membership_url``) directly: Redis (its shard count
    read from the table's own metadata) or PostgreSQL. A Redis table that does
    not exist yet reads as empty, or with ``create`` is created (an import)."""
    from orleanspy.client import ClusterClient

    async with AsyncExitStack() as stack:
        client = ClusterClient(membership_url, cluster_id, service_id, options=messaging)
        try:
            await client.start()
        except SiloUnavailableError as exc:
            if isinstance(exc.__cause__, AuthenticationError):
                raise
            yield await _direct(stack, table_url or membership_url, service_id, create)
            return
        stack.push_async_callback(client.aclose)
        yield _ViaGateway(client.reminders, ", ".join(client.gateways))


async def _direct(stack: AsyncExitStack, url: str, service_id: str, create: bool) -> ReminderAccess:
    from orleanspy._redis import key_prefix, redacted, translate_errors
    from orleanspy.tables import TableConnections, table_backend

    connections = TableConnections(stack)
    shown = redacted(url)
    if table_backend(url) == "postgres":
        table = await connections.reminder_table(url, service_id=service_id, shards=1)
        await table.start(stack)
        return _Direct(table, service_id, f"the PostgreSQL table at {shown} (no silo is up)")
    client = connections.redis(url)
    with translate_errors("reminder table lookup"):
        shards = await client.hget(f"{key_prefix(service_id)}rem:meta", "shards")
    via = f"the Redis table at {shown} (no silo is up)"
    if shards is None and not create:
        # Nothing to read: an empty table stands in, so reads are empty and
        # writes find nothing, without creating the service's keys.
        empty = InMemoryReminderTable(service_id)
        await empty.start(stack)
        return _Direct(empty, service_id, f"{via[:-1]}; service {service_id!r} has none)")
    count = ReminderOptions().shards if shards is None else int(shards)
    table = await connections.reminder_table(url, service_id=service_id, shards=count)
    await table.start(stack)
    return _Direct(table, service_id, via)


# -- calendars, backfills, label selections ---------------------------------------------

_WEEKDAYS = {
    name: i
    for i, names in enumerate(
        (("mon", "monday"), ("tue", "tuesday"), ("wed", "wednesday"), ("thu", "thursday"),
         ("fri", "friday"), ("sat", "saturday"), ("sun", "sunday"))
    )
    for name in names
}  # fmt: skip


def label_item(text: str) -> str:
    """``--label KEY=VALUE``, checked (``argparse`` reports the error)."""
    try:
        parse_selector([text])
    except ReminderError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def instant_arg(text: str) -> datetime:
    """An ISO 8601 instant with its offset (``Z`` for UTC)."""
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {text!r} (e.g. 2026-12-01T00:00:00Z)"
        ) from None
    if at.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no offset: add Z or +01:00")
    return at


def _weekdays(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        item = part.strip().lower()
        if item.isdigit() and 0 <= int(item) <= 6:
            out.append(int(item))
        elif item in _WEEKDAYS:
            out.append(_WEEKDAYS[item])
        else:
            raise argparse.ArgumentTypeError(
                f"not a weekday: {part!r} (mon..sun, or 0 for Monday .. 6 for Sunday)"
            )
    return out


def _date(text: str) -> str:
    try:
        return date.fromisoformat(text.strip()).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date: {text!r} (YYYY-MM-DD)") from None


def _span(text: str) -> tuple[datetime, datetime]:
    start, sep, end = text.partition("/")
    if not sep:
        raise argparse.ArgumentTypeError(f"not a range: {text!r} (START/END, ISO 8601 times)")
    return instant_arg(start), instant_arg(end)


def add_schedule_commands(ops: Any, sub: Callable[..., Any], row_args: Callable[..., Any]) -> None:
    """The ``reminders`` subcommands of calendars and backfills (``ops`` is the
    ``reminders`` subparsers; ``sub`` and ``row_args`` the CLI's helpers)."""
    cal = sub(ops, "calendar", "named calendars of excluded dates, weekdays and ranges")
    what = cal.add_subparsers(dest="calendar_what", metavar="WHAT", required=True)
    p = sub(what, "set", "store a calendar (replacing it) and move the reminders that use it")
    p.add_argument("calendar_name", metavar="NAME", help="the calendar's name")
    p.add_argument("--tz", metavar="ZONE", help="the IANA zone days are read in (default UTC)")
    p.add_argument("--exclude-date", dest="exclude_dates", metavar="DATE", action="append",
                   type=_date, default=[],
                   help="a date to exclude, YYYY-MM-DD (repeat)")  # fmt: skip
    p.add_argument("--exclude-weekday", dest="exclude_weekdays", metavar="DAYS",
                   action="append", type=_weekdays, default=[],
                   help="weekdays to exclude: sat,sun or 5,6 (repeat)")  # fmt: skip
    p.add_argument("--exclude-range", dest="exclude_ranges", metavar="START/END",
                   action="append", type=_span, default=[],
                   help="an excluded range of ISO 8601 times with offsets (repeat)")  # fmt: skip
    p = sub(what, "get", "one calendar")
    p.add_argument("calendar_name", metavar="NAME")
    sub(what, "list", "every calendar")
    p = sub(what, "delete", "remove a calendar (refused while reminders use it)")
    p.add_argument("calendar_name", metavar="NAME")
    p.add_argument("--force", action="store_true", help="detach the reminders that use it")
    p = sub(ops, "backfill", "deliver every slot of a reminder in [--from, --to) again, in "
            "order, as backfill ticks")  # fmt: skip
    row_args(p)
    p.add_argument("--from", dest="start", metavar="TIME", type=instant_arg, required=True,
                   help="the range's start, ISO 8601 with offset")  # fmt: skip
    p.add_argument("--to", dest="end", metavar="TIME", type=instant_arg, required=True,
                   help="the range's end (excluded), not after now")  # fmt: skip
    p.add_argument("--overlap", metavar="POLICY", help="an overlap policy by name (e.g. skip)")
    sub(ops, "backfills", "the running backfills and their progress")
    p = sub(ops, "backfill-cancel", "cancel a reminder's backfill")
    row_args(p)


def calendar_json(stored: StoredCalendar) -> dict[str, Any]:
    cal = stored.calendar
    return {
        "name": stored.name,
        "version": stored.version,
        "tz": cal.tz,
        "exclude_dates": list(cal.exclude_dates),
        "exclude_weekdays": list(cal.exclude_weekdays),
        "exclude_ranges": [
            [a.astimezone(UTC).isoformat(), b.astimezone(UTC).isoformat()]
            for a, b in cal.exclude_ranges
        ],
    }


def describe_json(d: ReminderDescription) -> dict[str, Any]:
    """``describe``'s answer for ``--json``: the row, the next fire times (the
    instant and the slot it stands for), the counters, the latest deliveries,
    the backfill and the dead letters."""
    return {
        "row": entry_json(d.row),
        "next_fires": [
            {"at": f.at.astimezone(UTC).isoformat(), "slot": f.slot.astimezone(UTC).isoformat()}
            for f in d.next_fires
        ],
        "counters": counters_json(d.counters),
        "recent": [fire_json(r) for r in d.recent],
        "backfill": None if d.backfill is None else backfill_json(d.backfill),
        "dead_letters": d.dead_letters,
    }


def describe_text(d: ReminderDescription) -> str:
    """``describe``'s answer as ``reminders describe`` prints it."""
    row, c = d.row, d.counters
    when = row.cron or (None if row.period is None else f"every {row.period}")
    lines = [
        f"{row.grain_id} {row.name!r}: {when or 'once'}"
        + (f" ({row.tz})" if row.tz else "")
        + (" [paused]" if row.paused else ""),
        f"next due      {row.next_due.astimezone(UTC).isoformat()}",
        f"last fire     {'-' if row.last_fire is None else row.last_fire.isoformat()}",
    ]
    if row.calendar is not None:
        shift = "SKIP" if row.on_excluded is None else row.on_excluded.name
        lines.append(f"calendar      {row.calendar} (excluded slots: {shift})")
    if row.labels:
        lines.append("labels        " + ", ".join(f"{k}={v}" for k, v in row.labels.items()))
    fires = [
        f.at.astimezone(UTC).isoformat()
        + ("" if f.at == f.slot else f" (slot {f.slot.isoformat()})")
        for f in d.next_fires
    ]
    lines.append("next fires    " + (", ".join(fires) or "none"))
    lines.append(
        f"counters      delivered {c.delivered}, failed {c.failed}, deadline exceeded "
        f"{c.deadline_exceeded}, dead-lettered {c.dead_lettered}, deduplicated {c.deduplicated}"
    )
    lines.append(
        f"skipped       {c.skipped()}: paused {c.skipped_paused}, overlap {c.skipped_overlap}, "
        f"calendar {c.skipped_calendar}, catch-up window {c.skipped_catchup_window}, late "
        f"{c.skipped_late}"
    )
    if c.last_error is not None:
        at = "" if c.last_error_at is None else f" at {c.last_error_at.isoformat()}"
        lines.append(f"last error    {c.last_error}{at}")
    if d.dead_letters:
        lines.append(f"dead letters  {d.dead_letters} (orleanspy reminders dead-letters)")
    if d.backfill is not None:
        b = d.backfill
        lines.append(f"backfill      {b.delivered}/{b.total} slots, next {b.next.isoformat()}")
    for r in d.recent[:5]:
        lines.append(
            f"recent        {r.slot.isoformat()} {r.outcome.value}"
            + (f" ({r.error})" if r.error else "")
        )
    return "\n".join(lines)


def backfill_json(job: BackfillJob) -> dict[str, Any]:
    return {
        "grain_id": job.grain_id.canonical,
        "name": job.name,
        "from": job.start.isoformat(),
        "to": job.end.isoformat(),
        "next": job.next.isoformat(),
        "total": job.total,
        "delivered": job.delivered,
        "failed": job.failed,
        "overlap": job.overlap,
        "created": None if job.created is None else job.created.isoformat(),
    }


def _out(args: argparse.Namespace, doc: Any, text: str) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True) if args.json else text)


async def run_schedule_command(
    args: argparse.Namespace, access: ReminderAccess, grain: GrainId | None
) -> int | None:
    """Run a calendar, backfill or label-selection command; ``None`` for any
    other command (the caller runs it)."""
    what = args.what
    if what in ("pause-many", "resume-many"):
        labels = args.labels
        if not labels and not args.type_name:
            raise ReminderError(f"{what} needs --label or --type")
        call = access.pause_where if what == "pause-many" else access.resume_where
        n = await call(labels, args.type_name, args.key_prefix, args.dry_run)
        verb = what.partition("-")[0] + "d"
        _out(args, {verb: n, "dry_run": args.dry_run},
             f"{'would be ' if args.dry_run else ''}{verb} {n} rows")  # fmt: skip
        return 0
    if what == "calendar":
        return await _calendar_command(args, access)
    if what == "backfills":
        jobs = await access.backfills()
        text = "\n".join(
            f"{j.grain_id} {j.name}: {j.done}/{j.total} slots of [{j.start.isoformat()}, "
            f"{j.end.isoformat()}), next {j.next.isoformat()}"
            + (f", {j.failed} failed" if j.failed else "")
            for j in jobs
        )
        _out(args, [backfill_json(j) for j in jobs], text or "no backfill runs")
        return 0
    if what == "backfill":
        assert grain is not None
        job = await access.backfill(grain, args.name, args.start, args.end, args.overlap)
        _out(args, backfill_json(job),
             f"backfill of {grain} {args.name}: {job.total} slots from {job.start.isoformat()} "
             f"to {job.end.isoformat()} (the owning silo runs it)")  # fmt: skip
        return 0
    if what == "backfill-cancel":
        assert grain is not None
        if not await access.cancel_backfill(grain, args.name):
            print(f"orleanspy: {grain} {args.name!r} has no backfill running", file=sys.stderr)
            return 1
        _out(args, {"cancelled": True}, f"cancelled the backfill of {grain} {args.name}")
        return 0
    return None


async def _calendar_command(args: argparse.Namespace, access: ReminderAccess) -> int:
    what = args.calendar_what
    if what == "list":
        stored = await access.calendars()
        _out(args, [calendar_json(c) for c in stored],
             "\n".join(_calendar_line(c) for c in stored) or "no calendars")  # fmt: skip
        return 0
    name = args.calendar_name
    if what == "set":
        calendar = Calendar(
            tz=args.tz,
            exclude_dates=args.exclude_dates,
            exclude_weekdays=[d for days in args.exclude_weekdays for d in days],
            exclude_ranges=args.exclude_ranges,
        )
        change = await access.set_calendar(name, calendar)
        doc = {"name": name, "version": change.version, "updated": change.updated,
               "paused": change.paused}  # fmt: skip
        paused = f", {change.paused} paused (no slot left)" if change.paused else ""
        _out(args, doc, f"calendar {name} at version {change.version}: "
             f"{change.updated} reminders moved to it{paused}")  # fmt: skip
        return 0
    if what == "get":
        one = StoredCalendar(name, await access.get_calendar(name), 0)
        doc = calendar_json(one)
        del doc["version"]
        _out(args, doc, _calendar_line(one, version=False))
        return 0
    detached = await access.delete_calendar(name, args.force)
    moved = f"; {detached} reminders detached" if detached else ""
    _out(args, {"deleted": name, "detached": detached}, f"deleted calendar {name}{moved}")
    return 0


def _calendar_line(stored: StoredCalendar, *, version: bool = True) -> str:
    cal = stored.calendar
    days = [name for name, i in _WEEKDAYS.items() if len(name) == 3 and i in cal.exclude_weekdays]
    parts = [f"{stored.name}" + (f" (version {stored.version})" if version else ""),
             f"tz {cal.tz or 'UTC'}"]  # fmt: skip
    if days:
        parts.append("weekdays " + ",".join(days))
    if cal.exclude_dates:
        parts.append("dates " + ",".join(cal.exclude_dates))
    for a, b in cal.exclude_ranges:
        parts.append(f"range {a.isoformat()}/{b.isoformat()}")
    return "; ".join(parts)
