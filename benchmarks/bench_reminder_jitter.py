"""A herd on one cron second, with and without jitter.

Run: ``python -m benchmarks.bench_reminder_jitter [--reminders 10000] [--jitter 5]
[--rounds 1]``

``N`` reminders share one cron expression that fires at one second of the hour
(a few seconds after the run starts), each on its own grain, in an embedded
silo with the in-memory table (persistence on, into memory). The baseline run
registers them without jitter, so every tick falls due in the same
millisecond; the jitter run registers them with ``jitter=J`` seconds. Each run
counts the ticks delivered, the largest number received in one 100 ms bucket,
when the ticks were received relative to the nominal second (p1/p50/p99), and
the service's lateness, receipt minus the instant the tick was due (the
jittered instant, ``TickStatus.due_at``; the nominal slot without jitter).
Both runs must deliver all ``N`` ticks; jitter spreads them over ``[0, J)``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks._util import loop_name, print_report, reset_collector, run
from orleanspy import Grain, Remindable, ReminderOptions, Silo, SiloOptions, TickStatus
from orleanspy.identity import GrainId
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.testing import wait_for

TYPE = "bench_reminder_jitter.Herd"
#: (nominal slot, due instant, receipt) per tick, epoch seconds.
RECEIVED: list[tuple[float, float, float]] = []
LEAD_S = 4.0


class HerdGrain(Grain, Remindable, type_name=TYPE):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        assert status.due_at is not None
        RECEIVED.append(
            (status.current_tick_time.timestamp(), status.due_at.timestamp(), time.time())
        )


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return (float("nan"),) * 3
    q = statistics.quantiles(values, n=100, method="inclusive")
    return q[0], q[49], q[98]


async def herd(n: int, jitter_s: float) -> dict[str, Any]:
    RECEIVED.clear()
    service_id = "bench-jitter"
    table = InMemoryReminderTable(service_id)
    options = SiloOptions(
        grain_types=(HerdGrain,),
        collection_age=timedelta(hours=1),
        reminders=ReminderOptions(
            look_ahead=timedelta(seconds=30),
            poll_interval=timedelta(seconds=10),
            base_bucket_size=2 * n,
            adaptive=False,
        ),
    )
    now = datetime.now(UTC)
    slot = (now + timedelta(seconds=LEAD_S + 1)).replace(microsecond=0)
    cron = f"{slot.second} {slot.minute} * * * *"  # once an hour, at that second
    reset_collector()  # the silo tunes it again as it starts
    async with Silo.local(options, reminder_table=table) as silo:
        rows = [
            new_entry(
                ReminderSpec(cron=cron, jitter=jitter_s or None),
                service_id=service_id,
                grain_id=GrainId(TYPE, i),
                name="herd",
                now=now,
                options=options.reminders,
            )
            for i in range(n)
        ]
        await table.upsert_many(rows)
        assert silo.reminder_service is not None
        await silo.reminder_service.refill_now()
        await wait_for(lambda: len(RECEIVED) >= n, LEAD_S + jitter_s + 60, interval=0.1)
    t0 = slot.timestamp()
    received = [r - t0 for _, _, r in RECEIVED]
    lateness_ms = [(r - due) * 1000 for _, due, r in RECEIVED]
    buckets = Counter(int(r * 10) for r in received)
    p1, p50, p99 = _quantiles(received)
    _, late50, late99 = _quantiles(lateness_ms)
    return {
        "kind": f"jitter {jitter_s:g} s" if jitter_s else "no jitter (baseline)",
        "reminders": n,
        "delivered": len(RECEIVED),
        "on_nominal_slot": sum(1 for nominal, _, _ in RECEIVED if nominal == t0),
        "peak_per_100ms": max(buckets.values()),
        "received_p1_s": round(p1, 3),
        "received_p50_s": round(p50, 3),
        "received_p99_s": round(p99, 3),
        "lateness_p50_ms": round(late50, 1),
        "lateness_p99_ms": round(late99, 1),
    }


def main(n: int, jitter_s: float, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for _ in range(rounds):
        rows.append(run(herd(n, 0.0)))
        rows.append(run(herd(n, jitter_s)))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reminders", type=int, default=10_000)
    parser.add_argument("--jitter", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=1)
    ns = parser.parse_args()
    result = main(ns.reminders, ns.jitter, ns.rounds)
    print_report(
        "bench_reminder_jitter",
        result,
        [
            "kind",
            "reminders",
            "delivered",
            "on_nominal_slot",
            "peak_per_100ms",
            "received_p1_s",
            "received_p50_s",
            "received_p99_s",
            "lateness_p50_ms",
            "lateness_p99_ms",
        ],
        loop=loop_name(),
    )
