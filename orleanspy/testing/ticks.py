"""Deliver a reminder tick by hand, as the reminder service would: for tests.

``receive_reminder`` refuses calls that do not come from a silo's reminder
service (a client, another grain), so a test that wants a grain to see a tick
now, off its schedule, asks its silo::

    status = await simulate_tick(silo, StatsGrain, "a", "quick-ping")

The tick runs through the silo's dispatcher like one of the service's own
(activating the grain where it lives, turn rules and all); the row, if there is
one, is neither read nor moved.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from orleanspy.grain import definition_of
from orleanspy.identity import GrainId, GrainKey
from orleanspy.reminders.model import ReminderPriority, TickStatus
from orleanspy.runtime.silo import Silo

__all__ = ["simulate_tick"]


async def simulate_tick(
    silo: Silo,
    grain: type[Any] | str,
    key: GrainKey,
    name: str,
    *,
    slot: datetime | None = None,
    first_tick: datetime | None = None,
    triggered: bool = False,
    period: timedelta | None = None,
    cron: str | None = None,
    missed_ticks: int = 0,
    priority: int = ReminderPriority.NORMAL,
    payload: Any = None,
    attempt: int = 1,
    final: bool = False,
    deadline: timedelta | None = None,
) -> TickStatus:
    """Deliver one tick of reminder ``name`` to grain ``(grain, key)`` through
    ``silo`` (a running silo hosting or reaching the grain) and return the
    ``TickStatus`` it was given once ``receive_reminder`` returned; an exception
    of the grain's ``receive_reminder`` propagates. ``slot`` defaults to the
    silo clock's now (also the delivery time and ``due_at``: no jitter);
    ``first_tick`` (the registration's first slot: ticks of one registration
    share it, and with it their occurrence ids' registration part) defaults to
    the slot; ``triggered``, ``payload``, ``attempt`` and ``final`` are given as
    the service would give them for such a row. ``deadline``: the run is
    cancelled once the silo's clock passed it (``TickDeadlineError``), as for a
    reminder with ``deadline=``: a ``ManualClock`` moves it."""
    type_name = grain if isinstance(grain, str) else definition_of(grain).type_name
    now = silo.clock.now()
    at = now if slot is None else slot
    status = TickStatus(
        first_tick_time=at if first_tick is None else first_tick,
        period=period,
        cron=cron,
        current_tick_time=at,
        delivered_at=now,
        missed_ticks=missed_ticks,
        priority=int(priority),
        due_at=at,
        payload=payload,
        attempt=attempt,
        final=final,
        triggered=triggered,
        deadline=deadline,
    )
    await silo.dispatcher.invoke(
        GrainId(type_name, key), "receive_reminder", (name, status), {}, reminder_tick=True
    )
    return status
