"""What tracing costs, and what it costs when it is off: local grain calls/s and
reminder ticks/s of an embedded silo, in four modes measured in the same run.

Run: ``python -m benchmarks.bench_tracing_overhead [--rounds 5] [--seconds 1.5]
[--base PATH]``.

The measurements are ``bench_metrics_overhead``'s (no metrics port): 100
concurrent callers each calling its own grain as fast as they can, and
``--reminders`` rows all due at once on 50 reentrant grains with a 1 s period.
The tick measure is judged per CPU-second; its rows get a 10-minute missed-tick
grace, so a tick a loaded machine reaches late is still delivered (and counted)
rather than skipped, and 2,000 rows (the default here) keep even a traced silo
near its pace on a 2-core machine. Each
measurement runs in a fresh process, so a tracer provider or an import never
leaks from one mode into the next:

- ``no-extra``: this checkout with ``opentelemetry`` made unimportable (the
  ``orleanspy[otel]`` extra not installed);
- ``off``: this checkout, ``opentelemetry-api`` installed, no tracer provider
  set (the API's default, which records nothing): orleanspy does not trace;
- ``on``: this checkout with an SDK ``TracerProvider`` (every span sampled)
  whose ``BatchSpanProcessor`` hands the spans to an exporter that drops them:
  the cost of making and ending spans, without any network;
- ``base`` (with ``--base PATH``, a checkout of the commit before tracing, e.g.
  a git worktree of main): the same measurements on code without any tracing
  hook at all, the reference for "zero cost".

Rounds run the modes in turn, the order rotated every round, after one
discarded warm-up round; medians are reported, per second of wall time and per
second of the child's CPU time (the one to judge by on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks._util import loop_name, print_report

ROOT = Path(__file__).resolve().parents[1]

# What a child runs: the measurements of bench_metrics_overhead, which every
# checkout since the metrics have, in the mode asked for.
_CHILD = r"""
import asyncio, json, sys
mode, seconds, reminders = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
if mode == "no-extra":
    for name in ("opentelemetry", "opentelemetry.trace", "opentelemetry.context"):
        sys.modules[name] = None
if mode == "on":
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        spans = 0
        def export(self, spans):
            Drop.spans += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=65536))
    from orleanspy import tracing
    tracing.use(provider)
import functools
from datetime import timedelta
from benchmarks import bench_metrics_overhead
from benchmarks._util import run
from benchmarks.bench_metrics_overhead import calls_per_s, ticks_per_s
# A loaded machine then delays ticks instead of skipping them as missed (uncounted).
bench_metrics_overhead.ReminderOptions = functools.partial(
    bench_metrics_overhead.ReminderOptions, missed_tick_grace=timedelta(minutes=10))

async def main():
    calls = await calls_per_s(False, seconds)
    ticks = await ticks_per_s(False, reminders, seconds)
    return calls, ticks

(calls, ticks) = run(main())
spans = 0
if mode == "on":
    provider.force_flush()
    spans = Drop.spans
traced = None
if mode != "base":
    from orleanspy import tracing
    traced = tracing.active() is not None
print(json.dumps({"calls": calls[:2], "ticks": ticks[:2], "spans": spans, "traced": traced}))
"""


def measure(mode: str, seconds: float, reminders: int, base: Path | None) -> dict[str, Any]:
    """One child process of ``mode``; its rates."""
    tree = base if mode == "base" else ROOT
    assert tree is not None
    # No bytecode written into the base checkout, which is not ours to change.
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(seconds), str(reminders)],
        cwd=tree, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{mode} child failed:\n{out.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if mode in ("off", "no-extra") and doc["traced"]:
        raise RuntimeError(f"{mode}: the child traced")
    if mode == "on" and not (doc["traced"] and doc["spans"]):
        raise RuntimeError("on: the child made no spans")
    return doc


def main(rounds: int, seconds: float, reminders: int, base: Path | None) -> list[dict[str, Any]]:
    modes = ["no-extra", "off", "on"] + (["base"] if base is not None else [])
    found: dict[tuple[str, str, int], list[float]] = {}
    spans: dict[str, int] = {}
    for r in range(rounds + 1):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for mode in order:
            doc = measure(mode, seconds, reminders, base)
            if r == 0:
                continue  # warm-up round: disk caches, first imports
            spans[mode] = doc["spans"]
            for what in ("calls", "ticks"):
                for i in (0, 1):
                    found.setdefault((what, mode, i), []).append(doc[what][i])
    rows = []
    for what in ("calls", "ticks"):
        reference = "base" if base is not None else "no-extra"
        ref_cpu = statistics.median(found[(what, reference, 1)])
        for mode in modes:
            cpu = statistics.median(found[(what, mode, 1)])
            rows.append(
                {
                    "measure": "local grain calls" if what == "calls" else "reminder ticks",
                    "mode": mode,
                    "per_wall_s": round(statistics.median(found[(what, mode, 0)])),
                    "per_cpu_s": round(cpu),
                    "cpu_us_per_op": round(1e6 / cpu, 1),
                    "cpu_runs": [round(x) for x in found[(what, mode, 1)]],
                    f"vs_{reference}": f"{cpu / ref_cpu:.3f}x",
                    "spans_exported": spans.get(mode, 0),
                }
            )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--reminders", type=int, default=2000)
    parser.add_argument(
        "--base", type=Path, default=None,
        help="a checkout of the commit before tracing (e.g. a git worktree of main)",
    )  # fmt: skip
    args = parser.parse_args()
    result = main(args.rounds, args.seconds, args.reminders, args.base)
    reference = "base" if args.base is not None else "no-extra"
    print_report(
        "tracing_overhead",
        result,
        [
            "measure",
            "mode",
            "per_wall_s",
            "per_cpu_s",
            "cpu_us_per_op",
            f"vs_{reference}",
            "spans_exported",
        ],
        loop=loop_name(),
        rounds=args.rounds,
        seconds=args.seconds,
        reminders=args.reminders,
    )
