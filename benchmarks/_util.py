"""Small helpers shared by the benchmarks: an event loop, a report printer, a
server-process launcher. Generic on purpose; nothing here knows a benchmark."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import subprocess
import sys
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

__all__ = ["launch", "loop_name", "print_report", "ratio", "reset_collector", "run"]

_T = TypeVar("_T")


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run`` on uvloop when it is installed (the loop a silo uses),
    unless ``ORLEANSPY_BENCH_LOOP=asyncio`` is set."""
    if loop_name() == "asyncio":
        return asyncio.run(main)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def reset_collector() -> None:
    """Python's default garbage-collector settings, nothing frozen, no garbage: a
    silo run tunes the collector for the whole process (``SiloOptions.tune_gc``),
    and each run of a benchmark should start from the same place."""
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    gc.collect()


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: what ``run`` will use, for the report."""
    if os.environ.get("ORLEANSPY_BENCH_LOOP") == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def ratio(value: float, baseline: float) -> str:
    """``value / baseline`` as ``"0.42x"`` (``"-"`` without a baseline)."""
    if not baseline:
        return "-"
    return f"{value / baseline:.2f}x"


def print_report(
    name: str, rows: Sequence[dict[str, Any]], columns: Sequence[str], **meta: Any
) -> None:
    """Print ``{"benchmark": name, **meta, "rows": rows}`` as one JSON line,
    then the rows as an aligned table of ``columns`` (floats rounded)."""
    print(json.dumps({"benchmark": name, **meta, "rows": list(rows)}))

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
        return str(value)

    table = [list(columns)] + [[cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    print()
    for i, r in enumerate(table):
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


@contextlib.contextmanager
def launch(args: Sequence[str], *, ready_prefix: str = "READY ") -> Iterator[str]:
    """Start ``python <args>`` and wait for a stdout line starting with
    ``ready_prefix``; yield the rest of that line (e.g. the port it bound).

    The child's stdin is a pipe closed on exit, so a child that serves until
    stdin ends stops by itself; it is killed if it has not after 5 s.
    """
    proc = subprocess.Popen(
        [sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(ready_prefix):
                yield line[len(ready_prefix) :].strip()
                break
        else:
            raise RuntimeError(f"{' '.join(args)} exited before it was ready")
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
