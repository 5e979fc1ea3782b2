"""A tour of the reminder service's scheduling depth, through the public API.

Each step does one thing a scheduler for serious work must do, prints what
happened and checks it (a failed check exits 1):

1. overlap policy: a tick that outlasts its period, with ``OverlapPolicy.SKIP``;
2. catch-up window: how far back a missed slot still gets its tick;
3. backfill: every slot of the last seconds delivered again, in order;
4. calendars: payday on the 25th at 09:00 Berlin time, on the previous business
   day when the 25th is a weekend day or a holiday;
5. dead letters: a tick that failed every retry is kept, then replayed;
6. describe: the next fire times and what became of every slot;
7. labels: count, pause and resume by ``tenant``;
8. tick deadlines: a tick that runs too long is cancelled and counted.

Run on the embedded default: ``python -m samples.scheduling``. On two silos over
Redis, with a client calling through their gateways as an operator's would:
``python -m samples.scheduling --redis redis://127.0.0.1:6379/0``.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar as weekdays
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from orleanspy import (
    Calendar,
    ClusterClient,
    ConfigurationError,
    Excluded,
    Grain,
    MessagingOptions,
    MissedReminderAction,
    OverlapPolicy,
    Remindable,
    ReminderError,
    ReminderOptions,
    RetryPolicy,
    Silo,
    SiloOptions,
    TickStatus,
    run,
)

BERLIN = ZoneInfo("Europe/Berlin")
S = timedelta(seconds=1)
# Ticks of a grain on another silo are waited for at least 10 s (not only their
# period): step 1's 2.5 s ticks of a 1 s reminder are slow, not lost (docs/reminders.md,
# "A long tick on a grain in another silo").
REMINDERS = ReminderOptions(
    minimum_period=S, retry_initial=timedelta(milliseconds=50), minimum_tick_timeout=10 * S
)
#: What the grains saw, by grain key: (reminder, slot, backfill).
SEEN: dict[str, list[tuple[str, datetime, bool]]] = {}
#: Grain keys whose ticks fail (the dead letters' step).
FAILING: set[str] = set()
T0 = time.monotonic()


def say(what: str) -> None:
    print(f"[{time.monotonic() - T0:5.1f}s] {what}", flush=True)


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"FAILED: {what}")


_ENUMS: dict[str, Any] = {
    "action": MissedReminderAction,
    "overlap": OverlapPolicy,
    "on_excluded": Excluded,
}


class TourGrain(Grain, Remindable):
    """Registers what the tour asks for, records every tick, and sleeps or fails
    its ticks when asked to (by reminder name: ``slow``, ``stuck``; by key)."""

    async def register(self, name: str, options: dict[str, Any]) -> None:
        # Enum arguments travel as their values (msgpack ints): named again here.
        for key, kind in _ENUMS.items():
            if key in options:
                options[key] = kind(options[key])
        await self.register_or_update_reminder(name, **options)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        SEEN.setdefault(str(self.grain_key), []).append(
            (name, status.current_tick_time, status.backfill)
        )
        if name == "slow":
            await asyncio.sleep(2.5)  # outlasts its 1 s period
        elif name == "stuck":
            await asyncio.sleep(30)  # its deadline cancels it
        if str(self.grain_key) in FAILING:
            raise RuntimeError("the payment API said no")


async def until(what: str, condition: Callable[[], Awaitable[bool]], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not await condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"FAILED: {what} (after {seconds:g} s)")
        await asyncio.sleep(0.2)


async def tour(client: Any) -> None:
    """The eight steps, through ``client`` (``silo.client`` or a ``ClusterClient``)."""
    mgmt = client.reminders
    tour_grain = client.get_grain(TourGrain, "tour")

    say("1. overlap policy: a 1 s reminder whose ticks take 2.5 s, overlap=SKIP")
    await tour_grain.register("slow", {"period": S, "overlap": OverlapPolicy.SKIP})

    async def overlapped() -> bool:
        return bool((await mgmt.describe(tour_grain, "slow")).counters.skipped_overlap >= 2)

    await until("slots skipped for overlap", overlapped)
    slow = await mgmt.describe(tour_grain, "slow")
    say(f"   delivered {slow.counters.delivered}, skipped for overlap "
        f"{slow.counters.skipped_overlap}: never two ticks of it at once")  # fmt: skip
    await mgmt.delete(tour_grain, "slow")
    try:
        await tour_grain.register("all", {"period": S, "overlap": OverlapPolicy.ALLOW_ALL})
    except ConfigurationError as exc:
        say(f"   ALLOW_ALL on a grain whose ticks cannot interleave is refused: {exc}"[:160])
    else:
        check(False, "ALLOW_ALL on a non-reentrant grain must be refused")

    say("2. catch-up window: FIRE_IMMEDIATELY catches up only slots within 10 minutes")
    await tour_grain.register("meter", {
        "period": timedelta(minutes=1), "action": MissedReminderAction.FIRE_IMMEDIATELY,
        "catchup_window": timedelta(minutes=10), "grace": timedelta(seconds=30),
    })  # fmt: skip
    meter = await mgmt.get(tour_grain, "meter")
    check(meter.catchup_window == timedelta(minutes=10), "the row keeps its catch-up window")
    try:
        await tour_grain.register("meter", {
            "period": timedelta(minutes=1), "action": MissedReminderAction.FIRE_IMMEDIATELY,
            "catchup_window": timedelta(seconds=10), "grace": timedelta(seconds=30),
        })  # fmt: skip
    except ReminderError as exc:
        say(f"   a window shorter than the grace is refused: {exc}"[:160])
    else:
        check(False, "a catch-up window shorter than the grace must be refused")

    say("3. backfill: the last 5 seconds of a 1 s reminder, delivered again in order")
    backfilled = client.get_grain(TourGrain, "backfilled")
    await backfilled.register("beat", {"period": S})
    end = datetime.now(UTC).replace(microsecond=0)
    job = await mgmt.backfill(backfilled, "beat", end - 5 * S, end)
    say(f"   asked for {job.total} slots")

    async def replayed() -> bool:
        return bool(sum(1 for _n, _s, b in SEEN.get("backfilled", []) if b) >= job.total)

    await until("every backfilled slot delivered", replayed)
    slots = [s for _n, s, b in SEEN["backfilled"] if b]
    check(slots == sorted(slots), "backfilled slots arrive in order")
    say(f"   delivered with TickStatus.backfill: {[s.strftime('%H:%M:%S') for s in slots]}")
    try:
        await mgmt.backfill(backfilled, "beat", end, end - 5 * S)
    except ReminderError as exc:
        say(f"   start >= end is refused: {exc}"[:160])
    else:
        check(False, "a backfill whose start is not before its end must be refused")

    say("4. calendars: payday 09:00 Berlin on the 25th, the previous business day if excluded")
    await mgmt.set_calendar("de-payroll", Calendar(
        tz="Europe/Berlin", exclude_weekdays=[weekdays.SATURDAY, weekdays.SUNDAY],
        exclude_dates=["2026-12-25"],
    ))  # fmt: skip
    payroll = client.get_grain(TourGrain, "payroll")
    await payroll.register("payday", {
        "cron": "0 0 9 25 * *", "tz": "Europe/Berlin", "calendar": "de-payroll",
        "on_excluded": Excluded.PREVIOUS_BUSINESS_DAY,
    })  # fmt: skip
    described = await mgmt.describe(
        payroll, "payday", count=5, after=datetime(2026, 12, 1, tzinfo=BERLIN)
    )
    fires = [f.at.astimezone(BERLIN) for f in described.next_fires]
    for f in fires:
        say(f"   fires {f:%a %Y-%m-%d %H:%M} {f.tzname()}")
    expected = [datetime(2026, 12, 24, 9, tzinfo=BERLIN), datetime(2027, 1, 25, 9, tzinfo=BERLIN),
                datetime(2027, 4, 23, 9, tzinfo=BERLIN)]  # fmt: skip
    check(all(e in fires for e in expected), f"payday fires on {expected}, got {fires}")
    try:
        await mgmt.delete_calendar("de-payroll")
    except ReminderError as exc:
        say(f"   deleting a calendar in use is refused: {exc}"[:160])
    else:
        check(False, "a calendar in use must not be deleted without force")
    try:
        await payroll.register("bonus", {"cron": "0 0 9 1 * *", "calendar": "nope"})
    except ReminderError as exc:
        say(f"   an unknown calendar is refused: {exc}"[:160])
    else:
        check(False, "an unknown calendar must be refused")

    say("5. dead letters: a tick that fails both attempts is kept, then replayed")
    FAILING.add("billing")
    billing = client.get_grain(TourGrain, "billing")
    await billing.register("charge", {"due": S, "retry": RetryPolicy(2, timedelta(seconds=0.2))})

    async def lettered() -> bool:
        return bool((await mgmt.dead_letters(billing, "charge")).letters)

    await until("a dead letter", lettered)
    [letter] = (await mgmt.dead_letters(billing, "charge")).letters
    say(f"   {letter.error_type}: {letter.message} after {letter.attempts} attempts")
    FAILING.discard("billing")  # the payment API is back
    await mgmt.replay(letter.id)
    check(not (await mgmt.dead_letters(billing, "charge")).letters, "a replayed letter goes")
    say(f"   replayed as its slot {letter.slot:%H:%M:%S} (occurrence {letter.id[:8]}...)")

    say("6. describe: the next fire times and what became of every slot")
    meter_d = await mgmt.describe(tour_grain, "meter", count=3)
    say(f"   meter fires next at {[f.at.strftime('%H:%M:%S') for f in meter_d.next_fires]}")
    beat_d = await mgmt.describe(backfilled, "beat")
    check(beat_d.counters.delivered > 0, "describe counts the deliveries")
    say(f"   beat: delivered {beat_d.counters.delivered}, skipped {beat_d.counters.skipped()}, "
        f"last error {beat_d.last_error}")  # fmt: skip

    say("7. labels: count, pause and resume the reminders of one tenant")
    for tenant, n in (("acme", 3), ("globex", 2)):
        for i in range(n):
            await client.get_grain(TourGrain, f"{tenant}-{i}").register(
                "invoice", {"period": timedelta(hours=1), "labels": {"tenant": tenant}}
            )
    acme = {"tenant": "acme"}
    check(await mgmt.count(labels=acme) == 3, "three reminders of tenant acme")
    paused = await mgmt.pause_where(labels=acme)
    globex = await mgmt.count(labels="tenant=globex")  # a selector as text works too
    say(f"   paused {paused} of tenant acme; globex still has {globex}")
    check(paused == 3, "pause_where pauses what the selector selects")
    check(await mgmt.resume_where(labels=acme) == 3, "resume_where resumes them")
    try:
        await mgmt.count(labels="tenantacme")
    except ReminderError as exc:
        say(f"   a selector with no '=' is refused: {exc}"[:160])
    else:
        check(False, "a label selector without '=' must be refused")

    say("8. tick deadlines: a tick that would run 30 s, with deadline=0.5 s")
    await tour_grain.register("stuck", {"due": S, "period": timedelta(minutes=1),
                                        "deadline": timedelta(seconds=0.5)})  # fmt: skip

    async def cut() -> bool:
        return bool((await mgmt.describe(tour_grain, "stuck")).counters.deadline_exceeded >= 1)

    await until("a tick cut at its deadline", cut)
    stuck = await mgmt.describe(tour_grain, "stuck")
    say(f"   cancelled and counted: deadline exceeded {stuck.counters.deadline_exceeded}, "
        f"last error {stuck.last_error}")  # fmt: skip
    say("done: every step checked")


@asynccontextmanager
async def two_silos(redis_url: str) -> AsyncIterator[ClusterClient]:
    """Two silos over ``redis_url`` in this process (each on its own gRPC ports),
    with a cluster secret, and a client calling through their gateways."""
    cluster = f"tour-{os.getpid()}"
    messaging = MessagingOptions(cluster_secret="tour-secret")
    async with AsyncExitStack() as stack:
        for i in range(2):
            options = SiloOptions(
                cluster_id=cluster, service_id=cluster, redis_url=redis_url, silo_port=0,
                gateway_port=0, messaging=messaging, reminders=REMINDERS, name=f"tour-{i}",
            )  # fmt: skip
            await stack.enter_async_context(Silo(options))
        client = await stack.enter_async_context(
            ClusterClient(redis_url, cluster_id=cluster, service_id=cluster, options=messaging)
        )
        yield client


async def main(redis_url: str | None) -> None:
    # The tour's failing ticks are on purpose: their warnings and tracebacks would
    # drown what it prints.
    logging.getLogger("orleanspy.reminders").setLevel(logging.ERROR)
    if redis_url is None:
        say("an embedded silo (one process, in-memory)")
        async with Silo.local(SiloOptions(reminders=REMINDERS)) as silo:
            await tour(silo.client)
    else:
        say(f"two silos over {redis_url}, a client through their gateways")
        async with two_silos(redis_url) as client:
            await tour(client)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", metavar="URL", help="run on two silos over this Redis")
    run(main(parser.parse_args().redis))
    sys.exit(0)
