"""The adaptive reminder service (DESIGN.md section 5).

One per silo. It owns some ring ranges and, for those, keeps only the rows that
fall due soon in a bounded window; one sleeper wakes when the earliest is due;
due rows wait in priority lanes for a delivery permit; each delivery is a grain
call ``receive_reminder``; after the acknowledgement the next slot is persisted
in batches. The parts live in private modules, one job each:

- ``_ownership``: the owned ranges and what a ring change means;
- ``_window``: the bounded due-heap (all resident rows count against the bound);
- ``_ticker``: the one sleeper and the missed-tick rule;
- ``_lanes``: priority lanes and permits;
- ``_persist``: batched, retried CAS writes;
- ``_adaptive``: the bucket-size formula.

This module composes them and does the loading, in one task so that reads of
the table never race each other.

Loading. A *refill* reads every owned range with ``read_due(range, now +
look_ahead, limit)`` and keeps the earliest ``bucket_size`` rows overall
(queued rows that lose are evicted; rows being delivered are never evicted). It
runs at start, every ``poll_interval``, on ``refill_now()``, when the heap falls
below half (or half of it turned over) while the last refill left rows
behind, and after the change feed was lost. A newly owned range is read at
once. A change for an owned row that is not held (or that another writer
moved) is read with ``table.read`` and admitted if it is inside the window and
would make the cut; a removal drops the row.

Repair. Normal loading already takes overdue rows first (``read_due`` returns
the earliest first), so an overdue row is only starved while the window is
full of rows being delivered. Every ``repair_interval`` the repair pass reads
owned rows with ``next_due < now - look_ahead`` that are not held (at most
``bucket_size`` per range) and applies SKIP or NOTIFY to them in place — the
next slot after now is persisted (and NOTIFY published) without taking room in
the window or a delivery permit. FIRE_IMMEDIATELY rows need a delivery, so the
pass leaves them to the window, which loads them first once there is room.

Storage outages. Every table error is logged and retried with backoff; the
service never stops for one. Rows already held keep ticking on their local
schedule; their updates wait in the persister (the newest per row wins, CAS
against the etag the row was loaded with until a write succeeds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from datetime import datetime

from orleanspy._tasks import raise_if_cancelled
from orleanspy.clock import Clock
from orleanspy.errors import (
    ActivationError,
    GrainCallTimeoutError,
    MessageRejectedError,
    ReminderError,
    SiloUnavailableError,
    StorageUnavailableError,
)
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders._adaptive import LoadSignals, bucket_size, default_load
from orleanspy.reminders._lanes import Dispatcher
from orleanspy.reminders._ownership import Ownership
from orleanspy.reminders._persist import Persister, update_key
from orleanspy.reminders._ticker import (
    MISSED_COUNT_CAP,
    Backoff,
    Ticker,
    TickPlan,
    plan_tick,
    sleep_or_wake,
)
from orleanspy.reminders._window import DueWindow, Row, RowState
from orleanspy.reminders.model import (
    MissedReminder,
    MissedReminderAction,
    ReminderChange,
    ReminderEntry,
    ScheduleUpdate,
    TickStatus,
    row_key,
)
from orleanspy.reminders.schedule import schedule_for
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
        self._load = load or default_load
        self._name = name
        self._ownership = Ownership()
        self._window = DueWindow(self._bucket_size())
        self._ticker = Ticker(clock, self._window, self._on_due)
        self._dispatcher = Dispatcher(
            options.permits, self._tick, enable_priority=options.enable_priority
        )
        self._persister = Persister(table, clock, options, self._on_persisted)
        self._running = False
        # Loader requests; one task serves them so that reads never race.
        self._loader_wake = asyncio.Event()
        self._refill_wanted = True
        self._refill_waiters: list[asyncio.Future[None]] = []
        self._new_ranges: list[RingRange] = []
        self._hints: dict[str, tuple[GrainId, str]] = {}
        self._more_available = False
        self._turnover = 0  # ticks finished since the last refill
        # Keys whose stored state changed while a bulk read was running: that read
        # may return their old state, so it must not load them.
        self._reading = False
        self._touched: set[str] = set()
        self._n = dict.fromkeys(
            (
                "delivered",
                "grain_errors",
                "retries",
                "missed",
                "skipped",
                "notified",
                "repaired",
                "cas_conflicts",
                "refills",
                "load_errors",
                "evicted",
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
                ("loader", self._loader()),
                ("feed", self._follow(feed)),
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
        self._hints = {k: v for k, v in self._hints.items() if self._ownership.owns(v[0])}
        if new:
            self._new_ranges.extend(new)
            self._loader_wake.set()
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
        grain_id, name, next_due = change.grain_id, change.name, change.next_due
        if not self._ownership.owns(grain_id):
            return
        key = row_key(grain_id, name)
        if self._reading:
            self._touched.add(key)
        row = self._window.get(key)
        if next_due is None:
            if row is not None:
                self._drop(row)
            self._hints.pop(key, None)
            return
        if row is not None:
            if next_due in (row.next_due, row.entry.next_due) or self._persister.wrote(
                key, next_due
            ):
                return
        elif next_due > self._clock.now() + self._options.look_ahead:
            return
        elif self._window.space == 0:
            last = self._window.last_due()
            if last is None or next_due >= last:
                self._more_available = True
                return
        self._hints[key] = (grain_id, name)
        self._loader_wake.set()

    async def refill_now(self) -> None:
        """Run a full refill and return when one that began after this call finished.

        Before ``start`` the refill runs inline. Errors are retried by the loader
        (this call waits until a refill succeeds)."""
        if not self._running:
            await self._refill(self._ownership.ranges)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._refill_waiters.append(fut)
        self._refill_wanted = True
        self._loader_wake.set()
        await fut

    async def wait_persisted(self) -> None:
        """Return once no schedule update is waiting to be written."""
        await self._persister.wait_idle()

    @property
    def ranges(self) -> tuple[RingRange, ...]:
        return self._ownership.ranges

    @property
    def stats(self) -> ReminderServiceStats:
        w, d, p = self._window, self._dispatcher, self._persister
        return ReminderServiceStats(
            bucket_size=w.capacity,
            loaded=w.queued,
            queued=d.queued,
            in_flight=d.in_flight,
            resident=len(w),
            high_water=w.high_water,
            persist_pending=len(p),
            persisted=p.written,
            persist_failures=p.failures,
            **self._n,
        )

    # -- delivery ---------------------------------------------------------------------

    def _on_due(self, rows: list[Row]) -> None:
        self._dispatcher.put(rows)
        self._maybe_low()

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
        self._turnover += 1
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
        self._maybe_low()

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
        if self._reading:
            self._touched.add(key)
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

    # -- loading ----------------------------------------------------------------------

    def _bucket_size(self) -> int:
        base = self._options.base_bucket_size
        if not self._options.adaptive:
            return base
        try:
            return bucket_size(base, self._load())
        except Exception as exc:
            log.warning("load signals unavailable name=%s error=%r", self._name, exc)
            return base

    def _maybe_low(self) -> None:
        # Under a backlog the heap refills with the next slots of delivered rows,
        # so "below half" alone would leave older rows in the table until the
        # poll; a half-turned-over window also asks for a refill (which evicts
        # the later rows in favour of the older ones).
        half = self._window.capacity // 2
        if self._more_available and (self._window.queued < half or self._turnover >= half):
            self._more_available = False
            self._refill_wanted = True
            self._loader_wake.set()

    async def _loader(self) -> None:
        """Serve refills, range loads, hints, polls and repairs until cancelled."""
        opts = self._options
        backoff = Backoff(opts.retry_initial, opts.retry_max)
        now = self._clock.now()
        next_poll, next_repair = now, now + opts.repair_interval
        while True:
            self._loader_wake.clear()
            now = self._clock.now()
            try:
                if self._refill_wanted or now >= next_poll:
                    await self._full_refill()
                    next_poll = now + opts.poll_interval
                elif self._new_ranges:
                    ranges, self._new_ranges = self._new_ranges, []
                    try:
                        await self._refill(ranges)
                    except BaseException:
                        self._new_ranges[:0] = ranges
                        raise
                if self._hints:
                    await self._read_hints()
                if now >= next_repair:
                    await self._repair()
                    next_repair = now + opts.repair_interval
                backoff.reset()
            except Exception as exc:
                raise_if_cancelled()
                self._n["load_errors"] += 1
                log.warning("reminder load failed name=%s error=%r", self._name, exc)
                await self._clock.sleep(backoff.next())
                continue
            raise_if_cancelled()
            await sleep_or_wake(self._clock, min(next_poll, next_repair), self._loader_wake)

    async def _full_refill(self) -> None:
        waiters, self._refill_waiters = self._refill_waiters, []
        self._refill_wanted = False
        self._new_ranges.clear()
        try:
            await self._refill(self._ownership.ranges)
        except BaseException:
            self._refill_wanted = True
            self._refill_waiters[:0] = waiters
            raise
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _refill(self, ranges: Sequence[RingRange]) -> None:
        """Read ``ranges`` and keep the earliest ``bucket_size`` rows overall."""
        window = self._window
        window.capacity = self._bucket_size()
        self._turnover = 0
        now = self._clock.now()
        before = now + self._options.look_ahead
        # Rows we hold come back from the read too (the table may lag behind us):
        # read past them so they cannot hide the rows we are looking for.
        limit = window.capacity + len(window) + len(self._persister)
        batches = await self._read([self._table.read_due(r, before, limit) for r in ranges])
        # Cheap filters first; schedules are built only for rows that can make the cut.
        found: dict[str, tuple[datetime, int, ReminderEntry, datetime | None]] = {}
        for batch in batches:
            for entry in batch:
                key = entry.key
                if key in window or key in found or key in self._touched:
                    continue
                if not self._ownership.owns(entry.grain_id):
                    continue
                next_due, last_fire = self._effective(entry)
                if next_due <= before:
                    found[key] = (next_due, -int(entry.priority), entry, last_fire)
        best = sorted(found.values(), key=lambda c: (c[0], c[1]))[: window.room]
        fresh = [r for c in best if (r := self._make_row(c[2], c[0], c[3])) is not None]
        loaded, evicted = window.merge(fresh)
        self._more_available = loaded < len(found) or any(len(b) >= limit for b in batches)
        self._n["refills"] += 1
        self._n["evicted"] += len(evicted)
        if loaded or evicted:
            self._ticker.wake()
        log.debug(
            "reminder refill name=%s ranges=%d loaded=%d evicted=%d resident=%d bucket_size=%d",
            self._name,
            len(ranges),
            loaded,
            len(evicted),
            len(window),
            window.capacity,
        )

    async def _read(self, reads: list[Awaitable[list[ReminderEntry]]]) -> list[list[ReminderEntry]]:
        self._reading = True
        self._touched.clear()
        try:
            results = await asyncio.gather(*reads, return_exceptions=True)
        finally:
            self._reading = False
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [r for r in results if not isinstance(r, BaseException)]

    def _effective(self, entry: ReminderEntry) -> tuple[datetime, datetime | None]:
        """``(next_due, last_fire)`` of a row as read, with our unwritten update
        applied (the table lags behind while persistence is pending)."""
        pending = self._persister.latest(entry.key)
        if pending is not None and pending.etag == entry.etag:
            return pending.next_due, pending.last_fire
        return entry.next_due, entry.last_fire

    def _make_row(
        self, entry: ReminderEntry, next_due: datetime, last_fire: datetime | None
    ) -> Row | None:
        try:
            schedule = schedule_for(entry)
        except ReminderError as exc:
            log.warning("reminder row unusable name=%s key=%s error=%s", self._name, entry.key, exc)
            return None
        return Row(entry, schedule, next_due, last_fire)

    async def _read_hints(self) -> None:
        while self._hints:
            key, (grain_id, name) = next(iter(self._hints.items()))
            entry = await self._table.read(grain_id, name)
            # Drop the hint only after the read succeeded; a newer hint for the
            # same key that arrived meanwhile is served by this read too.
            self._hints.pop(key, None)
            if self._ownership.owns(grain_id):
                self._admit(key, entry)

    def _admit(self, key: str, entry: ReminderEntry | None) -> None:
        """Bring the window in line with the row as just read."""
        row = self._window.get(key)
        if entry is None:
            if row is not None:
                self._drop(row)
            return
        if row is not None:
            if entry.etag == row.entry.etag:
                return
            self._drop(row)
        next_due, last_fire = self._effective(entry)
        if next_due > self._clock.now() + self._options.look_ahead:
            return
        new = self._make_row(entry, next_due, last_fire)
        if new is None:
            return
        loaded, evicted = self._window.merge([new])
        self._n["evicted"] += len(evicted)
        if not loaded:
            self._more_available = True
        elif self._window.head_due() == new.next_due:
            self._ticker.wake()

    async def _repair(self) -> None:
        """Apply SKIP/NOTIFY in place to long-overdue rows not held (module docstring)."""
        now = self._clock.now()
        before = now - self._options.look_ahead
        limit = self._window.capacity
        batches = await self._read(
            [self._table.read_due(r, before, limit) for r in self._ownership.ranges]
        )
        for entry in (e for batch in batches for e in batch):
            key = entry.key
            if (
                entry.next_due >= before
                or entry.etag is None
                or key in self._window
                or key in self._touched
                or self._persister.latest(key) is not None
                or not self._ownership.owns(entry.grain_id)
            ):
                continue
            if entry.action is MissedReminderAction.FIRE_IMMEDIATELY:
                self._more_available = True
                continue
            try:
                schedule = schedule_for(entry)
            except ReminderError:
                continue
            resume = schedule.next_after(now)
            missed = schedule.slots_between(entry.next_due, now, cap=MISSED_COUNT_CAP) + 1
            self._n["missed"] += 1
            self._n["skipped"] += 1
            self._n["repaired"] += 1
            self._persister.submit(
                ScheduleUpdate(entry.grain_id, entry.name, entry.etag, resume, entry.last_fire)
            )
            if entry.action is MissedReminderAction.NOTIFY:
                await self._notify(entry, entry.next_due, now, missed, resume)

    async def _follow(self, feed: AsyncIterator[ReminderChange]) -> None:
        """Feed table changes to ``notify_change``; resubscribe after an error."""
        backoff = Backoff(self._options.retry_initial, self._options.retry_max)
        try:
            while True:
                try:
                    async for change in feed:
                        self.notify_change(change)
                        backoff.reset()
                    return  # the feed ended: the table was closed
                except Exception as exc:
                    log.warning("reminder change feed lost name=%s error=%r", self._name, exc)
                    await _aclose(feed)
                    await self._clock.sleep(backoff.next())
                    feed = self._table.changes()
                    # Changes may have been missed while the feed was down.
                    self._refill_wanted = True
                    self._loader_wake.set()
        finally:
            await _aclose(feed)

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


async def _aclose(feed: object) -> None:
    aclose = getattr(feed, "aclose", None)
    if aclose is not None:
        await aclose()
