"""``describe`` on an embedded silo with a manual clock: the next fire times with
a calendar's business-day shift, the counters since registration (delivered,
failed, last error, skipped while paused), the latest deliveries, a paused
row's empty future, and bad input; and ``orleanspy reminders describe`` on a
real silo process."""

from __future__ import annotations

import calendar as weekdays
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from orleanspy import (
    Calendar,
    Excluded,
    Grain,
    Remindable,
    ReminderEntry,
    ReminderError,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
)
from orleanspy.reminders.model import FireOutcome
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock

BERLIN = ZoneInfo("Europe/Berlin")
ROOT = Path(__file__).resolve().parents[2]
REMINDERS = ReminderOptions(
    base_bucket_size=64, permits=4, adaptive=False, minimum_period=timedelta(seconds=1)
)
FAIL: set[str] = set()


class DescribedGrain(Grain, Remindable, type_name="test_describe.Described"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        if name in FAIL:
            raise ValueError(f"{name} refused its tick")

    async def register(self, name: str, kwargs: dict[str, Any]) -> ReminderEntry:
        return await self.register_or_update_reminder(name, **kwargs)


def berlin(y: int, m: int, d: int, h: int = 0) -> datetime:
    return datetime(y, m, d, h, tzinfo=BERLIN)


async def test_describe_gives_the_next_fire_times_with_the_calendars_shift() -> None:
    """The issue's example: payday the 25th at 09:00 Berlin time, on the previous
    business day when the 25th is a weekend day or a holiday."""
    async with Silo.local(
        SiloOptions(reminders=REMINDERS), clock=ManualClock(berlin(2026, 12, 1))
    ) as silo:
        mgmt = silo.client.reminders
        holidays = Calendar(
            tz="Europe/Berlin", exclude_weekdays=[weekdays.SATURDAY, weekdays.SUNDAY],
            exclude_dates=["2026-12-25"],
        )  # fmt: skip
        await mgmt.set_calendar("de-payroll", holidays)
        grain = silo.client.get_grain(DescribedGrain, "pay")
        await grain.register("payday", {
            "cron": "0 0 9 25 * *", "tz": "Europe/Berlin", "calendar": "de-payroll",
            "on_excluded": Excluded.PREVIOUS_BUSINESS_DAY, "labels": {"team": "payroll"},
        })  # fmt: skip
        d = await mgmt.describe(grain, "payday", count=5)
        assert [f.at for f in d.next_fires] == [
            berlin(2026, 12, 24, 9), berlin(2027, 1, 25, 9), berlin(2027, 2, 25, 9),
            berlin(2027, 3, 25, 9), berlin(2027, 4, 23, 9),
        ]  # fmt: skip
        # Each fire time says which slot it stands for (the 25th, moved).
        assert d.next_fires[0].slot == berlin(2026, 12, 25, 9)
        assert d.next_fires[4].slot == berlin(2027, 4, 25, 9)
        assert d.row.calendar == "de-payroll" and d.row.labels == {"team": "payroll"}
        assert d.counters.delivered == 0 and d.recent == [] and d.backfill is None
        # After an instant of the caller's choice.
        later = await mgmt.describe(grain, "payday", count=1, after=berlin(2027, 3, 1))
        assert [f.at for f in later.next_fires] == [berlin(2027, 3, 25, 9)]


async def test_describe_counts_what_became_of_the_slots() -> None:
    FAIL.clear()
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    async with Silo.local(SiloOptions(reminders=REMINDERS), clock=clock) as silo:
        mgmt = silo.client.reminders
        grain = silo.client.get_grain(DescribedGrain, "c")
        await grain.register("beat", {"due": 1, "period": 1})
        await grain.register("bad", {"due": 1, "period": 1})
        FAIL.add("bad")

        async def counted() -> bool:
            await clock.advance(0.5)
            good = await mgmt.describe(grain, "beat")
            bad = await mgmt.describe(grain, "bad")
            return good.counters.delivered >= 3 and bad.counters.failed >= 2

        await wait_for(counted, 10)
        good = await mgmt.describe(grain, "beat", count=3)
        assert good.counters.failed == 0 and good.last_error is None
        assert good.recent and {r.outcome for r in good.recent} == {FireOutcome.OK}
        # The next fire times follow the grid from where the row stands.
        step = timedelta(seconds=1)
        assert [f.at - good.next_fires[0].at for f in good.next_fires] == [0 * step, step, 2 * step]
        bad = await mgmt.describe(grain, "bad")
        assert bad.last_error == "ValueError: bad refused its tick"
        assert bad.counters.dead_lettered == bad.counters.failed  # no retry policy: each one
        assert bad.dead_letters >= 1  # letters of one occurrence id are one letter each
        # A paused row fires at no time; what passes meanwhile counts as skipped while paused.
        await mgmt.pause(grain, "beat")
        assert (await mgmt.describe(grain, "beat")).next_fires == []
        await clock.advance(5)
        await mgmt.resume(grain, "beat")

        async def skipped() -> bool:
            await clock.advance(0.5)
            return (await mgmt.describe(grain, "beat")).counters.skipped_paused >= 1

        await wait_for(skipped, 10)


async def test_describe_refuses_bad_input_and_unknown_reminders() -> None:
    async with Silo.local(SiloOptions(reminders=REMINDERS)) as silo:
        mgmt = silo.client.reminders
        grain = silo.client.get_grain(DescribedGrain, "x")
        await grain.register("r", {"period": 60})
        with pytest.raises(ReminderError, match="no reminder 'nope'"):
            await mgmt.describe(grain, "nope")
        with pytest.raises(ReminderError, match="count must be"):
            await mgmt.describe(grain, "r", count=0)
        with pytest.raises(ReminderError, match="timezone-aware"):
            await mgmt.describe(grain, "r", after=datetime(2030, 1, 1))


@pytest.mark.slow
async def test_the_describe_command_on_a_real_silo(redis_url: str) -> None:
    from tests.ready import read_ready, stop_processes

    env = {**os.environ, "PYTHONPATH": str(ROOT), "ORLEANSPY_REDIS_URL": redis_url}
    env.pop("ORLEANSPY_CLUSTER_SECRET", None)
    silo = subprocess.Popen(
        [sys.executable, "-m", "orleanspy", "silo", "--import", "samples.operations",
         "--silo-port", "0", "--gateway-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        read_ready(silo, timeout=60)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "orleanspy", "reminders", *args],
                capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False,
            )  # fmt: skip

        ok = cli("describe", "ReportGrain/daily", "monthly", "--count", "3", "--json")
        assert ok.returncode == 0, ok.stderr
        doc = json.loads(ok.stdout)
        assert doc["row"]["name"] == "monthly" and len(doc["next_fires"]) == 3
        assert set(doc["counters"]) >= {"delivered", "failed", "skipped", "last_error"}
        text = cli("describe", "ReportGrain/daily", "monthly")
        assert text.returncode == 0 and "next fires" in text.stdout, text.stderr
        missing = cli("describe", "ReportGrain/daily", "nope")
        assert missing.returncode == 1 and "no reminder 'nope'" in missing.stderr
        assert "usage:" not in missing.stderr
    finally:
        stop_processes([silo], timeout=30)
        if silo.stdout is not None:
            silo.stdout.close()
