"""Delivery: what happens to a row once it is due.

A tick is one grain call, ``receive_reminder``. Failures of the call path are
retried until the grain acknowledges; only then is the row's next slot handed
to the persister. A silo lost between the two leaves the old slot in the table
and the next owner delivers the tick again: at least once. A row reached later
than the grace gets its ``MissedReminderAction`` instead (``plan_tick``), and
its grid resumes after now, so a long outage costs at most one catch-up tick
per row.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime

from orleanspy.clock import Clock
from orleanspy.errors import (
    ActivationError,
    GrainCallTimeoutError,
    MessageRejectedError,
    SiloUnavailableError,
    StorageUnavailableError,
)
from orleanspy.metrics import ReminderMetrics
from orleanspy.options import ReminderOptions
from orleanspy.reminders._history import NoHistory, skip_outcome
from orleanspy.reminders._lanes import Dispatcher
from orleanspy.reminders._loader import Loader
from orleanspy.reminders._persist import Persister, update_key
from orleanspy.reminders._ticker import Backoff, Ticker, TickPlan, plan_tick
from orleanspy.reminders._window import DueWindow, Row, RowState
from orleanspy.reminders.model import (
    FireOutcome,
    MissedReminder,
    MissedReminderAction,
    ReminderEntry,
    ScheduleUpdate,
    TickStatus,
)

__all__ = ["TRANSIENT_ERRORS", "Deliver", "Delivery", "PublishMissed"]

log = logging.getLogger(__name__)

#: Failures of the call path, not of the grain: the same tick is retried.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    SiloUnavailableError,
    GrainCallTimeoutError,
    MessageRejectedError,
    ActivationError,
    StorageUnavailableError,
)

#: ``deliver(entry, status)`` makes the grain call and returns on acknowledgement.
Deliver = Callable[[ReminderEntry, TickStatus], Awaitable[None]]
PublishMissed = Callable[[MissedReminder], Awaitable[None]]


class Delivery:
    """Ticks due rows: delivers (or skips) each one and moves it to its next slot.

    Given: the window, the grain call ``deliver(entry, status)``,
    ``publish_missed`` for NOTIFY rows (``None``: nothing is published) and,
    through ``attach``, the parts it drives. They call it back: the ticker
    ``on_due(rows)``, the dispatcher ``tick(row)`` (one permit each), the
    persister ``on_persisted(update, etag)``, the loader ``drop(row)`` and
    ``notify(...)``. In turn it queues due rows on the dispatcher, submits each
    next slot to the persister, puts the row back in the window (waking the
    ticker) or releases it, and tells the loader ``ticked``, ``check_low`` and
    ``mark_changed``.

    Guarantees:

    - at least once: a tick failing with one of ``TRANSIENT_ERRORS`` is retried
      with backoff until acknowledged, unless the row is dropped meanwhile (its
      next owner delivers it). Any other exception is the grain's own failure:
      logged, counted in ``grain_errors``, not retried; the schedule moves on;
    - the next slot is submitted for persistence only after ``deliver`` has
      returned (or raised a grain error), never before;
    - past the grace the row's ``MissedReminderAction`` applies:
      FIRE_IMMEDIATELY delivers one catch-up tick, SKIP and NOTIFY deliver none,
      and the grid resumes at the first slot after now;
    - each NOTIFY skip publishes one ``MissedReminder`` (``missed_ticks`` counts
      the slots); a failed publish is logged, not retried, and not counted;
    - a dropped row is not ticked or re-queued again (a delivery already running
      finishes).

    The counters only grow; the service reports them.
    """

    _ticker: Ticker
    _dispatcher: Dispatcher
    _persister: Persister
    _loader: Loader
    metrics: ReminderMetrics = ReminderMetrics()  # set by the service
    history: NoHistory = NoHistory()  # set by the service

    def __init__(
        self,
        clock: Clock,
        options: ReminderOptions,
        window: DueWindow,
        *,
        deliver: Deliver,
        publish_missed: PublishMissed | None,
        name: str = "",
    ) -> None:
        self._clock = clock
        self._options = options
        self._window = window
        self._deliver = deliver
        self._publish_missed = publish_missed
        self._name = name
        self.delivered = 0
        self.grain_errors = 0
        self.retries = 0
        self.missed = 0
        self.skipped = 0
        self.notified = 0
        self.cas_conflicts = 0

    def attach(
        self, *, ticker: Ticker, dispatcher: Dispatcher, persister: Persister, loader: Loader
    ) -> None:
        """Hand over the parts this one drives. They take its methods as their
        callbacks, so they are built after it; call this before any of them runs."""
        self._ticker = ticker
        self._dispatcher = dispatcher
        self._persister = persister
        self._loader = loader

    # -- called by the other parts ----------------------------------------------------

    def on_due(self, rows: list[Row]) -> None:
        """Rows left the heap for the lanes."""
        self._dispatcher.put(rows)
        self._loader.check_low()

    async def tick(self, row: Row) -> None:
        """Deliver (or skip) one due row, then move it to its next slot."""
        if row.dropped:
            return
        now = self._clock.now()
        plan = plan_tick(row, now, self._options.grace)
        last_fire = row.last_fire
        if plan.missed:
            self.missed += 1
            self.metrics.missed(row.entry.action.name)
        if plan.deliver:
            delivered_at = await self._call(row, plan)
            if delivered_at is None:
                return
            last_fire = delivered_at
            next_due = plan.resume or row.schedule.next_after(plan.slot)
        else:
            assert plan.resume is not None
            next_due = plan.resume
            self.skipped += 1
            if row.entry.action is MissedReminderAction.NOTIFY:
                await self.notify(row.entry, plan.slot, now, plan.missed_ticks, next_due)
            self.history.fired(row.entry, plan.slot, now, skip_outcome(row.entry))
        self._advance(row, next_due, last_fire)

    async def notify(
        self,
        entry: ReminderEntry,
        scheduled: datetime,
        now: datetime,
        missed_ticks: int,
        next_due: datetime,
    ) -> None:
        """Publish a ``MissedReminder`` for a skipped NOTIFY row."""
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
        self.notified += 1

    def drop(self, row: Row) -> None:
        """Forget ``row``: it must not tick or be re-queued any more."""
        row.dropped = True
        if row.state is RowState.DUE:
            self._dispatcher.lanes.remove(row)
        self._window.release(row)

    def on_persisted(self, update: ScheduleUpdate, etag: str | None) -> None:
        """The outcome of a schedule write: the held row adopts the new etag, or
        is dropped if another writer moved it (a lost CAS)."""
        key = update_key(update)
        self._loader.mark_changed(key)
        row = self._window.get(key)
        # A held row with another etag was loaded after this update was made:
        # the outcome is not about it.
        mine = row is not None and row.entry.etag == update.etag
        if etag is None:
            self.cas_conflicts += 1
            log.info("reminder moved by another writer name=%s key=%s", self._name, key)
            if row is not None and mine:
                self.drop(row)
        elif row is not None and mine:
            row.entry = replace(
                row.entry, etag=etag, next_due=update.next_due, last_fire=update.last_fire
            )

    # -- one tick ---------------------------------------------------------------------

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
                self.retries += 1
                log.info("reminder tick retry name=%s key=%s error=%r", self._name, row.key, exc)
                await self._clock.sleep(backoff.next())
                if row.dropped:
                    return None
                continue
            except Exception as exc:
                # The grain's own receive_reminder failed: not retried (DESIGN.md 2).
                self.grain_errors += 1
                self.metrics.tick(entry.priority, (delivered_at - plan.slot).total_seconds(), True)
                self.history.fired(entry, plan.slot, delivered_at, FireOutcome.GRAIN_ERROR)
                log.warning(
                    "reminder tick failed in grain name=%s key=%s slot=%s error=%r",
                    self._name,
                    row.key,
                    plan.slot.isoformat(),
                    exc,
                )
                return delivered_at
            self.delivered += 1
            self.metrics.tick(entry.priority, (delivered_at - plan.slot).total_seconds(), False)
            self.history.fired(entry, plan.slot, delivered_at, FireOutcome.OK)
            return delivered_at

    def _advance(self, row: Row, next_due: datetime, last_fire: datetime | None) -> None:
        """Record the row's next slot: persist it, and re-queue or release the row."""
        row.next_due, row.last_fire = next_due, last_fire
        self._loader.ticked()
        etag = row.entry.etag
        # Submitted for a dropped row too: its tick happened. The CAS against the
        # loaded etag keeps the write from landing on a row another writer moved.
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
