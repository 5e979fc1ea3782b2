"""The reminder registry: what grains' ``register_or_update_reminder`` & co. call.

Registrations go straight to the shared table (every silo's service sees the
write on the change feed; the local service is told at once as well). The
registry validates input (``ReminderError``) and refuses grains that are not
``Remindable``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from orleanspy.clock import Clock
from orleanspy.errors import ReminderError
from orleanspy.grain import GrainDefinition
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.remindable.operations import ReminderOperations
from orleanspy.reminders.model import (
    MissedReminderAction,
    ReminderChange,
    ReminderEntry,
    ReminderPriority,
    RetryPolicy,
    TickStatus,
)
from orleanspy.reminders.spec import new_entry
from orleanspy.reminders.table import BulkReminderTable, ReminderTable, remove_current

__all__ = ["Registration", "ReminderRegistry"]

#: Rows per round trip of ``register_many``.
BULK_BATCH = 2000
#: Batches in flight at once, of ``register_many`` and of the group commit of
#: concurrent registrations: the next batch is encoded while the store runs the
#: previous one (Redis: about half the time each).
_BULK_IN_FLIGHT = 2


@dataclass(frozen=True, slots=True)
class Registration:
    """One reminder to register in bulk (``ReminderRegistry.register_many``);
    the fields mean what ``register_or_update_reminder``'s arguments mean."""

    grain_id: GrainId
    name: str
    due: timedelta | float | None = None
    period: timedelta | float | None = None
    cron: str | None = None
    tz: str | None = None
    priority: int = ReminderPriority.NORMAL
    action: MissedReminderAction = MissedReminderAction.SKIP
    grace: timedelta | float | None = None
    at: datetime | None = None
    jitter: timedelta | float | None = None
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    max_ticks: int | None = None
    payload: Any = field(default=None, hash=False)
    retry: RetryPolicy | None = None


