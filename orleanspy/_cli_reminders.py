"""The reminder commands of ``orleanspy``: the same operations through a gateway
(the management grain of a running cluster) or directly on the Redis or
PostgreSQL table (both keep paused rows and fire history).

``open_reminders`` tries a gateway first and falls back to the table when no
silo of the cluster is up; the returned ``ReminderAccess.via`` says which. The
direct path applies the same validation as the management grain and writes
through the table's own compare-and-swap, so a silo that starts later sees
the rows as if the grain had written them.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from orleanspy.errors import AuthenticationError, ReminderError, SiloUnavailableError
from orleanspy.identity import GrainId
from orleanspy.options import MessagingOptions, ReminderOptions
from orleanspy.reminders.model import FireRecord, MissedReminderAction, ReminderEntry, TickStatus
from orleanspy.reminders.schedule import next_slot
from orleanspy.reminders.spec import check_grace, new_entry

__all__ = [
    "ReminderAccess",
    "entry_json",
    "fire_json",
    "json_value",
    "open_reminders",
    "parse_grain_id",
]

#: How far ahead ``reminders list`` looks: every row, in due order.
_FOREVER = timedelta(days=365 * 200)


def parse_grain_id(text: str) -> GrainId:
    """``Type/key`` (a string key) or the canonical ``Type/s:key``, ``Type/i:42``,
    ``Type/u:<uuid>``; ``ValueError`` saying the forms otherwise."""
    try:
        return GrainId.parse(text)
    except ValueError:
        pass
    type_name, sep, key = text.partition("/")
    if not sep or not type_name or not key:
        raise ValueError(
            f"not a grain id: {text!r}; write TYPE/KEY (a string key) or TYPE/i:42, TYPE/u:UUID"
        )
    return GrainId(type_name, key)


def entry_json(entry: ReminderEntry) -> dict[str, Any]:
    """A row for ``--json``: times in ISO 8601 UTC, the period in seconds."""

    def iso(t: datetime | None) -> str | None:
        return None if t is None else t.astimezone(UTC).isoformat()

    return {
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


class ReminderAccess(Protocol):
    """The reminder operations of the CLI; ``via`` names the path taken."""

    via: str

    async def rows(self, grain: GrainId | None, limit: int) -> list[ReminderEntry]: ...
    async def get(self, grain: GrainId, name: str) -> ReminderEntry: ...
    async def upcoming(self, horizon: timedelta, limit: int) -> list[ReminderEntry]: ...
    async def count(self) -> int: ...
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
    def __init__(self, mgmt: Any, endpoint: str) -> None:
        self._m = mgmt
        self.via = f"gateway {endpoint}"

    async def rows(self, grain: GrainId | None, limit: int) -> list[ReminderEntry]:
        if grain is not None:
            rows: list[ReminderEntry] = await self._m.list_for_grain(grain)
            return rows[:limit]
        return list(await self._m.upcoming(_FOREVER, limit))

    async def get(self, grain: GrainId, name: str) -> ReminderEntry:
        for row in await self._m.list_for_grain(grain):
            if row.name == name:
                return row  # type: ignore[no-any-return]
        raise ReminderError(f"{grain} has no reminder {name!r}")

    async def upcoming(self, horizon: timedelta, limit: int) -> list[ReminderEntry]:
        return list(await self._m.upcoming(horizon, limit))

    async def count(self) -> int:
        return int(await self._m.count_all())

    async def set_priority(self, grain: GrainId, name: str, priority: int) -> ReminderEntry:
        return await self._m.set_priority(grain, name, priority)  # type: ignore[no-any-return]

    async def set_action(
        self, grain: GrainId, name: str, action: MissedReminderAction
    ) -> ReminderEntry:
        return await self._m.set_action(grain, name, action)  # type: ignore[no-any-return]

    async def set_grace(self, grain: GrainId, name: str, grace: timedelta | None) -> ReminderEntry:
        return await self._m.set_grace(grain, name, grace)  # type: ignore[no-any-return]

    async def repair(self, grain: GrainId, name: str) -> ReminderEntry:
        return await self._m.repair(grain, name)  # type: ignore[no-any-return]

    async def delete(self, grain: GrainId, name: str) -> bool:
        return bool(await self._m.delete(grain, name))

    async def pause(self, grain: GrainId, name: str) -> ReminderEntry:
        return await self._m.pause(grain, name)  # type: ignore[no-any-return]

    async def resume(self, grain: GrainId, name: str) -> ReminderEntry:
        return await self._m.resume(grain, name)  # type: ignore[no-any-return]

    async def trigger(self, grain: GrainId, name: str) -> TickStatus:
        return await self._m.trigger(grain, name)  # type: ignore[no-any-return]

    async def history(self, grain: GrainId, name: str) -> list[FireRecord]:
        return list(await self._m.history(grain, name))


class _Direct:
    """The table itself (no silo up). Writes use the row's etag, so a silo that
    moved the row meanwhile makes the write fail instead of being overwritten."""

    def __init__(self, table: Any, service_id: str, url: str, kind: str = "Redis") -> None:
        self._t = table
        self._service_id = service_id
        self.via = f"the {kind} table at {url} (no silo is up)"

    @staticmethod
    def _now() -> datetime:
        return datetime.now(UTC)

    async def rows(self, grain: GrainId | None, limit: int) -> list[ReminderEntry]:
        if grain is not None:
            rows: list[ReminderEntry] = await self._t.read_grain(grain)
            return rows[:limit]
        return list(await self._t.upcoming(self._now() + _FOREVER, limit))

    async def get(self, grain: GrainId, name: str) -> ReminderEntry:
        row: ReminderEntry | None = await self._t.read(grain, name)
        if row is None:
            raise ReminderError(f"{grain} has no reminder {name!r}")
        return row

    async def upcoming(self, horizon: timedelta, limit: int) -> list[ReminderEntry]:
        return list(await self._t.upcoming(self._now() + horizon, limit))

    async def count(self) -> int:
        return int(await self._t.count())

    async def _store(self, row: ReminderEntry) -> ReminderEntry:
        return row.with_etag(await self._t.upsert(row))

    async def set_priority(self, grain: GrainId, name: str, priority: int) -> ReminderEntry:
        row = await self.get(grain, name)
        new_entry(  # validation only, as the management grain does it
            service_id=row.service_id,
            grain_id=grain,
            name=name,
            now=self._now(),
            options=ReminderOptions(),
            period=timedelta(days=1),
            priority=priority,
        )
        return await self._store(replace(row, priority=int(priority)))

    async def set_action(
        self, grain: GrainId, name: str, action: MissedReminderAction
    ) -> ReminderEntry:
        row = await self.get(grain, name)
        return await self._store(replace(row, action=action))

    async def set_grace(self, grain: GrainId, name: str, grace: timedelta | None) -> ReminderEntry:
        row = await self.get(grain, name)
        return await self._store(replace(row, grace=check_grace(grace)))

    async def repair(self, grain: GrainId, name: str) -> ReminderEntry:
        row = await self.get(grain, name)
        return await self._store(replace(row, next_due=next_slot(row, self._now())))

    async def delete(self, grain: GrainId, name: str) -> bool:
        row: ReminderEntry | None = await self._t.read(grain, name)
        if row is None or row.etag is None:
            return False
        return bool(await self._t.remove(grain, name, row.etag))

    async def pause(self, grain: GrainId, name: str) -> ReminderEntry:
        row = await self.get(grain, name)
        return row if row.paused else await self._store(replace(row, paused=True))

    async def resume(self, grain: GrainId, name: str) -> ReminderEntry:
        row = await self.get(grain, name)
        return await self._store(replace(row, paused=False)) if row.paused else row

    async def history(self, grain: GrainId, name: str) -> list[FireRecord]:
        return list(await self._t.read_history(grain, name))

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
) -> AsyncIterator[ReminderAccess]:
    """A gateway's management grain if a silo of the cluster answers (found in
    the membership table at ``membership_url``), else the reminder table at
    ``table_url`` (default ``membership_url``) directly: Redis (its shard count
    read from the table's own metadata) or PostgreSQL."""
    from orleanspy.client import ClusterClient

    async with AsyncExitStack() as stack:
        client = ClusterClient(membership_url, cluster_id, service_id, options=messaging)
        try:
            await client.start()
        except SiloUnavailableError as exc:
            if isinstance(exc.__cause__, AuthenticationError):
                raise
            yield await _direct(stack, table_url or membership_url, service_id)
            return
        stack.push_async_callback(client.aclose)
        yield _ViaGateway(client.reminders, ", ".join(client.gateways))


async def _direct(stack: AsyncExitStack, url: str, service_id: str) -> ReminderAccess:
    from orleanspy._redis import key_prefix, redacted, translate_errors
    from orleanspy.tables import TableConnections, table_backend

    connections = TableConnections(stack)
    if table_backend(url) == "postgres":
        table = await connections.reminder_table(url, service_id=service_id, shards=1)
        await table.start(stack)
        return _Direct(table, service_id, redacted(url), "PostgreSQL")
    client = connections.redis(url)
    with translate_errors("reminder table lookup"):
        shards = await client.hget(f"{key_prefix(service_id)}rem:meta", "shards")
    if shards is None:
        return _Empty(service_id, redacted(url))
    table = await connections.reminder_table(url, service_id=service_id, shards=int(shards))
    await table.start(stack)
    return _Direct(table, service_id, redacted(url))


class _Empty(_Direct):
    """No reminder table exists for the service: reads are empty, writes find nothing."""

    def __init__(self, service_id: str, url: str) -> None:
        super().__init__(None, service_id, url)
        self.via = f"the Redis table at {url} (no silo is up; service {service_id!r} has none)"

    async def rows(self, grain: GrainId | None, limit: int) -> list[ReminderEntry]:
        return []

    async def get(self, grain: GrainId, name: str) -> ReminderEntry:
        raise ReminderError(f"{grain} has no reminder {name!r}")

    async def upcoming(self, horizon: timedelta, limit: int) -> list[ReminderEntry]:
        return []

    async def count(self) -> int:
        return 0

    async def delete(self, grain: GrainId, name: str) -> bool:
        return False

    async def history(self, grain: GrainId, name: str) -> list[FireRecord]:
        return []
