"""From status records to what the pages draw: rates, lateness quantiles, series.

Silos publish cumulative counters (``orleanspy.runtime.status``). ``Series``
takes cluster statuses as the sampler reads them; for each silo whose record
changed it keeps the deltas over that record's interval (per second), and each
ingest appends one point: the sum of the silos' latest interval rates, and the
lateness quantiles of their latest interval's histogram deltas. Memory is
bounded: ``keep`` points, one interval per silo.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orleanspy.cluster_status import ClusterStatus
from orleanspy.metrics import LATENESS_BUCKETS

__all__ = ["Series", "quantile_ms"]


def quantile_ms(counts: list[float], q: float) -> float | None:
    """The ``q`` quantile in ms of a lateness histogram (``LATENESS_BUCKETS`` counts
    plus the overflow slot), linear inside the bucket; ``None`` when empty."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    lower = 0.0
    for i, n in enumerate(counts):
        upper = LATENESS_BUCKETS[i] if i < len(LATENESS_BUCKETS) else LATENESS_BUCKETS[-1]
        if n > 0 and seen + n >= rank:
            share = (rank - seen) / n
            return round(1000 * (lower + (upper - lower) * share), 3)
        seen += n
        lower = upper
    return round(1000 * LATENESS_BUCKETS[-1], 3)


def _dict(rec: Mapping[str, object], key: str) -> dict[str, Any]:
    value = rec.get(key)
    return value if isinstance(value, dict) else {}


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


@dataclass
class _Interval:
    """One silo's deltas over its last record interval, per second (histograms: counts)."""

    ticks: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    missed: dict[str, float] = field(default_factory=dict)
    lateness: dict[str, list[float]] = field(default_factory=dict)
    calls: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)


def _delta_map(new: dict[str, Any], old: dict[str, Any], dt: float) -> dict[str, float]:
    return {k: max(0.0, _num(v) - _num(old.get(k))) / dt for k, v in new.items()}


def _interval(new: Mapping[str, object], old: Mapping[str, object], dt: float) -> _Interval:
    out = _Interval(
        ticks=_delta_map(_dict(new, "ticks"), _dict(old, "ticks"), dt),
        errors=_delta_map(_dict(new, "tick_errors"), _dict(old, "tick_errors"), dt),
        missed=_delta_map(_dict(new, "missed"), _dict(old, "missed"), dt),
    )
    old_late = _dict(old, "lateness")
    for prio, counts in _dict(new, "lateness").items():
        before = old_late.get(prio) or []
        if isinstance(counts, list):
            out.lateness[prio] = [
                max(0.0, _num(c) - (_num(before[i]) if i < len(before) else 0.0))
                for i, c in enumerate(counts)
            ]
    old_calls = _dict(old, "calls")
    for grain_type, methods in _dict(new, "calls").items():
        if not isinstance(methods, dict):
            continue
        before_methods = old_calls.get(grain_type) or {}
        for method, pair in methods.items():
            prev = before_methods.get(method) or [0, 0]
            if isinstance(pair, list) and len(pair) == 2 and isinstance(prev, list):
                out.calls[(grain_type, method)] = (
                    max(0.0, _num(pair[0]) - _num(prev[0])) / dt,
                    max(0.0, _num(pair[1]) - _num(prev[1] if len(prev) > 1 else 0)) / dt,
                )
    return out


class Series:
    """Points over time, from the statuses given to ``ingest``."""

    def __init__(self, keep: int = 300) -> None:
        self.points: deque[dict[str, Any]] = deque(maxlen=keep)
        self._prev: dict[str, Mapping[str, object]] = {}
        self._last: dict[str, _Interval] = {}

    def ingest(self, status: ClusterStatus) -> None:
        live = set()
        for silo in status.silos:
            rec = silo.record
            if not rec:
                continue
            live.add(silo.address)
            prev = self._prev.get(silo.address)
            at, before = _num(rec.get("updated_ms")), _num((prev or {}).get("updated_ms"))
            if prev is not None and at > before:
                self._last[silo.address] = _interval(rec, prev, (at - before) / 1000)
            if prev is None or at > before:
                self._prev[silo.address] = rec
        for gone in set(self._prev) - live:
            self._prev.pop(gone, None)
            self._last.pop(gone, None)
        self.points.append(self._point())

    def _point(self) -> dict[str, Any]:
        ticks: dict[str, float] = {}
        missed: dict[str, float] = {}
        errors = 0.0
        late: dict[str, list[float]] = {}
        for iv in self._last.values():
            for k, v in iv.ticks.items():
                ticks[k] = ticks.get(k, 0.0) + v
            for k, v in iv.missed.items():
                missed[k] = missed.get(k, 0.0) + v
            errors += sum(iv.errors.values())
            for prio, counts in iv.lateness.items():
                acc = late.setdefault(prio, [0.0] * len(counts))
                for i, c in enumerate(counts[: len(acc)]):
                    acc[i] += c
        return {
            "t": round(time.time(), 3),
            "ticks_per_s": round(sum(ticks.values()), 2),
            "ticks_by_priority": {k: round(v, 2) for k, v in ticks.items()},
            "tick_errors_per_s": round(errors, 2),
            "missed_per_s": {k: round(v, 3) for k, v in missed.items()},
            "lateness_ms": {
                prio: {"p50": quantile_ms(c, 0.5), "p99": quantile_ms(c, 0.99)}
                for prio, c in late.items()
            },
        }

    def call_rates(self) -> list[dict[str, Any]]:
        """Calls and errors per second by grain type and method, over the silos'
        latest intervals, busiest first."""
        sums: dict[tuple[str, str], list[float]] = {}
        for iv in self._last.values():
            for key, (calls, errs) in iv.calls.items():
                acc = sums.setdefault(key, [0.0, 0.0])
                acc[0] += calls
                acc[1] += errs
        ordered = sorted(sums.items(), key=lambda kv: (-kv[1][0], kv[0]))
        return [
            {"grain_type": t, "method": m, "calls_per_s": round(c, 2), "errors_per_s": round(e, 2)}
            for (t, m), (c, e) in ordered
        ]
