"""The adaptive reminder service (DESIGN.md section 5).

One per silo. It owns some ring ranges and, for those, keeps only the rows that
fall due soon in a bounded window; one sleeper wakes when the earliest is due;
due rows wait in priority lanes for a delivery permit; each delivery is a grain
call ``receive_reminder``; after the acknowledgement the next slot is persisted
in batches. The parts live in private modules, one job each:

- ``_ownership``: the owned ranges and what a ring change means;
- ``_loader``: which rows the window holds (refills, hints, repair, change feed);
- ``_window``: the bounded due-heap (all resident rows count against the bound);
- ``_ticker``: the one sleeper and the missed-tick rule;
- ``_lanes``: priority lanes and permits;
- ``_persist``: batched, retried CAS writes;
- ``_adaptive``: the bucket-size formula.

This module composes them and delivers the due rows.

Storage outages. Every table error is logged and retried with backoff; the
service never stops for one. Rows already held keep ticking on their local
schedule; their updates wait in the persister (the newest per row wins, CAS
against the etag the row was loaded with until a write succeeds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from datetime import datetime

from orleanspy.clock import Clock
from orleanspy.errors import (
    ActivationError,
    GrainCallTimeoutError,
    MessageRejectedError,
    SiloUnavailableError,
    StorageUnavailableError,
)
from orleanspy.options import ReminderOptions
from orleanspy.reminders._adaptive import LoadSignals, default_load, window_size
from orleanspy.reminders._lanes import Dispatcher
from orleanspy.reminders._loader import Loader
from orleanspy.reminders._ownership import Ownership
from orleanspy.reminders._persist import Persister, update_key
from orleanspy.reminders._ticker import Backoff, Ticker, TickPlan, plan_tick
from orleanspy.reminders._window import DueWindow, Row, RowState
from orleanspy.reminders.model import (
    MissedReminder,
    MissedReminderAction,
    ReminderChange,
    ReminderEntry,
    ScheduleUpdate,
    TickStatus,
)
from orleanspy.reminders.table import ReminderTable
from orleanspy.ring import RingRange

__all__ = ["LoadSignals", "ReminderService", "ReminderServiceStats"]

log = logging.getLogger(__name__)

#: Failures of the call path, not of the grain: the same tick is retried.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    SiloUnavailableError,
    GrainCallTimeoutError,
    MessageRejectedError,
    ActivationError,
    StorageUnavailableError,
)
#: Upper bound, in seconds of real time, of the final flush at shutdown.
FINAL_FLUSH_SECONDS = 5.0

Deliver = Callable[[ReminderEntry, TickStatus], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ReminderServiceStats:
    """A snapshot of the service's state and counters (counters only grow).

    ``loaded``: rows in the due-heap; ``queued``: due rows waiting for a permit;
    ``in_flight``: deliveries running; ``resident``: every row held (heap and
    due), never above ``bucket_size`` except briefly for dropped rows whose
    delivery is still finishing; ``high_water``: the most rows ever resident.
    """

    bucket_size: int
    loaded: int
    queued: int
    in_flight: int
    resident: int
    high_water: int
    persist_pending: int
    delivered: int
    grain_errors: int
    retries: int
    missed: int
    skipped: int
    notified: int
    repaired: int
    cas_conflicts: int
    persisted: int
    persist_failures: int
    refills: int
    load_errors: int
    evicted: int


class ReminderService:
    """Delivers the ticks of the reminder rows in this silo's ring ranges.

    ``deliver(entry, status)`` makes the grain call ``receive_reminder`` and
    returns on acknowledgement. If it raises one of ``TRANSIENT_ERRORS`` the
    same tick is retried with backoff; any other exception is the grain's own
    failure: logged, counted, and the tick counts as delivered (not retried).
    ``publish_missed`` receives a ``MissedReminder`` for NOTIFY rows. ``load``
    gives the signals for the adaptive bucket size (``options.adaptive``).
    """

    def __init__(
        self,
        table: ReminderTable,
        *,
        deliver: Deliver,
        clock: Clock,
        options: ReminderOptions,
        publish_missed: Callable[[MissedReminder], Awaitable[None]] | None = None,
        load: Callable[[], LoadSignals] | None = None,
        name: str = "",
    ) -> None:
        self._table = table
        self._deliver = deliver
        self._clock = clock
        self._options = options
        self._publish_missed = publish_missed
        self._name = name
        load = load or default_load
        self._ownership = Ownership()
        self._window = DueWindow(window_size(options, load, name))
        self._ticker = Ticker(clock, self._window, self._on_due)
        self._dispatcher = Dispatcher(
            options.permits, self._tick, enable_priority=options.enable_priority
        )
        self._persister = Persister(table, clock, options, self._on_persisted)
        self._loader = Loader(
            table,
            clock,
            options,
            ownership=self._ownership,
            window=self._window,
            persister=self._persister,
            load=load,
            drop=self._drop,
            notify=self._notify,
            wake_ticker=self._ticker.wake,
            name=name,
        )
        self._running = False
        self._n = dict.fromkeys(
            (
                "delivered",
                "grain_errors",
                "retries",
                "missed",
                "skipped",
                "notified",
                "cas_conflicts",
            ),
            0,
        )

    # -- public surface ---------------------------------------------------------------

    async def start(self, stack: AsyncExitStack) -> None:
        """Subscribe to the change feed and start the tasks (sleeper, dispatcher,
        persister, loader). Pushes onto ``stack``: cancelling them, then a final
        flush of pending persistence bounded by ``FINAL_FLUSH_SECONDS`` and
        shielded from cancellation."""
        # Subscribe before the first refill so that no change falls in between.
        feed = self._table.changes()
        stack.push_async_callback(self._final_flush)
        tasks = [
            asyncio.create_task(coro, name=f"reminders-{part}-{self._name}")
            for part, coro in (
                ("ticker", self._ticker.run()),
                ("dispatcher", self._dispatcher.run()),
                ("persister", self._persister.run()),
                ("loader", self._loader.run()),
                ("feed", self._loader.follow(feed)),
            )
        ]
        stack.push_async_callback(_cancel, tasks)
        self._running = True
        log.info(
            "reminder service started name=%s bucket_size=%d", self._name, self._window.capacity
        )

    def set_ranges(self, ranges: Sequence[RingRange]) -> None:
        """Own exactly ``ranges`` from now on (called on every ring change).

        Rows outside them leave memory at once, including due rows still waiting
        for a permit; a delivery already running finishes (at least once). Newly
        owned ranges are read right away.
        """
        new = self._ownership.update(ranges)
        for row in self._window.retain(lambda row: self._ownership.owns(row.entry.grain_id)):
            row.dropped = True
        self._dispatcher.lanes.retain(lambda row: not row.dropped)
        self._loader.ranges_changed(new)
        self._ticker.wake()
        log.info(
            "reminder ranges changed name=%s ranges=%d new=%d resident=%d",
            self._name,
            len(self._ownership.ranges),
            len(new),
            len(self._window),
        )

    def notify_change(self, change: ReminderChange) -> None:
        """Take a change of the table into account (from the feed or a local hint).

        A removal drops the row. A change of a row not held, due inside the
        window, or of a held row that another writer moved, schedules a read of
        the row; the echo of this service's own write is ignored.
        """
        self._loader.notify_change(change)

    async def refill_now(self) -> None:
        """Run a full refill and return when one that began after this call finished.

        Before ``start`` the refill runs inline. Errors are retried by the loader
        (this call waits until a refill succeeds)."""
        if not self._running:
            await self._loader.refill(self._ownership.ranges)
            return
        await self._loader.request_refill()

    async def wait_persisted(self) -> None:
        """Return once no schedule update is waiting to be written."""
        await self._persister.wait_idle()

    @property
    def ranges(self) -> tuple[RingRange, ...]:
        return self._ownership.ranges

    @property
    def stats(self) -> ReminderServiceStats:
        w, d, p, ld, n = self._window, self._dispatcher, self._persister, self._loader, self._n
        return ReminderServiceStats(
            bucket_size=w.capacity,
            loaded=w.queued,
            queued=d.queued,
            in_flight=d.in_flight,
            resident=len(w),
            high_water=w.high_water,
            persist_pending=len(p),
            delivered=n["delivered"],
            grain_errors=n["grain_errors"],
            retries=n["retries"],
            # The repair pass skips rows in place: each one was missed and skipped.
            missed=n["missed"] + ld.repaired,
            skipped=n["skipped"] + ld.repaired,
            notified=n["notified"],
            repaired=ld.repaired,
            cas_conflicts=n["cas_conflicts"],
            persisted=p.written,
            persist_failures=p.failures,
            refills=ld.refills,
            load_errors=ld.load_errors,
            evicted=ld.evicted,
        )

    # -- delivery ---------------------------------------------------------------------

    def _on_due(self, rows: list[Row]) -> None:
        self._dispatcher.put(rows)
        self._loader.check_low()

    async def _tick(self, row: Row) -> None:
        """Deliver (or skip) one due row, then move it to its next slot."""
        if row.dropped:
            return
        now = self._clock.now()
        plan = plan_tick(row, now, self._options.grace)
        last_fire = row.last_fire
        if plan.missed:
            self._n["missed"] += 1
        if plan.deliver:
            delivered_at = await self._call(row, plan)
            if delivered_at is None:
                return
            last_fire = delivered_at
            next_due = plan.resume or row.schedule.next_after(plan.slot)
        else:
            assert plan.resume is not None
            next_due = plan.resume
            self._n["skipped"] += 1
            if row.entry.action is MissedReminderAction.NOTIFY:
                await self._notify(row.entry, plan.slot, now, plan.missed_ticks, next_due)
        self._advance(row, next_due, last_fire)

    async def _call(self, row: Row, plan: TickPlan) -> datetime | None:
        """Deliver the tick until acknowledged; the delivery time, or ``None`` if the
        row was dropped while retrying (the new owner delivers it)."""
        entry = row.entry
        backoff = Backoff(self._options.retry_initial, self._options.retry_max)
        while True:
            delivered_at = self._clock.now()
            status = TickStatus(
                first_tick_time=entry.start_at,
                period=entry.period,
                cron=entry.cron,
                current_tick_time=plan.slot,
                delivered_at=delivered_at,
                missed_ticks=plan.missed_ticks,
                priority=int(entry.priority),
            )
            try:
                await self._deliver(entry, status)
            except TRANSIENT_ERRORS as exc:
                self._n["retries"] += 1
                log.info("reminder tick retry name=%s key=%s error=%r", self._name, row.key, exc)
                await self._clock.sleep(backoff.next())
                if row.dropped:
                    return None
                continue
            except Exception as exc:
                # The grain's own receive_reminder failed: not retried (DESIGN.md 2).
                self._n["grain_errors"] += 1
                log.warning(
                    "reminder tick failed in grain name=%s key=%s slot=%s error=%r",
                    self._name,
                    row.key,
                    plan.slot.isoformat(),
                    exc,
                )
                return delivered_at
            self._n["delivered"] += 1
            return delivered_at

    def _advance(self, row: Row, next_due: datetime, last_fire: datetime | None) -> None:
        """Record the row's next slot: persist it, and re-queue or release the row."""
        row.next_due, row.last_fire = next_due, last_fire
        self._loader.ticked()
        etag = row.entry.etag
        if etag is not None:
            self._persister.submit(
                ScheduleUpdate(row.entry.grain_id, row.entry.name, etag, next_due, last_fire)
            )
        if row.dropped:
            return
        if next_due <= self._clock.now() + self._options.look_ahead:
            if self._window.push(row):
                self._ticker.wake()
        else:
            self._window.release(row)
        self._loader.check_low()

    async def _notify(
        self,
        entry: ReminderEntry,
        scheduled: datetime,
        now: datetime,
        missed_ticks: int,
        next_due: datetime,
    ) -> None:
        if self._publish_missed is None:
            return
        event = MissedReminder(
            service_id=entry.service_id,
            grain_id=entry.grain_id,
            name=entry.name,
            scheduled=scheduled,
            detected_at=now,
            missed_ticks=missed_ticks,
            next_due=next_due,
        )
        try:
            await self._publish_missed(event)
        except Exception as exc:
            log.warning(
                "missed reminder not published name=%s key=%s error=%r", self._name, entry.key, exc
            )
            return
        self._n["notified"] += 1

    def _drop(self, row: Row) -> None:
        """Forget ``row``: it must not tick or be re-queued any more."""
        row.dropped = True
        if row.state is RowState.DUE:
            self._dispatcher.lanes.remove(row)
        self._window.release(row)

    def _on_persisted(self, update: ScheduleUpdate, etag: str | None) -> None:
        key = update_key(update)
        self._loader.mark_changed(key)
        row = self._window.get(key)
        mine = row is not None and row.entry.etag == update.etag
        if etag is None:
            self._n["cas_conflicts"] += 1
            log.info("reminder moved by another writer name=%s key=%s", self._name, key)
            if row is not None and mine:
                self._drop(row)
        elif row is not None and mine:
            row.entry = replace(
                row.entry, etag=etag, next_due=update.next_due, last_fire=update.last_fire
            )

    # -- shutdown ---------------------------------------------------------------------

    async def _final_flush(self) -> None:
        async def bounded() -> int:
            try:
                async with asyncio.timeout(FINAL_FLUSH_SECONDS):
                    return await self._persister.flush()
            except TimeoutError:
                return len(self._persister)

        self._running = False
        # Shielded: a cancelled shutdown still gets its bounded flush.
        left = await asyncio.shield(asyncio.ensure_future(bounded()))
        if left:
            log.warning(
                "reminder updates not persisted at stop name=%s rows=%d (their ticks repeat)",
                self._name,
                left,
            )


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            log.error("reminder service task failed error=%r", result)
