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
``last_fire``, paused, declared and its fingerprint) plus the line's format
``"v"``. The etag is exported for reference and never imported: etags belong
to the table that made them.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from orleanspy.clock import SystemClock
from orleanspy.errors import AuthenticationError, ReminderError, SiloUnavailableError
from orleanspy.identity import GrainId
from orleanspy.options import MessagingOptions, ReminderOptions
from orleanspy.remindable.operations import (
    ImportResult,
    ReminderOperations,
    ReminderPage,
    parse_grain_id,
)
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import FireRecord, MissedReminderAction, ReminderEntry, TickStatus
from orleanspy.reminders.table import ReminderTable

__all__ = [
    "EXPORT_FORMAT",
    "ReminderAccess",
    "entry_json",
    "export_line",
    "fire_json",
    "json_value",
    "open_reminders",
    "parse_export",
    "parse_grain_id",
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


def parse_export(lines: Iterable[str]) -> Iterator[ReminderEntry]:
    """The rows of export lines (blank lines skipped); ``ReminderError`` naming
    the line number of the first line that is not an export line."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            if not isinstance(doc, dict) or doc.get("v") != EXPORT_FORMAT:
                raise ValueError(f"not format {EXPORT_FORMAT}")
            row = ReminderEntry.from_record(_from_jsonable(doc["row"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ReminderError(f"line {n} is not a reminder export line: {exc}") from None
        yield row


class ReminderAccess(Protocol):
    """The reminder operations of the CLI (``ReminderOperations``' names);
    ``via`` names the path taken."""

    via: str

    async def list_for_grain(self, grain: GrainId) -> list[ReminderEntry]: ...
    async def get(self, grain: GrainId, name: str) -> ReminderEntry: ...
    async def upcoming(self, horizon: timedelta, limit: int) -> list[ReminderEntry]: ...
    async def count_all(self) -> int: ...
    async def count(self, type_name: str | None, key_prefix: str | None) -> int: ...
    async def orphans(self) -> dict[str, int]: ...
    async def page(
        self, cursor: str | None, limit: int, type_name: str | None, key_prefix: str | None
    ) -> ReminderPage: ...
    async def delete_where(self, type_name: str, key_prefix: str | None, dry_run: bool) -> int: ...
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


class _ViaGateway:
    """The management grain of a running cluster; every call is the grain's."""

    def __init__(self, mgmt: Any, endpoint: str) -> None:
        self._m = mgmt
        self.via = f"gateway {endpoint}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._m, name)

    async def count(self, type_name: str | None, key_prefix: str | None) -> int:
        return int(await self._m.count(type_name, key_prefix))

    async def page(
        self, cursor: str | None, limit: int, type_name: str | None, key_prefix: str | None
    ) -> ReminderPage:
        page: ReminderPage = await self._m.page(cursor, limit, type_name, key_prefix)
        return page


class _Direct(ReminderOperations):
    """``ReminderOperations`` on the table itself (no silo is up, so no silo's
    hosted types are known and nothing is called orphaned)."""

    def __init__(self, table: ReminderTable, service_id: str, via: str) -> None:
        super().__init__(
            table, service_id=service_id, clock=SystemClock(), options=ReminderOptions()
        )
        self.via = via

    async def trigger(self, grain: GrainId, name: str) -> TickStatus:
        await self.get(grain, name)
        raise ReminderError(
            f"cannot trigger {grain} {name!r}: a tick is delivered by a silo, and no gateway "
            "of the cluster answered"
        )


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
