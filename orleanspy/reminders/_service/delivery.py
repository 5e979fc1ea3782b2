"""Delivery: what happens to a row once it is due.

A tick is one grain call, ``receive_reminder``, with a deadline of its own
(``call_wait``). Failures of the call path give the delivery permit back
and the row waits in the window for its retry; only after the grain
acknowledged is the row's next slot handed to the persister. A silo lost
between the two leaves the old slot in the table and the next owner delivers
the tick again: at least once. A row reached later than its grace, or with a
further slot passed, gets its ``MissedReminderAction`` instead (``missed``),
and its grid resumes after now, so a long outage costs at most one catch-up
tick per row. A slot that fell due while the row's previous tick still ran
follows the row's ``OverlapPolicy`` (``missed.plan_overlap``); an
``ALLOW_ALL`` row's ticks run side by side (``concurrent``).

Every outcome is counted for its row (``counting``: delivered, failed,
skipped by reason, ...), and a tick that failed its last attempt becomes a
dead letter (``dead_letters``); both reach the table with the schedule writes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from orleanspy import tracing
from orleanspy._frozen import maker
from orleanspy._retry import Backoff
from orleanspy.clock import Clock
from orleanspy.errors import (
    ActivationError,
    GrainCallTimeoutError,
    MessageRejectedError,
    SiloUnavailableError,
    StorageUnavailableError,
    TickDeadlineError,
)
from orleanspy.metrics import ReminderMetrics
from orleanspy.options import ReminderOptions
from orleanspy.reminders._service.concurrent import tick_beside
from orleanspy.reminders._service.errorlog import TRACEBACK_EVERY_S, GrainErrorLog
from orleanspy.reminders._service.features import ServiceFeatures
from orleanspy.reminders._service.herd import CatchUpThrottle
from orleanspy.reminders._service.history import NoHistory, skip_outcome
from orleanspy.reminders._service.missed import (
    MissedNotifier,
    PublishMissed,
    TickPlan,
    plan_overlap,
    plan_tick,
)
from orleanspy.reminders._service.outcome import Done
from orleanspy.reminders._service.persist import Persister
from orleanspy.reminders._service.window import DueWindow, Row
from orleanspy.reminders.counters import (
    DEAD_LETTERED,
    DEADLINE_EXCEEDED,
    DEDUPLICATED,
    DELIVERED,
    FAILED,
    SKIPPED,
)
from orleanspy.reminders.model import (
    ENDED,
    TICK_DEDUPLICATED,
    FireOutcome,
    MissedReminderAction,
    OverlapPolicy,
    ReminderEntry,
    ScheduleUpdate,
    SkipReason,
    TickStatus,
    error_text,
    occurrence_of,
)
from orleanspy.reminders.schedule import Schedule

if TYPE_CHECKING:
    from orleanspy._otel import Tracer
from orleanspy.versions import Feature

__all__ = [
    "TRACEBACK_EVERY_S",
    "TRANSIENT_ERRORS",
    "Deliver",
    "Delivery",
    "Done",
    "PublishMissed",
    "call_wait",
]

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
#: acknowledgement. ``deadline`` (seconds, ``call_wait``) bounds how long it
#: may wait on another process: past it, it raises ``GrainCallTimeoutError``
#: (a tick running in this process may take longer; it is the grain's own work,
#: bounded only by ``status.deadline`` where it runs).
Deliver = Callable[[ReminderEntry, TickStatus, float], Awaitable[object]]

#: How much longer than a tick's run deadline its call waits for the answer
#: (the answer of a run cut at its deadline has to travel back).
DEADLINE_MARGIN_S: Final = 1.0
_CUT_TEXT: Final = "TickDeadlineError: cancelled when the next slot fell due (overlap CANCEL_OTHER)"

# The frozen dataclasses a tick builds, without their frozen __init__ (orleanspy._frozen).
_tick_status = maker(TickStatus)
_schedule_update = maker(ScheduleUpdate)
_BUFFER_ONE: Final = OverlapPolicy.BUFFER_ONE
_ALLOW_ALL: Final = OverlapPolicy.ALLOW_ALL


def call_wait(schedule: Schedule, slot: datetime, options: ReminderOptions) -> float:
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
    goes back or leaves), the persister (where the next slot is written, and
    where the row's counters and dead letters wait for it), the notifier
    (NOTIFY skips) and the grain call ``deliver(entry, status)``. The lane
    drainer calls ``tick(row)`` with one permit per row; nothing else calls
    it. ``metrics`` and ``history`` record each tick (default: nothing);
    ``features`` says which cluster features are on (default: all of this
    release's).

    Guarantees:

    - at least once: a tick failing with one of ``TRANSIENT_ERRORS`` (also a
      call that outlived its ``call_wait``) gives its permit back and waits
      in the window for a retry with backoff; it is then planned again, so it
      is retried, or handed to its missed-tick action once late past its grace,
      unless the row is dropped meanwhile (its next owner delivers it). Any
      other exception is the grain's own failure (a ``TickDeadlineError`` too:
      the run outlived its ``deadline``): logged (with its traceback,
      rate-limited per reminder), recorded in the history with its type and
      message, counted in ``grain_errors``; the schedule moves on, unless the
      row's ``RetryPolicy`` has attempts left that can start before the next
      slot: then the row waits in the window for its retry (no permit held)
      and its slot is persisted only after the last attempt. A slot whose last
      attempt failed becomes a dead letter, written before its progress;
    - a row with no slot left after its tick (a one-shot, a bounded reminder's
      last slot) is removed: a removal goes to the persister in place of the
      schedule CAS, after the delivery, as a CAS would;
    - the next slot is submitted for persistence only after ``deliver`` has
      returned (or raised a grain error), never before (an ``ALLOW_ALL`` row:
      never past a slot whose tick still runs);
    - the missed-tick rule (``missed``) applies, with the row's own grace or the
      default: several passed slots, or one past the grace, are missed;
      FIRE_IMMEDIATELY delivers one catch-up tick (the latest slot, if it lies
      in the row's catch-up window), SKIP and NOTIFY deliver none; the grid
      resumes at the first slot after now;
    - slots that fell due while the row's previous tick ran follow its
      ``OverlapPolicy`` (``BUFFER_ONE``, the default, is the missed-tick rule
      above, as before 0.2);
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
        features: ServiceFeatures | None = None,
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
        #: The process's tracer as the service starts (``orleanspy.tracing``).
        self.tracing: Tracer | None = tracing.active()
        self._features = features or ServiceFeatures()
        self._counts = persister.counts
        self._letters = persister.letters
        self._errors = GrainErrorLog(name)
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
            max_lag=options.catch_up_max_lag,
        )
        #: Retries queued under a RetryPolicy, and retries given up at the next slot.
        self.grain_retries = 0
        self.retries_given_up = 0
        #: Rows removed because their schedule ended.
        self.ended = 0
        #: Ticks not run again: the grain's state had committed their occurrence.
        self.deduplicated = 0
        #: Ticks that failed their last attempt (dead letters, where they are kept).
        self.dead_lettered = 0
        #: Runs cancelled at their deadline (CANCEL_OTHER's cuts not included).
        self.deadline_exceeded = 0
        #: Slots skipped because the row's previous tick still ran, and slots
        #: skipped because they were older than the row's catch-up window.
        self.overlap_skipped = 0
        self.catchup_skipped = 0

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def options(self) -> ReminderOptions:
        return self._options

    @property
    def herd(self) -> CatchUpThrottle:
        return self._herd

    @property
    def catch_up_halvings(self) -> int:
        """Times herd control's brake halved the catch-up rate (``herd``)."""
        return self._herd.halvings

    def close(self) -> None:
        """Call off what outlives a tick (herd control's lag sampling)."""
        self._herd.close()

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
        overlap = entry.overlap
        grace = self._options.grace if entry.grace is None else entry.grace
        until = row.overlap_until
        overlapped = until is not None and row.next_due <= until
        row.overlap_until = None
        if overlapped and overlap is not None and overlap is not _BUFFER_ONE:
            plan = plan_overlap(row.schedule, overlap, row.next_due, now)
            reason = SkipReason.OVERLAP
        else:
            plan = plan_tick(
                row.schedule,
                entry.action,
                row.next_due,
                now,
                grace,
                catchup_window=entry.catchup_window,
            )
            reason = self._reason(entry, row.next_due, overlapped)
        last_fire = row.last_fire
        # None: the schedule has no slot after this one (the row ends with it).
        next_due = plan.resume if plan.missed else row.schedule.next_after(plan.slot)
        if plan.deliver:
            if overlap is _ALLOW_ALL and next_due is not None:
                # Its next slot must not wait for this one (``concurrent``).
                await tick_beside(self, row, plan, now, next_due=next_due, reason=reason)
                return
            if self._herd.enabled:
                # A catch-up call waits for its turn on the ramp (``_herd``).
                await self._herd.admit(now - plan.slot)
                if row.dropped:
                    return
                now = self._clock.now()
            done = await self.call(row, plan, now, 1, next_due is None, next_due=next_due)
            if done is None:
                # Waits in the window for its retry, planned again then (as the
                # overlapping slot it was, if it was one).
                row.overlap_until = until
                return
            self.count_plan(row, plan, reason, overlapped)
            if not done.ok and not done.cut:
                if self._retry_later(row, plan, next_due, done, 1):
                    return
                self.dead_letter(row, done, 1)
            # Delivered: acknowledged, or raised in the grain (which counts as delivered).
            last_fire = now = done.at
            if next_due is not None and next_due <= done.end:
                row.overlap_until = done.end  # the next slot overlapped this tick
        else:
            self.count_plan(row, plan, reason, overlapped)
            self.skipped += 1
            if entry.action is MissedReminderAction.NOTIFY or next_due is None:
                # A last slot skipped under SKIP is told as well: the reminder
                # ends without a delivery, which nobody would see otherwise.
                await self._notifier.notify(entry, plan.slot, now, plan.missed_ticks, next_due)
            self.history.fired(entry, plan.slot, now, skip_outcome(entry), final=next_due is None)
            self.advance(row, next_due, last_fire, now, delivered=False)
            return
        self.advance(row, next_due, last_fire, now)

    @staticmethod
    def _reason(entry: ReminderEntry, slot: datetime, overlapped: bool) -> SkipReason:
        """Why a late row's slots from ``slot`` on are skipped: the previous tick
        ran over them, the row was paused over them (it was resumed after
        ``slot``), else they were reached late."""
        if overlapped:
            return SkipReason.OVERLAP
        resumed = entry.resumed_at
        if resumed is not None and slot <= resumed:
            return SkipReason.PAUSED
        return SkipReason.LATE

    def count_plan(self, row: Row, plan: TickPlan, reason: SkipReason, overlapped: bool) -> None:
        """Count what ``plan`` skips, and a missed row as such (an overlap
        plan's skips are the overlap's, not missed ticks)."""
        entry = row.entry
        if plan.missed and (not overlapped or entry.overlap in (None, _BUFFER_ONE)):
            self.missed += 1
            self.metrics.missed(entry.action.name)
        self.count_skips(row, reason, plan.skipped)
        self.count_skips(row, SkipReason.CATCHUP_WINDOW, plan.outside)

    def count_skips(self, row: Row, reason: SkipReason, n: int) -> None:
        """``n`` slots of ``row`` were skipped for ``reason``."""
        if not n:
            return
        self._counts.add(row.key, row.entry, SKIPPED[reason], n)
        self.metrics.skipped(reason.value, n)
        if reason is SkipReason.OVERLAP:
            self.overlap_skipped += n
        elif reason is SkipReason.CATCHUP_WINDOW:
            self.catchup_skipped += n

    # -- one tick ---------------------------------------------------------------------

    def run_deadline(
        self, entry: ReminderEntry, now: datetime, next_due: datetime | None
    ) -> tuple[timedelta | None, bool]:
        """How long a run of ``entry``'s tick planned at ``now`` may take where it
        runs, and whether that limit is ``CANCEL_OTHER``'s cut at the next slot
        (``next_due``) rather than the row's deadline. ``(None, False)`` while
        the cluster lacks ``Feature.TICK_DEADLINE`` (as 0.1 did)."""
        limit = entry.deadline if entry.deadline is not None else self._options.tick_deadline
        cancels = entry.overlap is OverlapPolicy.CANCEL_OTHER and next_due is not None
        if (limit is None and not cancels) or not self._features.on(Feature.TICK_DEADLINE):
            return None, False
        if cancels:
            assert next_due is not None
            gap = max(next_due - now, timedelta(milliseconds=1))
            if limit is None or gap < limit:
                return gap, True
        return limit, False

    async def call(
        self,
        row: Row,
        plan: TickPlan,
        now: datetime,
        attempt: int,
        final: bool,
        *,
        next_due: datetime | None = None,
        beside: bool = False,
    ) -> Done | None:
        """Deliver the tick: how it went (``Done``), or ``None`` if it did not
        happen: the call path failed, and the row waits in the window for its
        retry (``DueWindow.retry``, giving its permit back; not with ``beside``,
        whose caller retries), or it was dropped meanwhile (its new owner
        delivers it). ``now``: the clock as the tick was planned, its delivery
        time; ``attempt``/``final`` as in ``TickStatus``; ``next_due``: the
        row's next slot (a ``CANCEL_OTHER`` run is cut there)."""
        entry = row.entry
        limit, cuts = self.run_deadline(entry, now, next_due)
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
            deadline=limit,
        )
        wait = row.deadline
        if wait is None:
            wait = row.deadline = call_wait(row.schedule, plan.slot, self._options)
        if limit is not None:
            # The call waits for the run's answer, cut at its deadline or not.
            wait = max(wait, limit.total_seconds() + DEADLINE_MARGIN_S)
        try:
            if self.tracing is None:
                answer = await self._deliver(entry, status, wait)
            else:
                answer = await self._traced(self.tracing, entry, status, wait)
        except TRANSIENT_ERRORS as exc:
            self.retries += 1
            log.info(
                "reminder tick retry name=%s key=%s attempt=%d error=%r",
                self._name,
                row.key,
                row.attempts + 1,
                exc,
            )
            if not row.dropped and not beside:
                self._window.retry(row, self._clock.now() + self.retry_delay(row.attempts))
            return None
        except Exception as exc:
            end = self._clock.now()
            if cuts and isinstance(exc, TickDeadlineError):
                # CANCEL_OTHER: the next slot fell due and takes this one's place.
                self.count_skips(row, SkipReason.OVERLAP, 1)
                self.history.fired(
                    entry, plan.slot, now, FireOutcome.GRAIN_ERROR, _CUT_TEXT, attempt=attempt
                )
                return Done(now, end, status, exc, cut=True)
            # The grain's own receive_reminder failed: retried only under the
            # row's RetryPolicy (docs/architecture.md, section 2, step 6).
            self.grain_errors += 1
            self.metrics.tick(entry.priority, (now - plan.slot).total_seconds(), True)
            counts = self._counts
            counts.add(row.key, entry, FAILED)
            counts.error(row.key, entry, exc, end)
            if isinstance(exc, TickDeadlineError):
                self.deadline_exceeded += 1
                counts.add(row.key, entry, DEADLINE_EXCEEDED)
                self.metrics.deadline_exceeded()
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
            self._errors.failed(row.key, plan.slot, exc)
            return Done(now, end, status, exc)
        if answer == TICK_DEDUPLICATED:
            # The grain's state had committed this occurrence (a redelivery after
            # a crash): its progress is persisted as if it had run.
            self.deduplicated += 1
            self.metrics.deduplicated()
            self._counts.add(row.key, entry, DEDUPLICATED)
            outcome = FireOutcome.DEDUPLICATED
        else:
            self.delivered += 1
            self.metrics.tick(entry.priority, (now - plan.slot).total_seconds(), False)
            self._counts.add(row.key, entry, DELIVERED)
            outcome = FireOutcome.OK
        self.history.fired(entry, plan.slot, now, outcome, attempt=attempt, final=final)
        return Done(now, self._clock.now(), status)

    async def _traced(
        self, tracer: Tracer, entry: ReminderEntry, status: TickStatus, wait: float
    ) -> object:
        """``deliver`` inside the tick's span (``orleanspy._otel``): a new trace,
        linked to the span that registered or last changed the row."""
        with tracer.tick(
            entry.grain_id,
            entry.name,
            slot=status.current_tick_time,
            occurrence_id=occurrence_of(entry.service_id, entry.grain_id, entry.name, status),
            attempt=status.attempt,
            priority=status.priority,
            missed_ticks=status.missed_ticks,
            linked=entry.trace_context,
        ):
            return await self._deliver(entry, status, wait)

    def dead_letter(self, row: Row, done: Done, attempts: int) -> None:
        """The slot of ``done`` failed its last attempt (the ``attempts``-th):
        keep it as a dead letter, where they are kept."""
        error = done.error
        assert error is not None
        self.dead_lettered += 1
        self.metrics.dead_lettered()
        if not self._letters.enabled:
            return
        self._letters.add(self._letters.build(row.entry, done.status, error, attempts))
        self._counts.add(row.key, row.entry, DEAD_LETTERED)

    def retry_delay(self, attempts: int) -> timedelta:
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
        done: Done,
        attempt: int,
    ) -> bool:
        """Queue the next attempt of a slot whose grain raised, if the row's policy
        has one left and it starts before the next slot; ``True`` if queued. The
        row waits in the window like any due row, so no permit is held meanwhile;
        the table keeps the slot, so a crash meanwhile delivers it again."""
        policy = row.entry.retry
        if policy is None or attempt >= policy.max_attempts or row.dropped:
            return False
        at = done.at + policy.backoff
        if next_due is not None and at >= next_due:
            self.retries_given_up += 1
            return False
        row.retry = _Retry(plan, attempt + 1, at, next_due, done)
        row.next_due = at
        # The grain was reached: a run of call-path failures before it is over,
        # and a call-path retry time must not bring the attempt forward.
        row.retry_at, row.attempts = None, 0
        self.grain_retries += 1
        self._window.push(row)
        return True

    async def _retry(self, row: Row, retry: _Retry, now: datetime) -> None:
        """Deliver a queued retry; once it could not start before the next slot,
        give it up (its slot becomes a dead letter) and move on to that slot."""
        next_due = retry.next_due
        last_fire = row.last_fire
        if next_due is not None and now >= next_due:
            self.retries_given_up += 1
            self.dead_letter(row, retry.failed, retry.attempt - 1)
        else:
            done = await self.call(
                row, retry.plan, now, retry.attempt, next_due is None, next_due=next_due
            )
            if done is None:
                # The call path failed: the row waits for a call-path retry of this
                # same attempt (given up like it once the next slot is due).
                if not row.dropped:
                    row.retry = retry
                return
            if not done.ok and not done.cut:
                if self._retry_later(row, retry.plan, next_due, done, retry.attempt):
                    return
                self.dead_letter(row, done, retry.attempt)
            last_fire = now = done.at
        self.advance(row, next_due, last_fire, now)

    def requeue(self, row: Row, next_due: datetime, now: datetime) -> None:
        """Put ``row`` back in the window at ``next_due`` before its tick ended
        (``ALLOW_ALL``: its next slot does not wait); nothing is persisted."""
        self._window.ticked(row, next_due, keep=next_due <= now + self._options.look_ahead)

    def persist(self, row: Row, next_due: datetime) -> None:
        """Submit ``row``'s progress: ``next_due`` and its ``last_fire``."""
        if row.etag is not None:
            entry = row.entry
            update = _schedule_update(entry.grain_id, entry.name, row.etag, next_due, row.last_fire)
            self._persister.submit(update, row.key)

    def advance(
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
            running = row.running
            # An ALLOW_ALL row never stores a slot past one whose tick still runs.
            stored = min(*running, next_due) if running else next_due
            self._persister.submit(_schedule_update(grain_id, name, etag, stored, last_fire), key)
        keep = next_due <= now + self._options.look_ahead
        failing_until = None
        if not delivered and row.attempts:
            failing_until = now + self.retry_delay(row.attempts)
        self._window.ticked(row, next_due, keep=keep, failing_until=failing_until)


def _will_retry(entry: ReminderEntry, attempt: int) -> bool:
    """Whether the policy allows another attempt (time may still rule it out)."""
    return entry.retry is not None and attempt < entry.retry.max_attempts


@dataclass(frozen=True, slots=True)
class _Retry:
    """A queued retry: the slot's plan, which attempt comes next, when, the
    slot after (the retry's deadline; ``None`` for a reminder's last slot), and
    the attempt that failed before it (its dead letter, if it is given up)."""

    plan: TickPlan
    attempt: int
    at: datetime
    next_due: datetime | None
    failed: Done
