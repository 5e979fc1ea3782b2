"""The worked examples of docs/reminders.md for the catch-up window, overlapping
ticks and tick deadlines run as written: each class is built from the page, its
``start`` registers in an embedded silo on a manual clock, and the rows hold what
the comments say (the sync's ticks carry their deadline)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from orleanspy import MissedReminderAction, OverlapPolicy, RetryPolicy, Silo, SiloOptions
from orleanspy import grain as grain_module
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock

DOC = (Path(__file__).resolve().parents[2] / "docs" / "reminders.md").read_text()


def _example(heading: str) -> str:
    start = DOC.index(f"## {heading}\n")
    block = DOC.index("```python\n", start) + len("```python\n")
    return DOC[block : DOC.index("```\n", block)]


@pytest.fixture
def classes() -> Iterator[dict[str, type[Any]]]:
    found: dict[str, type[Any]] = {}
    for heading, name in (
        ("Missed ticks: grace, catch-up window and action", "MeterGrain"),
        ("Overlapping ticks", "CrawlerGrain"),
        ("Tick deadlines", "SyncGrain"),
    ):
        namespace: dict[str, Any] = {"__name__": "readme_depth"}
        exec(compile(_example(heading), f"docs/reminders.md ({heading})", "exec"), namespace)
        found[name] = namespace[name]
    try:
        yield found
    finally:
        for name in found:
            grain_module._registry.pop(name, None)


async def test_the_depth_examples_run_as_written(classes: dict[str, type[Any]]) -> None:
    seen: list[Any] = []

    async def receive(self: Any, name: str, status: Any) -> None:
        seen.append(status)

    classes["SyncGrain"].receive_reminder = receive
    clock = ManualClock()
    options = SiloOptions(
        grain_types=tuple(classes.values()), reminders=ReminderOptions(adaptive=False)
    )
    async with Silo.local(options, clock=clock) as silo:
        for name, cls in classes.items():
            await silo.client.get_grain(cls, "k").start()
        mgmt = silo.client.reminders
        meter = await mgmt.get(GrainId("MeterGrain", "k"), "read-meter")
        assert (meter.action, meter.catchup_window) == (
            MissedReminderAction.FIRE_IMMEDIATELY,
            timedelta(hours=1),
        )
        crawl = await mgmt.get(GrainId("CrawlerGrain", "k"), "crawl")
        rebuild = await mgmt.get(GrainId("CrawlerGrain", "k"), "rebuild")
        assert (crawl.overlap, rebuild.overlap) == (
            OverlapPolicy.ALLOW_ALL,
            OverlapPolicy.CANCEL_OTHER,
        )
        sync = await mgmt.get(GrainId("SyncGrain", "k"), "sync")
        assert (sync.deadline, sync.retry) == (
            timedelta(seconds=30),
            RetryPolicy(2, 10 * timedelta(seconds=1)),
        )
        await clock.settle()
        await clock.advance(timedelta(minutes=15))
        await wait_for(lambda: seen, 5, interval=0)
        assert seen[0].deadline == timedelta(seconds=30)  # "status.deadline: 0:00:30"
