"""Property tests for jitter and bounds (hypothesis).

Jitter: every jittered slot lies in ``[nominal, nominal + jitter)``, before the
next nominal slot and not past ``ends_at``; the offset depends only on the row
and the slot (a fresh schedule, as another silo or a restart builds it, gives
the same instants); ``nominal`` maps each jittered slot back to its slot.
Bounds: walking a row's schedule never yields a slot before ``starts_at``,
after ``ends_at`` or beyond ``max_ticks`` slots, and yields all the slots
inside them. Interval and cron schedules both.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.schedule import schedule_for
from orleanspy.reminders.spec import ReminderSpec, new_entry

NOW = datetime(2030, 3, 28, 22, 0, tzinfo=UTC)  # a DST change in Europe ahead
OPTIONS = ReminderOptions()
MS = timedelta(milliseconds=1)
CRONS = ["*/5 * * * * *", "0 */7 * * * *", "0 30 2 * * *", "0 0 9 * * 1-5", "15,45 * * * * *"]

periods = st.integers(min_value=1_000, max_value=3_600_000).map(lambda ms: ms * MS)
keys = st.one_of(st.integers(0, 10**9), st.text(min_size=0, max_size=12))


def _walk(entry: ReminderEntry, limit: int) -> list[datetime]:
    """The row's slots as the service walks them: its ``next_due``, then each
    ``next_after`` the previous one."""
    schedule = schedule_for(entry)
    out: list[datetime] = []
    slot: datetime | None = entry.next_due
    while slot is not None and len(out) < limit:
        out.append(slot)
        slot = schedule.next_after(slot)
    return out


@settings(max_examples=200, deadline=None)
@given(
    key=keys,
    period=periods,
    jitter_fraction=st.floats(min_value=0.001, max_value=1.0),
    due_ms=st.integers(0, 10_000_000),
)
def test_interval_jitter_stays_inside_its_slot_and_is_deterministic(
    key: int | str, period: timedelta, jitter_fraction: float, due_ms: int
) -> None:
    jitter = max(MS, (period * jitter_fraction) // MS * MS)
    entry = new_entry(
        ReminderSpec(due=due_ms * MS, period=period, jitter=jitter),
        service_id="svc",
        grain_id=GrainId("Prop", key),
        name="j",
        now=NOW,
        options=OPTIONS,
    )
    slots = _walk(entry, 25)
    assert len(slots) == 25
    again = _walk(entry, 25)  # a fresh schedule: another silo, or after a restart
    assert again == slots
    schedule = schedule_for(entry)
    for k, slot in enumerate(slots):
        nominal = entry.start_at + k * period
        assert nominal <= slot < nominal + jitter
        assert slot < nominal + period  # never into the next slot
        assert schedule.nominal(slot) == nominal
    # A fresh schedule finds the first slot from start_at as registration did.
    assert schedule.next_after(entry.start_at - MS) == slots[0]


@settings(max_examples=60, deadline=None)
@given(
    key=keys,
    expr=st.sampled_from(CRONS),
    tz=st.sampled_from([None, "Europe/Berlin", "America/New_York"]),
    jitter_s=st.integers(1, 300),
)
def test_cron_jitter_keeps_the_slot_order_and_maps_back(
    key: int | str, expr: str, tz: str | None, jitter_s: int
) -> None:
    plain = new_entry(
        ReminderSpec(cron=expr, tz=tz),
        service_id="svc",
        grain_id=GrainId("Prop", key),
        name="c",
        now=NOW,
        options=OPTIONS,
    )
    try:
        jittered = new_entry(
            ReminderSpec(cron=expr, tz=tz, jitter=jitter_s),
            service_id="svc",
            grain_id=GrainId("Prop", key),
            name="c",
            now=NOW,
            options=OPTIONS,
        )
    except ReminderError as exc:
        assert "jitter" in str(exc)  # longer than the cron's smallest gap
        return
    nominal = _walk(plain, 12)
    slots = _walk(jittered, 12)
    schedule = schedule_for(jittered)
    assert len(slots) == 12
    for n, following, slot in zip(nominal, nominal[1:], slots, strict=False):
        assert n <= slot < following and slot - n < timedelta(seconds=jitter_s)
        assert schedule.nominal(slot) == n


@settings(max_examples=120, deadline=None)
@given(
    period=periods,
    starts_ms=st.one_of(st.none(), st.integers(0, 50_000_000)),
    span_ms=st.one_of(st.none(), st.integers(0, 80_000_000)),
    max_ticks=st.one_of(st.none(), st.integers(1, 60)),
    jitter_fraction=st.one_of(st.none(), st.floats(min_value=0.01, max_value=1.0)),
)
def test_interval_bounds_are_never_crossed(
    period: timedelta,
    starts_ms: int | None,
    span_ms: int | None,
    max_ticks: int | None,
    jitter_fraction: float | None,
) -> None:
    starts = None if starts_ms is None else NOW + starts_ms * MS
    ends = None if span_ms is None else (starts or NOW) + span_ms * MS
    jitter = None if jitter_fraction is None else max(MS, (period * jitter_fraction) // MS * MS)
    try:
        entry = new_entry(
            ReminderSpec(
                due=0,
                period=period,
                starts_at=starts,
                ends_at=ends,
                max_ticks=max_ticks,
                jitter=jitter,
            ),
            service_id="svc",
            grain_id=GrainId("Prop", "b"),
            name="b",
            now=NOW,
            options=OPTIONS,
        )
    except ReminderError as exc:
        assert "no slot" in str(exc)  # the bounds leave no slot at all
        assert ends is not None
        return
    slots = _walk(entry, 80)
    schedule = schedule_for(entry)
    nominal = [schedule.nominal(s) for s in slots]
    first = entry.start_at if starts is None else max(starts, entry.start_at)
    expected = []
    t = entry.start_at
    while len(expected) < 80 and (ends is None or t <= ends):
        if t >= first:
            expected.append(t)
        t += period
    if max_ticks is not None:
        expected = expected[:max_ticks]
    assert nominal == expected
    for slot in slots:
        assert starts is None or slot >= starts
        assert ends is None or slot <= ends
    assert max_ticks is None or len(slots) <= max_ticks


@settings(max_examples=50, deadline=None)
@given(
    expr=st.sampled_from(CRONS),
    tz=st.sampled_from([None, "Europe/Berlin"]),
    span_h=st.integers(0, 96),
    max_ticks=st.one_of(st.none(), st.integers(1, 40)),
)
def test_cron_bounds_are_never_crossed(
    expr: str, tz: str | None, span_h: int, max_ticks: int | None
) -> None:
    ends = NOW + timedelta(hours=span_h)
    plain = new_entry(
        ReminderSpec(cron=expr, tz=tz),
        service_id="svc",
        grain_id=GrainId("Prop", "c"),
        name="c",
        now=NOW,
        options=OPTIONS,
    )
    try:
        bounded = new_entry(
            ReminderSpec(cron=expr, tz=tz, ends_at=ends, max_ticks=max_ticks),
            service_id="svc",
            grain_id=GrainId("Prop", "c"),
            name="c",
            now=NOW,
            options=OPTIONS,
        )
    except ReminderError as exc:
        assert "no slot" in str(exc)
        assert plain.next_due > ends
        return
    every = [s for s in _walk(plain, 120) if s <= ends]
    slots = _walk(bounded, 120)
    assert slots == every[: max_ticks or len(every)]