class _CoalescedUpserts:
    """Concurrent upserts made into batched writes (group commit): while round
    trips to the table are out, arriving upserts queue, and the queue goes in
    the next round trip as one ``upsert_many``.

    Up to ``_BULK_IN_FLIGHT`` round trips are out at once: the next batch is
    encoded and sent while the store runs the previous one (on one Redis the two
    costs are about equal, and run on different cores). A batch is sent once the
    loop has run the callers that were ready (so callers woken together share
    one), when a round trip is free. Batches are kept about equal: a batch takes
    half of the rows queued and out, so callers that all woke together (as they
    do when one batch carries every one of them) split over both round trips
    and the two halves overlap, where one full batch beside a batch of one would
    leave the store and the callers' loop to take turns. Each caller gets its
    own row's etag, or the exception of its batch. A caller that finds nothing
    out or queued writes its row itself with a plain ``upsert`` (no task, no
    wait), so a lone caller pays what it paid before. Of two upserts of one row
    the later one stays: rows queue in arrival order, and a batch holding a row
    that is still on its way waits until that write has landed (two round trips
    may be answered in either order)."""

    def __init__(self, table: BulkReminderTable, max_batch: int) -> None:
        self._table = table
        self._max = max_batch
        # (row, its key, its caller's future), in arrival order.
        self._pending: list[tuple[ReminderEntry, str, asyncio.Future[str]]] = []
        self._out: set[asyncio.Task[None]] = set()
        self._out_rows = 0  # rows in the batches out
        self._lone = False  # a lone caller's plain upsert is out
        self._launch_soon = False
        # Row keys of the writes out now (the lone caller's included).
        self._flying: set[str] = set()

    async def upsert(self, entry: ReminderEntry) -> str:
        key = entry.key
        loop = asyncio.get_running_loop()
        if self._lone or self._out or self._pending:
            fut: asyncio.Future[str] = loop.create_future()
            self._pending.append((entry, key, fut))
            if not self._launch_soon:
                self._launch_soon = True
                loop.call_soon(self._launch)
            return await fut
        self._lone = True
        self._flying.add(key)
        try:
            return await self._table.upsert(entry)
        finally:
            self._lone = False
            self._flying.discard(key)
            self._launch()

    def _launch(self) -> None:
        """Send queued rows while a round trip is free and the next batch holds
        no row still on its way."""
        self._launch_soon = False
        while self._pending and len(self._out) + self._lone < _BULK_IN_FLIGHT:
            # Half of what is queued and out (rounded up): never empty.
            share = -(-(len(self._pending) + self._out_rows + self._lone) // _BULK_IN_FLIGHT)
            batch = self._pending[: min(self._max, share)]
            if any(key in self._flying for _, key, _ in batch):
                return  # sent when the write it waits for lands
            del self._pending[: len(batch)]
            self._flying.update(key for _, key, _ in batch)
            self._out_rows += len(batch)
            task = asyncio.get_running_loop().create_task(self._write(batch))
            self._out.add(task)
            task.add_done_callback(self._landed)

    def _landed(self, task: asyncio.Task[None]) -> None:
        self._out.discard(task)
        if task.cancelled():  # the loop is closing: nothing more is sent
            pending, self._pending = self._pending, []
            for _, _, fut in pending:
                fut.cancel()
            return
        self._launch()

    async def _write(self, batch: list[tuple[ReminderEntry, str, asyncio.Future[str]]]) -> None:
        try:
            etags = await self._table.upsert_many([e for e, _, _ in batch])
        except asyncio.CancelledError:
            for _, _, fut in batch:
                fut.cancel()
            raise
        except Exception as exc:  # each caller hears of its batch's failure
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        finally:
            self._flying.difference_update(key for _, key, _ in batch)
            self._out_rows -= len(batch)
        for (_, _, fut), etag in zip(batch, etags, strict=True):
            if not fut.done():
                fut.set_result(etag)


class ReminderRegistry:
    """Register, read and remove reminder rows on behalf of grains."""

    def __init__(
        self,
        table: ReminderTable,
        *,
        service_id: str,
        clock: Clock,
        options: ReminderOptions,
        definitions: Callable[[str], GrainDefinition | None],
    ) -> None:
        self.table = table
        self.service_id = service_id
        self.clock = clock
        self.options = options
        self._definitions = definitions
        self._listeners: list[Callable[[ReminderChange], None]] = []
        #: Delivers one off-schedule tick as the reminder service does (set by
        #: the silo; ``receive_reminder`` refuses calls that are not ticks).
        self.deliver_tick: Callable[[GrainId, str, TickStatus], Awaitable[None]] | None = None
        self._upserts = (
            _CoalescedUpserts(table, BULK_BATCH) if isinstance(table, BulkReminderTable) else None
        )
        #: The grain types some silo of the cluster hosts (orphans are rows of
        #: other types); set by the silo, ``None`` when not known.
        self.hosted_types: Callable[[], Awaitable[Iterable[str]]] | None = None

    @property
    def operations(self) -> ReminderOperations:
        """The management operations over this registry's table; their writes
        are told to this registry's listeners."""
        return ReminderOperations(
            self.table,
            service_id=self.service_id,
            clock=self.clock,
            options=self.options,
            notify=self._changed,
            hosted_types=self.hosted_types,
        )

    def add_listener(self, listener: Callable[[ReminderChange], None]) -> None:
        """``listener`` hears of every write made through this registry."""
        self._listeners.append(listener)

    def _changed(self, grain_id: GrainId, name: str, entry: ReminderEntry | None) -> None:
        if not self._listeners:
            return  # a registry without a service (a script, a client): nothing to tell
        # A paused row left the schedule: told as a removal, as the tables do.
        live = entry is not None and not entry.paused
        change = ReminderChange(
            grain_id,
            name,
            entry.next_due if live and entry is not None else None,
            int(entry.priority) if live and entry is not None else None,
            entry=entry,
        )
        for listener in self._listeners:
            listener(change)

    def _check_remindable(self, grain_id: GrainId) -> None:
        defn = self._definitions(grain_id.type_name)
        if defn is None or not defn.remindable:
            raise ReminderError(
                f"{grain_id.type_name} cannot have reminders: derive the grain class from "
                "orleanspy.Remindable and implement receive_reminder"
            )

    async def register(
        self,
        grain_id: GrainId,
        name: str,
        *,
        due: timedelta | float | None = None,
        period: timedelta | float | None = None,
        cron: str | None = None,
        tz: str | None = None,
        priority: int | None = None,
        action: MissedReminderAction | None = None,
        grace: timedelta | float | None = None,
        at: datetime | None = None,
        jitter: timedelta | float | None = None,
        starts_at: datetime | None = None,
        ends_at: datetime | None = None,
        max_ticks: int | None = None,
        payload: Any = None,
        retry: RetryPolicy | None = None,
    ) -> ReminderEntry:
        """Validate and upsert (last writer wins; the schedule re-anchors at now).
        Concurrent registrations on one silo share round trips to the table
        (``_CoalescedUpserts``); each is told its own row."""
        self._check_remindable(grain_id)
        entry = new_entry(
            service_id=self.service_id,
            grain_id=grain_id,
            name=name,
            now=self.clock.now(),
            options=self.options,
            due=due,
            period=period,
            cron=cron,
            tz=tz,
            priority=ReminderPriority.NORMAL if priority is None else priority,
            action=MissedReminderAction.SKIP if action is None else action,
            grace=grace,
            at=at,
            jitter=jitter,
            starts_at=starts_at,
            ends_at=ends_at,
            max_ticks=max_ticks,
            payload=payload,
            retry=retry,
        )
        upsert = self.table.upsert if self._upserts is None else self._upserts.upsert
        entry = entry.with_etag(await upsert(entry))
        self._changed(grain_id, name, entry)
        return entry

    async def register_many(
        self, registrations: Iterable[Registration], *, batch: int = BULK_BATCH
    ) -> int:
        """Register many reminders (upsert, last writer wins), ``batch`` rows per
        round trip: for seeding or migrating a table. Every registration is
        validated before anything is written; the first invalid one raises
        ``ReminderError`` naming its position, and nothing is written. Two
        batches are in flight at once (a row registered twice is written once,
        as its last registration). Returns how many registrations there were.
        The local service hears of each row, and other silos read the change
        feed, as for single registrations."""
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        now = self.clock.now()
        entries: list[ReminderEntry] = []
        checked: set[str] = set()
        for i, r in enumerate(registrations):
            try:
                if r.grain_id.type_name not in checked:
                    self._check_remindable(r.grain_id)
                    checked.add(r.grain_id.type_name)
                entries.append(
                    new_entry(
                        service_id=self.service_id,
                        grain_id=r.grain_id,
                        name=r.name,
                        now=now,
                        options=self.options,
                        due=r.due,
                        period=r.period,
                        cron=r.cron,
                        tz=r.tz,
                        priority=r.priority,
                        action=r.action,
                        grace=r.grace,
                        at=r.at,
                        jitter=r.jitter,
                        starts_at=r.starts_at,
                        ends_at=r.ends_at,
                        max_ticks=r.max_ticks,
                        payload=r.payload,
                        retry=r.retry,
                    )
                )
            except ReminderError as exc:
                raise ReminderError(
                    f"registration #{i} ({r.grain_id}, {r.name!r}) is invalid: {exc}"
                ) from exc
        # A row registered twice ends as its last registration: write that one
        # only, so that batches in flight together never hold the same row.
        rows = list({e.key: e for e in entries}.values())
        chunks = [rows[i : i + batch] for i in range(0, len(rows), batch)]
        pending: set[asyncio.Task[None]] = set()
        try:
            for chunk in chunks:
                if len(pending) >= _BULK_IN_FLIGHT:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()  # a failed batch stops the registration
                pending.add(asyncio.create_task(self._write_batch(chunk)))
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        return len(entries)

    async def _write_batch(self, chunk: list[ReminderEntry]) -> None:
        if isinstance(self.table, BulkReminderTable):
            await self.table.upsert_many(chunk)
        else:
            await asyncio.gather(*map(self.table.upsert, chunk))
        # Listeners read the row's due time and priority, not its etag: no copy.
        for entry in chunk:
            self._changed(entry.grain_id, entry.name, entry)

    async def store(self, entry: ReminderEntry) -> ReminderEntry:
        """Upsert a fully built row (management operations)."""
        entry = entry.with_etag(await self.table.upsert(entry))
        self._changed(entry.grain_id, entry.name, entry)
        return entry

    async def store_if(self, entry: ReminderEntry, expected_etag: str | None) -> bool:
        """Write ``entry`` only if the row is absent (``expected_etag`` ``None``) or
        still has ``expected_etag``; ``False`` if another writer got there first."""
        etag = await self.table.upsert_if(entry, expected_etag)
        if etag is None:
            return False
        self._changed(entry.grain_id, entry.name, entry.with_etag(etag))
        return True

    async def store_if_many(self, writes: Sequence[tuple[ReminderEntry, str | None]]) -> list[bool]:
        """``store_if`` for each pair, in one round trip on a ``BulkReminderTable``."""
        if isinstance(self.table, BulkReminderTable):
            etags = await self.table.upsert_if_many(writes)
        else:
            etags = list(await asyncio.gather(*(self.table.upsert_if(e, t) for e, t in writes)))
        for (entry, _), etag in zip(writes, etags, strict=True):
            if etag is not None:
                self._changed(entry.grain_id, entry.name, entry)
        return [etag is not None for etag in etags]

    async def list_many(self, grain_ids: Sequence[GrainId]) -> list[list[ReminderEntry]]:
        """``list`` for each grain, in one batch on a ``BulkReminderTable``."""
        if isinstance(self.table, BulkReminderTable):
            return await self.table.read_grains(grain_ids)
        return list(await asyncio.gather(*map(self.table.read_grain, grain_ids)))

    async def remove_if_unchanged(self, row: ReminderEntry) -> bool:
        """Remove ``row`` if it still has the etag it was read with; ``False`` if
        it is gone or was rewritten meanwhile (then it is kept)."""
        if row.etag is None or not await self.table.remove(row.grain_id, row.name, row.etag):
            return False
        self._changed(row.grain_id, row.name, None)
        return True

    async def unregister(self, grain_id: GrainId, name: str) -> bool:
        """Remove the row; ``False`` if it did not exist. Retries lost etag races
        (the service may move ``next_due`` between our read and our remove)."""
        removed = await remove_current(self.table, grain_id, name)
        if removed:
            self._changed(grain_id, name, None)
        return removed

    async def get(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        return await self.table.read(grain_id, name)

    async def list(self, grain_id: GrainId) -> list[ReminderEntry]:
        return await self.table.read_grain(grain_id)
