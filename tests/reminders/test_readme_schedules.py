"""The "Schedules" example of docs/reminders.md (the README links to it) runs as
written: in an embedded silo on a manual clock, the one-shot fires once with its
payload and goes, the bounded reminder stops after ten ticks, and the declared
jittered row holds its options."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orleanspy import Silo, SiloOptions
from orleanspy import grain as grain_module
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock

DOC = (Path(__file__).resolve().parents[2] / "docs" / "reminders.md").read_text()
START = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def _example() -> str:
    start = DOC.index("## Schedules")
    block = DOC.index("```python\n", start) + len("```python\n")
    return DOC[block : DOC.index("```\n", block)]


@pytest.fixture
def order_grain() -> Iterator[type[Any]]:
    namespace: dict[str, Any] = {"__name__": "readme_schedules"}
    exec(compile(_example(), "docs/reminders.md (Schedules)", "exec"), namespace)
    try:
        yield namespace["OrderGrain"]
    finally:
        grain_module._registry.pop("OrderGrain", None)


async def test_the_schedules_example_runs_as_written(order_grain: type[Any]) -> None:
    mails: list[int] = []

    async def send_mail(self: Any, order: int) -> None:
        mails.append(order)

    order_grain.send_mail = send_mail
    clock = ManualClock(START)
    # Twelve days of virtual time: slow polls, so the run wakes a few hundred times.
    reminders = ReminderOptions(
        adaptive=False,
        look_ahead=timedelta(hours=4),
        poll_interval=timedelta(hours=1),
        repair_interval=timedelta(hours=1),
    )
    options = SiloOptions(grain_types=(order_grain,), reminders=reminders)
    async with Silo.local(options, clock=clock) as silo:
        gid = GrainId("OrderGrain", "")
        [declared] = await silo.client.reminders.list_for_grain(gid)
        assert declared.name == "nightly-export" and declared.jitter == timedelta(minutes=10)
        assert declared.retry is not None and declared.retry.max_attempts == 3

        order = silo.client.get_grain(order_grain, "o-1")
        await order.placed(7)
        rows = {r.name: r for r in await silo.client.reminders.list_for_grain(order.grain_id)}
        assert rows["pay-reminder"].one_shot and rows["pay-reminder"].payload == {"order": 7}
        assert rows["daily-digest"].max_ticks == 10

        for _ in range(12 * 6):  # twelve days, four hours at a time
            await clock.settle()
            await clock.advance(timedelta(hours=4))
        await wait_for(lambda: mails == [7], 5.0, interval=0.01)

        async def ended() -> bool:
            left = await silo.client.reminders.list_for_grain(order.grain_id)
            return left == []

        await wait_for(ended, 5.0, interval=0.01)
