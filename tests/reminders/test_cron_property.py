"""Cron slots agree with a second, independent implementation (cronsim).

Thousands of random five- and six-field expressions in UTC, built from every
numeric form cron has (``*``, ``N``, ``N-M``, ``N-N``, ``*/S``, ``N-M/S``,
``N-N/S``, ``N/S`` and comma lists of them, day-of-week 7 included). The first
slots after a random instant must be identical, and an expression one side
refuses the other must refuse too.

One reading differs on purpose: cronsim takes ``N-N/S`` as ``N/S`` (from N to
the field's end), Vixie cron and we take it as the range N..N, i.e. ``N``; the
expression handed to cronsim spells such an item ``N``.
"""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError

from orleanspy.errors import ReminderError
from orleanspy.reminders.schedule import CronSchedule

BOUNDS = [(0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
EXPRESSIONS = 4000
SLOTS = 4
_ONE_VALUE_STEP = re.compile(r"^(\d+)-(\d+)/\d+$")


def _item(rng: random.Random, lo: int, hi: int) -> str:
    a = rng.randint(lo, hi)
    b = rng.randint(a, hi)
    step = rng.randint(1, hi - lo + 1)
    return rng.choice(
        [
            "*",
            str(a),
            f"{a}-{a}",
            f"{a}-{b}",
            f"*/{step}",
            f"{a}-{b}/{step}",
            f"{a}-{a}/{step}",
            f"{a}/{step}",
        ]
    )


def _field(rng: random.Random, lo: int, hi: int) -> str:
    n = 1 if rng.random() < 0.7 else rng.randint(2, 3)
    return ",".join(_item(rng, lo, hi) for _ in range(n))


def _for_cronsim(expr: str) -> str:
    def item(it: str) -> str:
        m = _ONE_VALUE_STEP.match(it)
        return m.group(1) if m and m.group(1) == m.group(2) else it

    return " ".join(",".join(item(i) for i in f.split(",")) for f in expr.split())


def _ours(expr: str, start: datetime) -> list[datetime] | None:
    try:
        schedule = CronSchedule(expr)
        out, t = [], start
        for _ in range(SLOTS):
            t = schedule.next_after(t)
            out.append(t)
    except ReminderError:
        return None
    return out


def _theirs(expr: str, start: datetime) -> list[datetime] | None:
    six = _for_cronsim(expr)
    if len(expr.split()) == 5:
        six = "0 " + six
    try:
        it = CronSim(six, start)
        return [next(it) for _ in range(SLOTS)]
    except (CronSimError, StopIteration):
        return None


def test_random_cron_expressions_agree_with_cronsim_in_utc() -> None:
    rng = random.Random(20260301)
    disagreements: list[str] = []
    compared = 0
    for _ in range(EXPRESSIONS):
        six = rng.random() < 0.5
        fields = BOUNDS if six else BOUNDS[1:]
        expr = " ".join(_field(rng, lo, hi) for lo, hi in fields)
        start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(3 * 365 * 86400))
        ours, theirs = _ours(expr, start), _theirs(expr, start)
        compared += ours is not None
        if ours != theirs:
            disagreements.append(f"{expr!r} after {start}: ours {ours} cronsim {theirs}")
    assert not disagreements, f"{len(disagreements)} disagree, e.g. {disagreements[:3]}"
    assert compared > EXPRESSIONS * 0.9, "most random expressions should be valid"


def test_one_value_ranges_are_the_value_not_a_wildcard() -> None:
    # croniter 7 alone reads these as '*'.
    start = datetime(2026, 3, 1, tzinfo=UTC)
    assert CronSchedule("0 0 23-23 * * *").next_after(start) == datetime(2026, 3, 1, 23, tzinfo=UTC)
    slot = CronSchedule("* 41 * * 10-10 2-6").next_after(start)
    assert slot.month == 10 and slot.minute == 41
