"""Delivery: what happens to a row once it is due.

A tick is one grain call, ``receive_reminder``, with a deadline of its own
(``tick_deadline``). Failures of the call path give the delivery permit back
and the row waits in the window for its retry; only after the grain
acknowledged is the row's next slot handed to the persister. A silo lost
between the two leaves the old slot in the table and the next owner delivers
the tick again: at least once. A row reached later than its grace, or with a
further slot passed, gets its ``MissedReminderAction`` instead (``missed``),
and its grid resumes after now, so a long outage costs at most one catch-up
tick per row.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from orleanspy._frozen import maker
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
    ENDED,
    FireOutcome,
    MissedReminderAction,
    ReminderEntry,
    ScheduleUpdate,
    TickStatus,
    error_text,
)
from orleanspy.reminders.schedule import Schedule

__all__ = ["TRANSIENT_ERRORS", "Deliver", "Delivery", "PublishMissed", "tick_deadline"]

log = logging.getLogger(__name__)

#: Failures of the call path, not of the grain: the same tick is retried.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    SiloUnavailableError,
    GrainCallTimeoutError,
    MessageRejectedError,
    ActivationError,
    StorageUnavailableError,
)

#: ``deliver(entry, status, deadline)`` makes the grain call and returns on
#: acknowledgement. ``deadline`` (seconds, ``tick_deadline``) bounds how long it
#: may wait on another process: past it, it raises ``GrainCallTimeoutError``
#: (a tick running in this process may take longer; it is the grain's own work).
Deliver = Callable[[ReminderEntry, TickStatus, float], Awaitable[None]]

#: A failing tick's traceback is logged at most once per this many seconds per
#: reminder; the failures in between are counted in the next such line.
TRACEBACK_EVERY_S = 60.0
# Reminders whose last traceback time is remembered, at most (then the oldest go).
_TRACEBACKS_KEPT = 10_000


# The frozen dataclasses a tick builds, without their frozen __init__ (orleanspy._frozen).
_tick_status = maker(TickStatus)
_schedule_update = maker(ScheduleUpdate)


def tick_deadline(schedule: Schedule, slot: datetime, options: ReminderOptions) -> float:
    """How long, in seconds, a tick's call may wait for its grain: the row's
    period (the gap to its next slot, for cron), within
    ``minimum_tick_timeout .. tick_timeout`` (``tick_timeout`` for a last slot).
    Shorter than the response timeout, so a tick stuck on an unreachable peer
    gives its permit back in time for the row's next slot."""
    high = options.tick_timeout.total_seconds()
    following = schedule.next_after(slot)
    if following is None:  # the reminder's last slot: no next slot to make room for
        return high
    gap = (following - slot).total_seconds()
    low = options.minimum_tick_timeout.total_seconds()
    return min(high, max(low, gap))


