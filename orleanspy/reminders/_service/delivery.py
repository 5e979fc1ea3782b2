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
from dataclasses import dataclass
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
from orleanspy.reminders._service.history import NoHistory, skip_outcome
from orleanspy.reminders._service.missed import MissedNotifier, PublishMissed, TickPlan, plan_tick
from orleanspy.reminders._service.persist import Persister
from orleanspy.reminders._service.window import DueWindow, Row
from orleanspy.reminders.model import (
    ENDED,
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
      logged, counted in ``grain_errors``; the schedule moves on, unless the
      row's ``RetryPolicy`` has attempts left that can start before the next
      slot: then the row waits in the window for its retry (no permit held)
      and its slot is persisted only after the last attempt;
    - a row with no slot left after its tick (a one-shot, a bounded reminder's
      last slot) is removed: a removal goes to the persister in place of the
      schedule CAS, after the delivery, as a CAS would;
    - the next slot is submitted for persistence only after ``deliver`` has
      returned (or raised a grain error), never before;
    - the missed-tick rule (``missed``) applies: FIRE_IMMEDIATELY delivers
      one catch-up tick, SKIP and NOTIFY deliver none, and the grid resumes at
      the first slot after now;
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
        #: Retries queued under a RetryPolicy, and retries given up at the next slot.
        self.grain_retries = 0
        self.retries_given_up = 0
        #: Rows removed because their schedule ended.
        self.ended = 0

    async def tick(self, row: Row) -> None:
        """Deliver (or skip) one due row, then move it to its next slot."""
        if row.dropped:
            return
        now = self._clock.now()
        retry = row.retry
        row.retry = None
        if isinstance(retry, _Retry) and retry.at == row.next_due:
            await self._retry(row, retry, now)
            return
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
        next_due = plan.resume if plan.missed else row.schedule.next_after(plan.slot)
        if plan.deliver:
            outcome = await self._call(row, plan, now, 1, next_due is None)
            if outcome is None:
                return
            delivered_at, ok = outcome
            if not ok and self._retry_later(row, plan, next_due, delivered_at, 1):
                return
            last_fire = now = delivered_at
        else:
            self.skipped += 1
            if row.entry.action is MissedReminderAction.NOTIFY or next_due is None:
                # A last slot skipped under SKIP is told as well: the reminder
                # ends without a delivery, which nobody would see otherwise.
                await self._notifier.notify(row.entry, plan.slot, now, plan.missed_ticks, next_due)
            self.history.fired(
                row.entry, plan.slot, now, skip_outcome(row.entry), final=next_due is None
            )
        self._advance(row, next_due, last_fire, now)

    # -- one tick ---------------------------------------------------------------------

    async def _call(
        self, row: Row, plan: TickPlan, now: datetime, attempt: int, final: bool
    ) -> tuple[datetime, bool] | None:
        """Deliver the tick until acknowledged: the delivery time and whether the
        grain returned (``False``: it raised), or ``None`` if the row was dropped
        while retrying a transport failure (the new owner delivers it). ``now``:
        the clock as the tick was planned, the first attempt's delivery time."""
        entry = row.entry
        backoff: Backoff | None = None  # made on the first retry: most ticks need none
        delivered_at = now
        nominal = row.schedule.nominal(plan.slot)
        while True:
            status = TickStatus(
                first_tick_time=entry.start_at,
                period=entry.period,
                cron=entry.cron,
                current_tick_time=nominal,
                delivered_at=delivered_at,
                missed_ticks=plan.missed_ticks,
                priority=int(entry.priority),
                due_at=plan.slot,
                payload=entry.payload,
                attempt=attempt,
                final=final,
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
                # The grain's own receive_reminder failed: retried only under the
                # row's RetryPolicy (docs/architecture.md, section 2, step 6).
                self.grain_errors += 1
                self.metrics.tick(entry.priority, (delivered_at - plan.slot).total_seconds(), True)
                retrying = _will_retry(entry, attempt)
                self.history.fired(
                    entry,
                    plan.slot,
                    delivered_at,
                    FireOutcome.RETRYING if retrying else FireOutcome.GRAIN_ERROR,
                    attempt=attempt,
                    final=final and not retrying,
                )
                log.warning(
                    "reminder tick failed in grain name=%s key=%s slot=%s attempt=%d error=%r",
                    self._name,
                    row.key,
                    plan.slot.isoformat(),
                    attempt,
                    exc,
                )
                return delivered_at, False
            self.delivered += 1
            self.metrics.tick(entry.priority, (delivered_at - plan.slot).total_seconds(), False)
            self.history.fired(
                entry, plan.slot, delivered_at, FireOutcome.OK, attempt=attempt, final=final
            )
            return delivered_at, True

    # -- retries (RetryPolicy) ----------------------------------------------------------

    def _retry_later(
        self,
        row: Row,
        plan: TickPlan,
        next_due: datetime | None,
        failed_at: datetime,
        attempt: int,
    ) -> bool:
        """Queue the next attempt of a slot whose grain raised, if the row's policy
        has one left and it starts before the next slot; ``True`` if queued. The
        row waits in the window like any due row, so no permit is held meanwhile;
        the table keeps the slot, so a crash meanwhile delivers it again."""
        policy = row.entry.retry
        if policy is None or attempt >= policy.max_attempts or row.dropped:
            return False
        at = failed_at + policy.backoff
        if next_due is not None and at >= next_due:
            self.retries_given_up += 1
            return False
        row.retry = _Retry(plan, attempt + 1, at, next_due)
        row.next_due = at
        self.grain_retries += 1
        self._window.push(row)
        return True

    async def _retry(self, row: Row, retry: _Retry, now: datetime) -> None:
        """Deliver a queued retry; once it could not start before the next slot,
        give it up and move on to that slot."""
        next_due = retry.next_due
        last_fire = row.last_fire
        if next_due is not None and now >= next_due:
            self.retries_given_up += 1
        else:
            outcome = await self._call(row, retry.plan, now, retry.attempt, next_due is None)
            if outcome is None:
                return
            delivered_at, ok = outcome
            if not ok and self._retry_later(row, retry.plan, next_due, delivered_at, retry.attempt):
                return
            last_fire = now = delivered_at
        self._advance(row, next_due, last_fire, now)

    def _advance(
        self, row: Row, next_due: datetime | None, last_fire: datetime | None, now: datetime
    ) -> None:
        """Record the row's next slot: persist it, and re-queue or release the row
        (``now``: the clock when the tick was delivered or skipped). With no next
        slot (``None``) the schedule has ended: the row is removed."""
        row.last_fire = last_fire
        etag = row.etag
        key = row.key
        grain_id, name = row.entry.grain_id, row.entry.name
        if next_due is None:
            self.ended += 1
            if etag is not None:
                self._persister.submit(
                    ScheduleUpdate(grain_id, name, etag, ENDED, last_fire, remove=True), key
                )
            self._window.drop(row)
            return
        # Submitted for a dropped row too: its tick happened. The CAS against the
        # loaded etag keeps the write from landing on a row another writer moved.
        if etag is not None:
            self._persister.submit(ScheduleUpdate(grain_id, name, etag, next_due, last_fire), key)
        keep = next_due <= now + self._options.look_ahead
        self._window.ticked(row, next_due, keep=keep)


def _will_retry(entry: ReminderEntry, attempt: int) -> bool:
    """Whether the policy allows another attempt (time may still rule it out)."""
    return entry.retry is not None and attempt < entry.retry.max_attempts


@dataclass(frozen=True, slots=True)
class _Retry:
    """A queued retry: the slot's plan, which attempt comes next, when, and the
    slot after (the retry's deadline; ``None`` for a reminder's last slot)."""

    plan: TickPlan
    attempt: int
    at: datetime
    next_due: datetime | None
