"""Delivery: what happens to a row once it is due.

A tick is one grain call, ``receive_reminder``. Failures of the call path are
retried until the grain acknowledges; only then is the row's next slot handed
to the persister. A silo lost between the two leaves the old slot in the table
and the next owner delivers the tick again: at least once. A row reached later
than the grace gets its ``MissedReminderAction`` instead (``missed``), and
its grid resumes after now, so a long outage costs at most one catch-up tick
per row.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from orleanspy._retry import Backoff
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
from orleanspy.reminders._service.herd import CatchUpThrottle
from orleanspy.reminders._service.history import NoHistory, skip_outcome
from orleanspy.reminders._service.missed import MissedNotifier, PublishMissed, TickPlan, plan_tick
from orleanspy.reminders._service.persist import Persister
from orleanspy.reminders._service.window import DueWindow, Row
from orleanspy.reminders.model import (
    FireOutcome,
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


class Delivery:
    """Ticks due rows: delivers (or skips) each one and moves it to its next slot.

    Given at construction, all downstream of it: the window (where the row
    goes back or leaves), the persister (where the next slot is written), the
    notifier (NOTIFY skips) and the grain call ``deliver(entry, status)``. The
    lane drainer calls ``tick(row)`` with one permit per row; nothing else calls
    it. ``metrics`` and ``history`` record each tick (default: nothing).

    Guarantees:

    - at least once: a tick failing with one of ``TRANSIENT_ERRORS`` is retried
      with backoff until acknowledged, unless the row is dropped meanwhile (its
      next owner delivers it). Any other exception is the grain's own failure:
      logged, counted in ``grain_errors``, not retried; the schedule moves on;
    - the next slot is submitted for persistence only after ``deliver`` has
      returned (or raised a grain error), never before;
    - the missed-tick rule (``missed``) applies: FIRE_IMMEDIATELY delivers
      one catch-up tick, SKIP and NOTIFY deliver none, and the grid resumes at
      the first slot after now;
    - catch-up grain calls (slots older than ``catch_up_lateness``) wait
      their turn on the ramp of ``herd`` first, in the order they came;
    - a dropped row is not ticked or re-queued again (a delivery already running
      finishes).

    The counters only grow; the service reports them.
    """

    def __init__(
        self,
        clock: Clock,
        options: ReminderOptions,
        window: DueWindow,
        persister: Persister,
        notifier: MissedNotifier,
        *,
        deliver: Deliver,
        name: str = "",
        metrics: ReminderMetrics | None = None,
        history: NoHistory | None = None,
    ) -> None:
        self._clock = clock
        self._options = options
        self._window = window
        self._persister = persister
        self._notifier = notifier
        self._deliver = deliver
        self._name = name
        self.metrics = metrics or ReminderMetrics()
        self.history = history or NoHistory()
        self.delivered = 0
        self.grain_errors = 0
        self.retries = 0
        self.missed = 0
        self.skipped = 0
        self._herd = CatchUpThrottle(
            clock,
            rate=options.catch_up_rate,
            ceiling=options.catch_up_ceiling,
            lateness=options.catch_up_lateness,
        )

    async def tick(self, row: Row) -> None:
        """Deliver (or skip) one due row, then move it to its next slot."""
        if row.dropped:
            return
        now = self._clock.now()
        plan = plan_tick(
            row.schedule,
            row.entry.action,
            row.next_due,
            now,
            self._options.grace,
            reloaded=row.reloaded,
        )
        row.reloaded = False
        last_fire = row.last_fire
        if plan.missed:
            self.missed += 1
            self.metrics.missed(row.entry.action.name)
        if plan.deliver:
            if self._herd.enabled:
                # A catch-up call waits for its turn on the ramp (``_herd``).
                await self._herd.admit(now - plan.slot)
                if row.dropped:
                    return
                now = self._clock.now()
            delivered_at = await self._call(row, plan, now)
            if delivered_at is None:
                return
            last_fire = now = delivered_at
            next_due = plan.resume or row.schedule.next_after(plan.slot)
        else:
            assert plan.resume is not None
            next_due = plan.resume
            self.skipped += 1
            if row.entry.action is MissedReminderAction.NOTIFY:
                await self._notifier.notify(row.entry, plan.slot, now, plan.missed_ticks, next_due)
            self.history.fired(row.entry, plan.slot, now, skip_outcome(row.entry))
        self._advance(row, next_due, last_fire, now)

    # -- one tick ---------------------------------------------------------------------

    async def _call(self, row: Row, plan: TickPlan, now: datetime) -> datetime | None:
        """Deliver the tick until acknowledged; the delivery time, or ``None`` if the
        row was dropped while retrying (the new owner delivers it). ``now``: the
        clock as the tick was planned, the first attempt's delivery time."""
        entry = row.entry
        backoff: Backoff | None = None  # made on the first retry: most ticks need none
        delivered_at = now
        while True:
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
                if backoff is None:
                    backoff = Backoff(self._options.retry_initial, self._options.retry_max)
                await self._clock.sleep(backoff.next())
                if row.dropped:
                    return None
                delivered_at = self._clock.now()
                continue
            except Exception as exc:
                # The grain's own receive_reminder failed: not retried
                # (docs/architecture.md, section 2, step 6).
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

    def _advance(
        self, row: Row, next_due: datetime, last_fire: datetime | None, now: datetime
    ) -> None:
        """Record the row's next slot: persist it, and re-queue or release the row
        (``now``: the clock when the tick was delivered or skipped)."""
        row.last_fire = last_fire
        etag = row.etag
        # Submitted for a dropped row too: its tick happened. The CAS against the
        # loaded etag keeps the write from landing on a row another writer moved.
        if etag is not None:
            self._persister.submit(
                ScheduleUpdate(row.entry.grain_id, row.entry.name, etag, next_due, last_fire),
                row.key,
            )
        keep = next_due <= now + self._options.look_ahead
        self._window.ticked(row, next_due, keep=keep)
