"""``OverlapPolicy.ALLOW_ALL``: a reminder's ticks running side by side.

The row goes back to the window at its next slot as soon as a tick starts,
so that slot is delivered when it falls due whether the tick still runs or
not (the grain interleaves them: registration refuses ``ALLOW_ALL`` for a
grain that would queue them). The slots whose ticks run are kept on the row
(``Row.running``), and the stored ``next_due`` never passes the earliest of
them: a silo lost meanwhile leaves the earliest unfinished slot in the table,
and the next owner delivers it again (at least once, as for any tick).

A run retries within itself, holding its delivery permit: after a call-path
failure with the row's backoff until the slot is later than its grace (then
it is skipped, counted late), after a grain error under the row's
``RetryPolicy`` as long as the attempt starts before the next slot (then its
slot becomes a dead letter, as a sequential tick's would).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

from orleanspy.clock import Clock
from orleanspy.options import ReminderOptions
from orleanspy.reminders._service.herd import CatchUpThrottle
from orleanspy.reminders._service.history import NoHistory, skip_outcome
from orleanspy.reminders._service.missed import TickPlan
from orleanspy.reminders._service.outcome import Done
from orleanspy.reminders._service.window import Row
from orleanspy.reminders.model import SkipReason

__all__ = ["Ticking", "tick_beside"]


class Ticking(Protocol):
    """What ``tick_beside`` uses of the delivery it runs for (``Delivery``)."""

    grain_retries: int
    retries_given_up: int
    history: NoHistory

    @property
    def clock(self) -> Clock: ...

    @property
    def options(self) -> ReminderOptions: ...

    @property
    def herd(self) -> CatchUpThrottle: ...

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
    ) -> Done | None: ...

    def count_plan(
        self, row: Row, plan: TickPlan, reason: SkipReason, overlapped: bool
    ) -> None: ...

    def count_skips(self, row: Row, reason: SkipReason, n: int) -> None: ...

    def requeue(self, row: Row, next_due: datetime, now: datetime) -> None: ...

    def persist(self, row: Row, next_due: datetime) -> None: ...

    def retry_delay(self, attempts: int) -> timedelta: ...

    def dead_letter(self, row: Row, done: Done, attempts: int) -> None: ...


async def tick_beside(
    d: Ticking,
    row: Row,
    plan: TickPlan,
    now: datetime,
    *,
    next_due: datetime,
    reason: SkipReason,
) -> None:
    """Deliver ``plan``'s slot of an ``ALLOW_ALL`` row while the row waits for
    ``next_due`` (module docstring); ``reason``: why the plan's skipped slots
    were skipped."""
    clock, options, entry = d.clock, d.options, row.entry
    grace = options.grace if entry.grace is None else entry.grace
    if d.herd.enabled:
        await d.herd.admit(now - plan.slot)
        if row.dropped:
            return
        now = clock.now()
    running = row.running
    if running is None:
        running = row.running = []
    slot = plan.slot
    running.append(slot)
    d.requeue(row, next_due, now)
    attempt, failures, counted = 1, 0, False
    try:
        while True:
            done = await d.call(row, plan, now, attempt, False, next_due=next_due, beside=True)
            if done is None:
                failures += 1
                now = clock.now()
                if row.dropped or now > plan.slot + grace:
                    # Unreachable past its grace: given up, as a late slot.
                    d.count_plan(row, plan, reason, False)
                    counted = True
                    d.count_skips(row, SkipReason.LATE, 1)
                    d.history.fired(entry, plan.slot, now, skip_outcome(entry))
                    return
                await clock.sleep(d.retry_delay(failures - 1).total_seconds())
                now = clock.now()
                continue
            if not counted:
                d.count_plan(row, plan, reason, False)
                counted = True
            if row.last_fire is None or done.at > row.last_fire:
                row.last_fire = done.at
            if done.ok:
                return
            policy = entry.retry
            if policy is not None and attempt < policy.max_attempts and not row.dropped:
                if done.at + policy.backoff < next_due:
                    d.grain_retries += 1
                    await clock.sleep(policy.backoff.total_seconds())
                    attempt += 1
                    now = clock.now()
                    continue
                d.retries_given_up += 1
            d.dead_letter(row, done, attempt)
            return
    finally:
        if row.running is running:
            running.remove(slot)
            # Progress up to the earliest slot still running, else the row's own.
            d.persist(row, min(running) if running else row.next_due)
