"""Run every benchmark in turn: ``python -m benchmarks`` (or ``make bench``).

Each module prints its own JSON and table, beside a baseline measured in the
same run. ``python -m benchmarks NAME ...`` runs only the named ones.
"""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = [
    "bench_local_calls",
    "bench_transport",
    "bench_cluster_calls",
    "bench_reminder_startup",
    "bench_reminder_register",
    "bench_reminder_history",
    "bench_reminder_counters",
    "bench_reminder_ticks",
    "bench_reminder_memory",
    "bench_reminder_cluster",
    "bench_reminder_overload",
    "bench_herd_restart",
    "bench_reminder_jitter",
    "bench_grain_state",
    "bench_metrics_overhead",
    "bench_tracing_overhead",
    "bench_dashboard_cost",
    "bench_dashboard_search",
]


def main(argv: list[str]) -> int:
    chosen = argv or BENCHMARKS
    failed = 0
    for name in chosen:
        print(f"\n=== {name} ===", flush=True)
        code = subprocess.call([sys.executable, "-m", f"benchmarks.{name}"])
        failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
