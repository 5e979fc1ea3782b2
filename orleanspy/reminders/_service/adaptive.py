"""The adaptive bucket size: how many rows one silo keeps in its due window.

``bucket_size = base * max(1, cpu // 4) * max(0.25, 1 - memory_load)
* min(1.0, 50_000 / active_grains)`` (docs/architecture.md, section 2, step 3).
More cores buy a larger window; memory pressure and a crowded catalog shrink it, but never
below a quarter of ``base`` for memory. ``adapted_bucket_size`` applies it as the
options say, and keeps ``base`` when the signals cannot be read.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from orleanspy.options import ReminderOptions

__all__ = ["LoadSignals", "adapted_bucket_size", "bucket_size", "default_load", "read_memory_load"]

log = logging.getLogger(__name__)

GRAIN_BUDGET = 50_000
_MEMINFO = "/proc/meminfo"


@dataclass(frozen=True, slots=True)
class LoadSignals:
    """What the silo tells the service about its load.

    ``memory_load`` is the used fraction of memory in ``[0, 1]``;
    ``active_grains`` is the number of live activations (0 when unknown).
    """

    cpu_count: int
    memory_load: float
    active_grains: int


def bucket_size(base: int, signals: LoadSignals) -> int:
    """The window size for ``signals``; at least 1.

    >>> bucket_size(1024, LoadSignals(cpu_count=16, memory_load=0.6, active_grains=40_000))
    1638
    """
    cpu = max(1, signals.cpu_count // 4)
    memory = max(0.25, 1.0 - min(1.0, max(0.0, signals.memory_load)))
    grains = 1.0 if signals.active_grains <= 0 else min(1.0, GRAIN_BUDGET / signals.active_grains)
    return max(1, int(base * cpu * memory * grains))


def adapted_bucket_size(
    options: ReminderOptions, load: Callable[[], LoadSignals], name: str = ""
) -> int:
    """The bucket size to use now: ``options.base_bucket_size``, adapted to
    ``load()`` when ``options.adaptive``; the base when the signals fail (a
    sizing failure must not stop loading)."""
    base = options.base_bucket_size
    if not options.adaptive:
        return base
    try:
        return bucket_size(base, load())
    except Exception as exc:
        log.warning("load signals unavailable name=%s error=%r", name, exc)
        return base


def read_memory_load(path: str = _MEMINFO) -> float:
    """``1 - MemAvailable / MemTotal`` from ``/proc/meminfo``; 0.0 when unreadable."""
    fields: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    fields[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    total = fields.get("MemTotal", 0)
    if total <= 0 or "MemAvailable" not in fields:
        return 0.0
    return min(1.0, max(0.0, 1.0 - fields["MemAvailable"] / total))


# The host's memory load, read at most once per MEMORY_MAX_AGE_S of real time:
# refills can come many times a second (and, under a test's ManualClock, many
# times per wall-clock millisecond), while the load moves slowly.
MEMORY_MAX_AGE_S = 1.0
_memory: tuple[float, float] = (-MEMORY_MAX_AGE_S, 0.0)
_CPUS = os.cpu_count() or 1


def _recent_memory_load() -> float:
    global _memory
    read_at, load = _memory
    now = time.monotonic()
    if now - read_at >= MEMORY_MAX_AGE_S:
        load = read_memory_load()
        _memory = (now, load)
    return load


def default_load() -> LoadSignals:
    """Signals a service uses when the silo gives none: the host's cores and memory
    (at most a second old), and no activation count (the grain factor is then 1)."""
    return LoadSignals(cpu_count=_CPUS, memory_load=_recent_memory_load(), active_grains=0)