class Delivery:
    """Ticks due rows: delivers (or skips) each one and moves it to its next slot.

    Given at construction, all downstream of it: the window (where the row
    goes back or leaves), the persister (where the next slot is written), the
    notifier (NOTIFY skips) and the grain call ``deliver(entry, status)``. The
    lane drainer calls ``tick(row)`` with one permit per row; nothing else calls
    it. ``metrics`` and ``history`` record each tick (default: nothing).

    Guarantees:

    - at least once: a tick failing with one of ``TRANSIENT_ERRORS`` (also a
      call that outlived its ``tick_deadline``) gives its permit back and waits
      in the window for a retry with backoff; it is then planned again, so it
      is retried, or handed to its missed-tick action once late past its grace,
      unless the row is dropped meanwhile (its next owner delivers it). Any
      other exception is the grain's own failure: logged (with its traceback,
      rate-limited per reminder), recorded in the history with its type and
      message, counted in ``grain_errors``; the schedule moves on, unless the
      row's ``RetryPolicy`` has attempts left that can start before the next
      slot: then the row waits in the window for its retry (no permit held)
      and its slot is persisted only after the last attempt;
    - a row with no slot left after its tick (a one-shot, a bounded reminder's
      last slot) is removed: a removal goes to the persister in place of the
      schedule CAS, after the delivery, as a CAS would;
    - the next slot is submitted for persistence only after ``deliver`` has
      returned (or raised a grain error), never before;
    - the missed-tick rule (``missed``) applies, with the row's own grace or the
      default: several passed slots, or one past the grace, are missed;
      FIRE_IMMEDIATELY delivers one catch-up tick (the latest slot), SKIP and
      NOTIFY deliver none; the grid resumes at the first slot after now;
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
        #: Retries queued under a RetryPolicy, and retries given up at the next slot.
        self.grain_retries = 0
        self.retries_given_up = 0
        #: Rows removed because their schedule ended.
        self.ended = 0
        # Row key -> (loop time of its last logged traceback, failures since).
        self._tracebacks: dict[str, tuple[float, int]] = {}

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
        entry = row.entry
        grace = self._options.grace if entry.grace is None else entry.grace
        plan = plan_tick(row.schedule, entry.action, row.next_due, now, grace)
        last_fire = row.last_fire
        # None: the schedule has no slot after this one (the row ends with it).
        next_due = plan.resume if plan.missed else row.schedule.next_after(plan.slot)
        if plan.deliver:
            if self._herd.enabled:
                # A catch-up call waits for its turn on the ramp (``_herd``).
                await self._herd.admit(now - plan.slot)
                if row.dropped:
                    return
                now = self._clock.now()
            outcome = await self._call(row, plan, now, 1, next_due is None)
            if outcome is None:
                return  # waits in the window for its retry, planned again then
            if plan.missed:
                self._count_missed(entry)
            delivered_at, ok = outcome
            if not ok and self._retry_later(row, plan, next_due, delivered_at, 1):
                return
            last_fire = now = delivered_at
        else:
            self._count_missed(entry)
            self.skipped += 1
            if entry.action is MissedReminderAction.NOTIFY or next_due is None:
                # A last slot skipped under SKIP is told as well: the reminder
                # ends without a delivery, which nobody would see otherwise.
                await self._notifier.notify(entry, plan.slot, now, plan.missed_ticks, next_due)
            self.history.fired(entry, plan.slot, now, skip_outcome(entry), final=next_due is None)
            self._advance(row, next_due, last_fire, now, delivered=False)
            return
        self._advance(row, next_due, last_fire, now)

    def _count_missed(self, entry: ReminderEntry) -> None:
        self.missed += 1
        self.metrics.missed(entry.action.name)

    # -- one tick ---------------------------------------------------------------------

    async def _call(
        self, row: Row, plan: TickPlan, now: datetime, attempt: int, final: bool
    ) -> tuple[datetime, bool] | None:
        """Deliver the tick: its delivery time and whether the grain returned
        (``False``: it raised), or ``None`` if it did not happen: the call path
        failed, and the row waits in the window for its retry (``DueWindow.retry``,
        giving its permit back), or it was dropped meanwhile (its new owner
        delivers it). ``now``: the clock as the tick was planned, its delivery
        time; ``attempt``/``final`` as in ``TickStatus``."""
        entry = row.entry
        status = _tick_status(
            first_tick_time=entry.start_at,
            period=entry.period,
            cron=entry.cron,
            current_tick_time=row.schedule.nominal(plan.slot),
            delivered_at=now,
            missed_ticks=plan.missed_ticks,
            priority=int(entry.priority),
            due_at=plan.slot,
            payload=entry.payload,
            attempt=attempt,
            final=final,
        )
        deadline = row.deadline
        if deadline is None:
            deadline = row.deadline = tick_deadline(row.schedule, plan.slot, self._options)
        try:
            await self._deliver(entry, status, deadline)
        except TRANSIENT_ERRORS as exc:
            self.retries += 1
            log.info(
                "reminder tick retry name=%s key=%s attempt=%d error=%r",
                self._name,
                row.key,
                row.attempts + 1,
                exc,
            )
            if not row.dropped:
                self._window.retry(row, self._clock.now() + self._retry_delay(row.attempts))
            return None
        except Exception as exc:
            # The grain's own receive_reminder failed: retried only under the
            # row's RetryPolicy (docs/architecture.md, section 2, step 6).
            self.grain_errors += 1
            self.metrics.tick(entry.priority, (now - plan.slot).total_seconds(), True)
            retrying = _will_retry(entry, attempt)
            self.history.fired(
                entry,
                plan.slot,
                now,
                FireOutcome.RETRYING if retrying else FireOutcome.GRAIN_ERROR,
                error_text(exc),
                attempt=attempt,
                final=final and not retrying,
            )
            self._log_grain_error(row, plan, exc)
            return now, False
        self.delivered += 1
        self.metrics.tick(entry.priority, (now - plan.slot).total_seconds(), False)
        self.history.fired(entry, plan.slot, now, FireOutcome.OK, attempt=attempt, final=final)
        return now, True

    def _log_grain_error(self, row: Row, plan: TickPlan, exc: Exception) -> None:
        """One WARNING per failure; its traceback (the grain's, for a remote
        grain) at most every ``TRACEBACK_EVERY_S`` per reminder, with how many
        failures went without one since."""
        now = asyncio.get_running_loop().time()
        seen = self._tracebacks.get(row.key)
        if seen is not None and now - seen[0] < TRACEBACK_EVERY_S:
            self._tracebacks[row.key] = (seen[0], seen[1] + 1)
            log.warning(
                "reminder tick failed in grain name=%s key=%s slot=%s error=%s",
                self._name,
                row.key,
                plan.slot.isoformat(),
                error_text(exc),
            )
            return
        if len(self._tracebacks) >= _TRACEBACKS_KEPT:
            self._tracebacks.pop(next(iter(self._tracebacks)))
        self._tracebacks[row.key] = (now, 0)
        remote = getattr(exc, "remote_traceback", "")
        log.warning(
            "reminder tick failed in grain name=%s key=%s slot=%s error=%s "
            "failures_without_traceback=%d%s",
            self._name,
            row.key,
            plan.slot.isoformat(),
            error_text(exc),
            0 if seen is None else seen[1],
            f"\nremote traceback:\n{remote.rstrip()}" if remote else "",
            exc_info=None if remote else exc,
        )

    def _retry_delay(self, attempts: int) -> timedelta:
        """The backoff after ``attempts`` earlier call-path failures of a row."""
        backoff = Backoff(self._options.retry_initial, self._options.retry_max)
        for _ in range(attempts):
            backoff.next()
        return timedelta(seconds=backoff.next())

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
        # The grain was reached: a run of call-path failures before it is over,
        # and a call-path retry time must not bring the attempt forward.
        row.retry_at, row.attempts = None, 0
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
                # The call path failed: the row waits for a call-path retry of this
                # same attempt (given up like it once the next slot is due).
                if not row.dropped:
                    row.retry = retry
                return
            delivered_at, ok = outcome
            if not ok and self._retry_later(row, retry.plan, next_due, delivered_at, retry.attempt):
                return
            last_fire = now = delivered_at
        self._advance(row, next_due, last_fire, now)

    def _advance(
        self,
        row: Row,
        next_due: datetime | None,
        last_fire: datetime | None,
        now: datetime,
        *,
        delivered: bool = True,
    ) -> None:
        """Record the row's next slot: persist it, and re-queue or release the row
        (``now``: the clock when the tick was delivered or skipped; ``delivered``:
        whether a tick reached the grain, which ends a run of call failures).
        With no next slot (``None``) the schedule has ended: the row is removed."""
        row.last_fire = last_fire
        etag = row.etag
        key = row.key
        grain_id, name = row.entry.grain_id, row.entry.name
        if next_due is None:
            self.ended += 1
            if etag is not None:
                self._persister.submit(
                    _schedule_update(grain_id, name, etag, ENDED, last_fire, True), key
                )
            self._window.drop(row)
            return
        # Submitted for a dropped row too: its tick happened. The CAS against the
        # loaded etag keeps the write from landing on a row another writer moved.
        if etag is not None:
            self._persister.submit(_schedule_update(grain_id, name, etag, next_due, last_fire), key)
        keep = next_due <= now + self._options.look_ahead
        failing_until = None
        if not delivered and row.attempts:
            failing_until = now + self._retry_delay(row.attempts)
        self._window.ticked(row, next_due, keep=keep, failing_until=failing_until)


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
