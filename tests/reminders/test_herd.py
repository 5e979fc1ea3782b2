"""Herd control (``reminders/_herd``): catch-up grain calls ramp from
``catch_up_rate`` to ``catch_up_ceiling``, in the order they ask; on-time calls
never wait."""

from __future__ import annotations

import itertools
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


async def test_on_by_default_off_at_rate_zero_and_bad_options_are_refused() -> None:
    clock = ManualClock()
    options = ReminderOptions()
    assert options.catch_up_rate > 0 and options.catch_up_max_lag is not None
    throttle = _throttle(clock, options)
    assert throttle.enabled
    assert throttle.reserve(LATE) == 0.0 and throttle.reserve(LATE) > 0.0
    off = _throttle(clock, ReminderOptions(catch_up_rate=0))
    assert not off.enabled and off.reserve(LATE) == 0.0 and off.reserve(LATE) == 0.0
    with pytest.raises(ConfigurationError, match="catch_up_ceiling"):
        ReminderOptions(catch_up_rate=100, catch_up_ceiling=50)
    with pytest.raises(ConfigurationError, match="catch_up_rate"):
        ReminderOptions(catch_up_rate=-1)
    with pytest.raises(ConfigurationError, match="catch_up_max_lag"):
        ReminderOptions(catch_up_max_lag=0)
    assert ReminderOptions(catch_up_max_lag=0.05).catch_up_max_lag == timedelta(milliseconds=50)
    assert ReminderOptions(catch_up_max_lag=None).catch_up_max_lag is None


def _throttle(clock: ManualClock, options: ReminderOptions) -> CatchUpThrottle:
    return CatchUpThrottle(
        clock,
        rate=options.catch_up_rate,
        ceiling=options.catch_up_ceiling,
        lateness=options.catch_up_lateness,
        max_lag=options.catch_up_max_lag,
    )


async def _rate_after(clock: ManualClock, throttle: CatchUpThrottle, seconds: float) -> float:
    """Keep a catch-up going (a call every 50 ms) for ``seconds``; the rate then."""
    for _ in range(round(seconds / 0.05)):
        throttle.reserve(LATE)
        await clock.advance(0.05)
    return throttle.current_rate()


async def test_a_lagging_loop_halves_the_rate_and_holds_it_until_a_calm_second() -> None:
    clock = ManualClock()
    throttle = CatchUpThrottle(
        clock, rate=10, ceiling=0, lateness=timedelta(seconds=1), max_lag=timedelta(milliseconds=20)
    )
    grown = await _rate_after(clock, throttle, 3.0)
    assert grown == pytest.approx(80, rel=0.05), "the rate did not double each second"
    throttle.observe_lag(0.019)  # within the limit: nothing changes
    assert throttle.current_rate() == pytest.approx(grown) and throttle.halvings == 0
    throttle.observe_lag(0.030)
    assert throttle.current_rate() == pytest.approx(grown / 2) and throttle.halvings == 1
    # Within the hold, another sample over the limit does not halve again, but
    # restarts the calm: the rate stays where it is.
    await clock.advance(0.2)
    throttle.observe_lag(0.5)
    assert throttle.halvings == 1
    assert await _rate_after(clock, throttle, 0.9) == pytest.approx(grown / 2)
    # A second of calm after the last sample over the limit: it grows again, by
    # the starting rate each second now, no longer doubling.
    regrown = await _rate_after(clock, throttle, 1.0)
    assert grown / 2 < regrown <= grown / 2 + 10
    assert await _rate_after(clock, throttle, 2.0) == pytest.approx(regrown + 20, abs=1)
    # Halvings stop at the starting rate.
    for _ in range(10):
        await clock.advance(0.5)
        throttle.observe_lag(1.0)
    assert throttle.current_rate() == pytest.approx(10)


async def test_the_brake_spaces_the_turns_it_hands_out_at_the_halved_rate() -> None:
    clock = ManualClock()
    throttle = CatchUpThrottle(
        clock, rate=10, ceiling=40, lateness=timedelta(seconds=1), max_lag=timedelta(seconds=0.02)
    )
    await _rate_after(clock, throttle, 3.0)
    assert throttle.current_rate() == pytest.approx(40), "not at the ceiling"
    throttle.observe_lag(0.1)
    at = _instants(throttle, 20)
    gaps = [b - a for a, b in itertools.pairwise(at[1:])]
    assert all(g == pytest.approx(1 / 20) for g in gaps), gaps


async def test_the_lag_is_sampled_only_while_a_catch_up_runs() -> None:
    """The sampling is a timer set again every probe while catch-up calls come,
    and ends a quiet second after the last one: no timer is left behind."""
    clock = ManualClock()
    throttle = CatchUpThrottle(
        clock, rate=10, ceiling=0, lateness=timedelta(seconds=1), max_lag=timedelta(milliseconds=20)
    )
    assert clock.sleepers == 0
    throttle.reserve(timedelta(0))  # on time: no catch-up, no sampling
    assert clock.sleepers == 0
    throttle.reserve(LATE)
    assert clock.sleepers == 1, "no lag sample was set"
    await clock.advance(0.5)
    assert clock.sleepers == 1, "the sampling stopped during the catch-up"
    await clock.advance(2.0)
    assert clock.sleepers == 0, "the sampling outlived the catch-up"
    throttle.reserve(LATE)
    assert clock.sleepers == 1
    throttle.close()
    assert clock.sleepers == 0
    without = CatchUpThrottle(clock, rate=10, ceiling=0, lateness=timedelta(seconds=1))
    without.reserve(LATE)
    assert clock.sleepers == 0, "sampled with the brake off"
