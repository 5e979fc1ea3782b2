"""A smoke test of an installed orleanspy, run by ``.ci/wheel`` from a venv outside
the checkout: the version the metadata names, what the wheel must carry, and an
embedded silo whose reminder ticks. Exits non-zero with the reason on failure."""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
from datetime import timedelta
from pathlib import Path

import orleanspy
from orleanspy import Grain, Remindable, ReminderOptions, Silo, SiloOptions, TickStatus

TICKS: list[TickStatus] = []


class SmokeGrain(Grain, Remindable):
    async def start(self) -> None:
        await self.register_or_update_reminder(
            "smoke", due=timedelta(milliseconds=100), period=timedelta(milliseconds=200)
        )

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append(status)


def check_install() -> tuple[str, Path]:
    """The installed version and where it lives, after checking what it carries."""
    here = Path(orleanspy.__file__).resolve().parent
    assert "site-packages" in str(here), f"orleanspy imported from {here}, not an install"
    version = importlib.metadata.version("orleanspy")
    assert version == orleanspy.__version__ != "0.1.0", (version, orleanspy.__version__)
    for carried in ("py.typed", "messaging/protos/orleanspy/v1/messages.proto",
                    "dashboard/static/app.js"):  # fmt: skip
        assert (here / carried).is_file(), f"the wheel lacks {carried}"
    return version, here


async def main(version: str, here: Path) -> None:
    options = SiloOptions(reminders=ReminderOptions(minimum_period=timedelta(milliseconds=100)))
    async with Silo.local(options) as silo:
        await silo.client.get_grain(SmokeGrain, "a").start()
        async with asyncio.timeout(10):
            while len(TICKS) < 3:
                await asyncio.sleep(0.05)
    slots = [t.current_tick_time for t in TICKS[:3]]
    assert slots == sorted(slots) and len(set(slots)) == 3, slots
    print(f"orleanspy {version} from {here}: an embedded silo ticked {len(TICKS)} times")


if __name__ == "__main__":
    try:
        asyncio.run(main(*check_install()))
    except AssertionError as exc:
        sys.exit(f"wheel smoke test failed: {exc}")
