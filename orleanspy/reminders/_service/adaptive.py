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


def default_load() -> LoadSignals:
    """Signals a service uses when the silo gives none: the host's cores and memory,
    and no activation count (the grain factor is then 1)."""
    return LoadSignals(
        cpu_count=os.cpu_count() or 1, memory_load=read_memory_load(), active_grains=0
    )
