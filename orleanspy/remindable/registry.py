"""The reminder registry: what grains' ``register_or_update_reminder`` & co. call.

Registrations go straight to the shared table (every silo's service sees the
write on the change feed; the local service is told at once as well). The
registry validates input (``ReminderError``), refuses grains that are not
``Remindable``, ``OverlapPolicy.ALLOW_ALL`` on grains that cannot interleave
their ticks (``ConfigurationError``), and options the cluster's silos do not
all know yet (``FeatureUnavailableError``, through ``require``); nothing is
written then.

Labels and a ``calendar`` are such options (``Feature.REMINDER_LABELS``,
``REMINDER_CALENDARS``; ``policies.needed_features``). A ``calendar`` is read from the table
(``stores.CalendarStore``) and its rules copied into the row; a registration
that raced a change of the calendar is written again with the new rules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from orleanspy import tracing
from orleanspy.clock import Clock
from orleanspy.errors import ReminderError
from orleanspy.grain import GrainDefinition, check_overlap
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.remindable.operations import ReminderOperations
from orleanspy.reminders.calendars import StoredCalendar
from orleanspy.reminders.model import ReminderChange, ReminderEntry, TickStatus
from orleanspy.reminders.policies import needed_features
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.reminders.stores import CalendarStore
from orleanspy.reminders.table import BulkReminderTable, ReminderTable, remove_current
from orleanspy.versions import PROTOCOL, Feature

#: ``require(feature, what)`` raises ``FeatureUnavailableError`` (naming ``what``
#: and the silos that lack it) unless every live silo has ``feature`` (a
#: ``Feature``, or its name).
Require = Callable[[Feature | str, str], None]

__all__ = ["Registration", "ReminderRegistry", "Require", "read_calendar"]

#: Rows per round trip of ``register_many``.
BULK_BATCH = 2000
#: Batches in flight at once, of ``register_many`` and of the group commit of
#: concurrent registrations: the next batch is encoded while the store runs the
#: previous one (Redis: about half the time each).
_BULK_IN_FLIGHT = 2
#: Times a registration with a calendar is written again when the calendar
#: changed while it was written.
_CALENDAR_ATTEMPTS = 5


async def read_calendar(table: ReminderTable, name: str | None) -> StoredCalendar | None:
    """The stored calendar ``name`` (``None`` for no name, and for an unknown one:
    ``new_entry`` then says so); ``ReminderError`` for a table that keeps none."""
    if name is None:
        return None
    if not isinstance(table, CalendarStore):
        raise ReminderError(
            f"calendar {name!r}: the reminder table ({type(table).__name__}) keeps no calendars"
        )
    return await table.read_calendar(name)


@dataclass(frozen=True, slots=True)
class Registration(ReminderSpec):
    """One reminder to register in bulk (``ReminderRegistry.register_many``):
    the grain, the name, and what it asks for (the ``ReminderSpec`` fields, as
    keywords: they mean what ``register_or_update_reminder``'s arguments mean)."""

    grain_id: GrainId
    name: str


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
        #: The cluster's feature level (``versions.Feature``); set by the silo.
        self.feature_level: Callable[[], int] = lambda: PROTOCOL
        #: Where management actions run, for their audit records (the silo's name).
        self.via: str | None = None
        #: Checks that the cluster has a feature (set by a cluster silo; ``None``:
        #: a silo of its own, which has every feature of its release).
        self.require: Require | None = None
        #: Told when a backfill was asked for here (the local service looks now).
        self.backfill_started: Callable[[], None] | None = None

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
            level=self.feature_level,
            via=self.via,
            require=self.require,
            definitions=self._definitions,
            backfill_started=self.backfill_started,
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

    def _trace_context(self) -> str | None:
        """The current span's ``traceparent`` for a row to keep (its ticks link to
        it), when this process traces and the cluster's level has
        ``Feature.TRACE_LINKS``; else ``None``."""
        tracer = tracing.active()
        if tracer is None or self.feature_level() < Feature.TRACE_LINKS:
            return None
        return tracer.current_traceparent()

    def _check_remindable(self, grain_id: GrainId) -> GrainDefinition:
        defn = self._definitions(grain_id.type_name)
        if defn is None or not defn.remindable:
            raise ReminderError(
                f"{grain_id.type_name} cannot have reminders: derive the grain class from "
                "orleanspy.Remindable and implement receive_reminder"
            )
        return defn

    def check_spec(self, defn: GrainDefinition, spec: ReminderSpec, what: str) -> None:
        """What validation cannot say from the spec alone: ``ALLOW_ALL`` needs a
        grain that interleaves its ticks, and every option the cluster's silos
        must know (``needed_features``) needs them all to know it."""
        check_overlap(defn, spec.overlap, what)
        if self.require is not None:
            for feature in needed_features(spec):
                self.require(feature, what)

    async def register(self, grain_id: GrainId, name: str, spec: ReminderSpec) -> ReminderEntry:
        """Validate and upsert (last writer wins; the schedule re-anchors at now).
        Concurrent registrations on one silo share round trips to the table
        (``_CoalescedUpserts``); each is told its own row."""
        defn = self._check_remindable(grain_id)
        self.check_spec(defn, spec, f"reminder {name!r} of {grain_id}")
        now = self.clock.now()
        calendar = await read_calendar(self.table, spec.calendar)
        trace_context = self._trace_context()

        def build(calendar: StoredCalendar | None) -> ReminderEntry:
            entry = new_entry(
                spec,
                service_id=self.service_id,
                grain_id=grain_id,
                name=name,
                now=now,
                options=self.options,
                calendar=calendar,
            )
            return entry if trace_context is None else replace(entry, trace_context=trace_context)

        entry = build(calendar)
        upsert = self.table.upsert if self._upserts is None else self._upserts.upsert
        entry = entry.with_etag(await upsert(entry))
        self._changed(grain_id, name, entry)
        if calendar is not None:
            entry = await self._recheck_calendar(entry, calendar, build)
        return entry

    async def _recheck_calendar(
        self,
        entry: ReminderEntry,
        calendar: StoredCalendar,
        build: Callable[[StoredCalendar | None], ReminderEntry],
    ) -> ReminderEntry:
        """After writing a row with ``calendar``: if the calendar changed meanwhile
        (its change may have walked the rows before this one was written), write
        the row again with the calendar as it is now, on the etag just written (a
        later writer wins)."""
        for _ in range(_CALENDAR_ATTEMPTS):
            now = await read_calendar(self.table, calendar.name)
            if now is None or now.version <= calendar.version:
                return entry
            again = build(now)
            assert entry.etag is not None
            etag = await self.table.upsert_if(again, entry.etag)
            if etag is None:
                return entry  # another writer moved the row: its write stands
            entry, calendar = again.with_etag(etag), now
            self._changed(entry.grain_id, entry.name, entry)
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
        checked: dict[str, GrainDefinition] = {}
        registrations = list(registrations)
        calendars: dict[str, StoredCalendar | None] = {}
        for r in registrations:
            if r.calendar is not None and r.calendar not in calendars:
                calendars[r.calendar] = await read_calendar(self.table, r.calendar)
        for i, r in enumerate(registrations):
            try:
                defn = checked.get(r.grain_id.type_name)
                if defn is None:
                    defn = checked[r.grain_id.type_name] = self._check_remindable(r.grain_id)
                self.check_spec(defn, r, f"registration #{i} ({r.grain_id}, {r.name!r})")
                entries.append(
                    new_entry(
                        r,
                        service_id=self.service_id,
                        grain_id=r.grain_id,
                        name=r.name,
                        now=now,
                        options=self.options,
                        calendar=None if r.calendar is None else calendars[r.calendar],
                    )
                )
            except ReminderError as exc:
                raise ReminderError(
                    f"registration #{i} ({r.grain_id}, {r.name!r}) is invalid: {exc}"
                ) from exc
        trace_context = self._trace_context()
        if trace_context is not None:
            entries = [replace(e, trace_context=trace_context) for e in entries]
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
        # A calendar that changed while the rows were written may have walked its
        # users before some of them were: move those to it now.
        for name, used in calendars.items():
            current = await read_calendar(self.table, name)
            if used is not None and current is not None and current.version > used.version:
                await self.operations.refresh_calendar(name)
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
        """Upsert a fully built row (tools and tests; unaudited: an operator's
        change goes through ``ReminderOperations``, which audits it)."""
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
