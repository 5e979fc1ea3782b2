"""Herd control (``reminders/_herd``): catch-up grain calls ramp from
``catch_up_rate`` to ``catch_up_ceiling``, in the order they ask; on-time calls
never wait."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orleanspy.errors import ConfigurationError
from orleanspy.options import ReminderOptions
from orleanspy.reminders._service.herd import CatchUpThrottle
from orleanspy.testing.clock import ManualClock

LATE = timedelta(minutes=10)


def _instants(throttle: CatchUpThrottle, n: int) -> list[float]:
    """The turns of ``n`` calls asked at once, in seconds from now."""
    return [throttle.reserve(LATE) for _ in range(n)]


def test_catch_up_calls_ramp_up_to_the_ceiling_in_the_order_they_ask() -> None:
    clock = ManualClock()
    throttle = CatchUpThrottle(clock, rate=10, ceiling=40, lateness=timedelta(seconds=1))
    at = _instants(throttle, 400)
    assert at == sorted(at), "turns are not in the order asked"
    assert at[0] == 0.0, "the first catch-up call waited"
    # Doubling from 10/s: at most 10 * (2 - 1) / ln 2 ~ 14.4 in the first second.
    assert sum(1 for t in at if t < 1.0) <= 15
    for start in [i / 4 for i in range(int(at[-1] * 4))]:
        window = sum(1 for t in at if start <= t < start + 1.0)
        assert window <= 41, f"{window} calls in the second from {start}: above the ceiling"
    # Once at the ceiling, it holds there: the last 100 turns are 1/40 s apart.
    gaps = [b - a for a, b in zip(at[-100:], at[-99:], strict=False)]
    assert all(abs(g - 1 / 40) < 1e-9 for g in gaps)


async def test_on_time_calls_never_wait_and_a_quiet_second_restarts_the_ramp() -> None:
    clock = ManualClock()
    throttle = CatchUpThrottle(clock, rate=10, ceiling=0, lateness=timedelta(seconds=1))
    assert throttle.reserve(timedelta(milliseconds=900)) == 0.0
    first = [throttle.reserve(LATE) for _ in range(5)]
    assert first == pytest.approx([0.0, 0.1, 0.1 + 1 / (10 * 2**0.1), *first[3:]])
    assert all(throttle.reserve(timedelta(0)) == 0.0 for _ in range(100)), "on time waited"
    await clock.advance(timedelta(seconds=5))
    assert throttle.reserve(LATE) == 0.0
    assert throttle.reserve(LATE) == pytest.approx(0.1), "the ramp did not start again"


def test_disabled_by_default_and_bad_options_are_refused() -> None:
    clock = ManualClock()
    options = ReminderOptions()
    throttle = CatchUpThrottle(
        clock,
        rate=options.catch_up_rate,
        ceiling=options.catch_up_ceiling,
        lateness=options.catch_up_lateness,
    )
    assert not throttle.enabled and throttle.reserve(LATE) == 0.0
    with pytest.raises(ConfigurationError, match="catch_up_ceiling"):
        ReminderOptions(catch_up_rate=100, catch_up_ceiling=50)
    with pytest.raises(ConfigurationError, match="catch_up_rate"):
        ReminderOptions(catch_up_rate=-1)
