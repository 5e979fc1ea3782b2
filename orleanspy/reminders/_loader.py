"""Loading: which rows of the table the window holds.

One task serves every request (refills, newly owned ranges, hints, the poll,
the repair pass), so that reads of the table never race each other.

A *refill* reads every owned range with ``read_due(range, now + look_ahead,
limit)`` and keeps the earliest ``bucket_size`` rows overall (queued rows that
lose are evicted; rows being delivered are never evicted). It runs at start,
every ``poll_interval``, on request, when the heap falls below half (or half of
it turned over) while the last refill left rows behind, and after the change
feed was lost. A newly owned range is read at once. A change for an owned row
that is not held (or that another writer moved) is read with ``table.read`` and
admitted if it is inside the window and would make the cut; a removal drops
the row.

Repair. Normal loading already takes overdue rows first (``read_due`` returns
the earliest first), so an overdue row is only starved while the window is
full of rows being delivered. Every ``repair_interval`` the repair pass reads
owned rows with ``next_due < now - look_ahead`` that are not held (at most
``bucket_size`` per range) and applies SKIP or NOTIFY to them in place — the
next slot after now is persisted (and NOTIFY published) without taking room in
the window or a delivery permit. FIRE_IMMEDIATELY rows need a delivery, so the
pass leaves them to the window, which loads them first once there is room.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from orleanspy._tasks import raise_if_cancelled
from orleanspy.clock import Clock
from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId
from orleanspy.metrics import ReminderMetrics
from orleanspy.options import ReminderOptions
from orleanspy.reminders._adaptive import LoadSignals, window_size
from orleanspy.reminders._history import NoHistory, skip_outcome
from orleanspy.reminders._ownership import Ownership
from orleanspy.reminders._persist import Persister
from orleanspy.reminders._ticker import MISSED_COUNT_CAP, Backoff, sleep_or_wake
from orleanspy.reminders._window import DueWindow, Row
from orleanspy.reminders.model import (
    MissedReminderAction,
    ReminderChange,
    ReminderEntry,
    ScheduleUpdate,
    row_key,
)
from orleanspy.reminders.schedule import schedule_for
from orleanspy.reminders.table import ChangeFeed, ReminderTable
from orleanspy.ring import RingRange

__all__ = ["Loader", "Notify"]

log = logging.getLogger(__name__)

#: ``notify(entry, scheduled, detected_at, missed_ticks, next_due)`` publishes a missed row.
Notify = Callable[[ReminderEntry, datetime, datetime, int, datetime], Awaitable[None]]


class Loader:
    """Keeps ``window`` filled with the owned rows that fall due soon; see the
    module docstring for when it reads what.

    ``run()`` and ``follow(feed)`` are tasks that run until cancelled; table
    errors are logged, counted in ``load_errors`` and retried with backoff,
    never raised. The owner tells the loader what happened elsewhere:
    ``ranges_changed`` after a ring change, ``notify_change`` for a table
    change, ``mark_changed`` when its own write landed, ``ticked`` after every
    finished tick and ``check_low`` after rows left the heap. The loader calls
    back ``drop(row)`` to forget a held row (removed, or moved by another
    writer), ``notify`` for a NOTIFY row skipped by the repair pass, and
    ``wake_ticker()`` when the heap may have a new head.
    """

    metrics: ReminderMetrics = ReminderMetrics()  # set by the service
    history: NoHistory = NoHistory()  # set by the service

    def __init__(
        self,
        table: ReminderTable,
        clock: Clock,
        options: ReminderOptions,
        *,
        ownership: Ownership,
        window: DueWindow,
        persister: Persister,
        load: Callable[[], LoadSignals],
        drop: Callable[[Row], None],
        notify: Notify,
        wake_ticker: Callable[[], None],
        name: str = "",
    ) -> None:
        self._table = table
        self._clock = clock
        self._options = options
        self._ownership = ownership
        self._window = window
        self._persister = persister
        self._load = load
        self._drop = drop
        self._notify = notify
        self._wake_ticker = wake_ticker
        self._name = name
        self._wake = asyncio.Event()
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
        self.refills = 0
        self.load_errors = 0
        self.evicted = 0
        self.repaired = 0

    # -- what the owner reports -------------------------------------------------------

    def ranges_changed(self, new: Sequence[RingRange]) -> None:
        """The owned ranges changed; ``new`` (from ``Ownership.update``) is read now."""
        self._hints = {k: v for k, v in self._hints.items() if self._ownership.owns(v[0])}
        if new:
            self._new_ranges.extend(new)
            self._wake.set()

    def notify_change(self, change: ReminderChange) -> None:
        """Take a change of the table into account (from the feed or a local hint).

        A removal drops the row. A change of a row not held, due inside the
        window, or of a held row that another writer moved, schedules a read of
        the row; the echo of our own write is ignored.
        """
        grain_id, name, next_due = change.grain_id, change.name, change.next_due
        if not self._ownership.owns(grain_id):
            return
        key = row_key(grain_id, name)
        self.mark_changed(key)
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
        self._wake.set()

    def mark_changed(self, key: str) -> None:
        """The stored state of row ``key`` changed (a write of ours or another's landed)."""
        if self._reading:
            self._touched.add(key)

    def ticked(self) -> None:
        """A held row finished a tick."""
        self._turnover += 1

    def check_low(self) -> None:
        """Ask for a refill if the heap ran low while the table has more rows."""
        # Under a backlog the heap refills with the next slots of delivered rows,
        # so "below half" alone would leave older rows in the table until the
        # poll; a half-turned-over window also asks for a refill (which evicts
        # the later rows in favour of the older ones).
        half = self._window.capacity // 2
        if self._more_available and (self._window.queued < half or self._turnover >= half):
            self._more_available = False
            self._refill_wanted = True
            self._wake.set()

    async def request_refill(self) -> None:
        """Return when a full refill that began after this call finished (``run`` must
        be running; it retries errors, so this waits until a refill succeeds)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._refill_waiters.append(fut)
        self._refill_wanted = True
        self._wake.set()
        await fut

    # -- the tasks --------------------------------------------------------------------

    async def run(self) -> None:
        """Serve refills, range loads, hints, polls and repairs until cancelled."""
        opts = self._options
        backoff = Backoff(opts.retry_initial, opts.retry_max)
        now = self._clock.now()
        next_poll, next_repair = now, now + opts.repair_interval
        while True:
            self._wake.clear()
            now = self._clock.now()
            try:
                if self._refill_wanted or now >= next_poll:
                    await self._full_refill()
                    next_poll = now + opts.poll_interval
                elif self._new_ranges:
                    ranges, self._new_ranges = self._new_ranges, []
                    try:
                        await self.refill(ranges)
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
                self.load_errors += 1
                log.warning("reminder load failed name=%s error=%r", self._name, exc)
                await self._clock.sleep(backoff.next())
                continue
            raise_if_cancelled()
            await sleep_or_wake(self._clock, min(next_poll, next_repair), self._wake)

    async def follow(self, feed: ChangeFeed) -> None:
        """Feed table changes to ``notify_change``; resubscribe after an error."""
        backoff = Backoff(self._options.retry_initial, self._options.retry_max)
        try:
            while True:
                try:
                    async for change in feed:
                        self.metrics.feed_event()
                        self.notify_change(change)
                        backoff.reset()
                    return  # the feed ended: the table was closed
                except Exception as exc:
                    log.warning("reminder change feed lost name=%s error=%r", self._name, exc)
                    self.metrics.feed_reconnect()
                    await feed.aclose()
                    await self._clock.sleep(backoff.next())
                    feed = self._table.changes()
                    # Changes may have been missed while the feed was down.
                    self._refill_wanted = True
                    self._wake.set()
        finally:
            await feed.aclose()

    # -- reading ----------------------------------------------------------------------

    async def refill(self, ranges: Sequence[RingRange]) -> None:
        """Read ``ranges`` and keep the earliest ``bucket_size`` rows overall.

        Others call it only while ``run`` is not running (reads must not race).
        """
        window = self._window
        window.capacity = window_size(self._options, self._load, self._name)
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
        self.refills += 1
        self.metrics.refilled(loaded)
        self.evicted += len(evicted)
        if loaded or evicted:
            self._wake_ticker()
        log.debug(
            "reminder refill name=%s ranges=%d loaded=%d evicted=%d resident=%d bucket_size=%d",
            self._name,
            len(ranges),
            loaded,
            len(evicted),
            len(window),
            window.capacity,
        )

    async def _full_refill(self) -> None:
        waiters, self._refill_waiters = self._refill_waiters, []
        self._refill_wanted = False
        self._new_ranges.clear()
        try:
            await self.refill(self._ownership.ranges)
        except BaseException:
            self._refill_wanted = True
            self._refill_waiters[:0] = waiters
            raise
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _read(self, reads: list[Awaitable[list[ReminderEntry]]]) -> list[list[ReminderEntry]]:
        self._reading = True
        self._touched.clear()
        self.metrics.table_reads(len(reads))
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
            self.metrics.table_reads(1)
            entry = await self._table.read(grain_id, name)
            # Drop the hint only after the read succeeded; a newer hint for the
            # same key that arrived meanwhile is served by this read too.
            self._hints.pop(key, None)
            if self._ownership.owns(grain_id):
                self._admit(key, entry)

    def _admit(self, key: str, entry: ReminderEntry | None) -> None:
        """Bring the window in line with the row as just read."""
        row = self._window.get(key)
        if entry is None or entry.paused:  # a paused row is not delivered: not held
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
        self.evicted += len(evicted)
        if not loaded:
            self._more_available = True
        elif self._window.head_due() == new.next_due:
            self._wake_ticker()

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
            self.repaired += 1
            self._persister.submit(
                ScheduleUpdate(entry.grain_id, entry.name, entry.etag, resume, entry.last_fire)
            )
            if entry.action is MissedReminderAction.NOTIFY:
                await self._notify(entry, entry.next_due, now, missed, resume)
            self.history.fired(entry, entry.next_due, now, skip_outcome(entry))
