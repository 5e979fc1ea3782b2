"""The status record a silo publishes (``orleanspy.cluster_status``): what
``orleanspy cluster status`` and the dashboard show of it beyond its membership row.

Counters are cumulative since the silo started; readers turn two records into
rates. Everything here is bounded: grain types and methods are the hosted
classes' public ones, priorities -128..127, actions three.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from orleanspy.metrics import RecordingGrainMetrics, RecordingReminderMetrics
from orleanspy.versions import __version__

if TYPE_CHECKING:
    from orleanspy.runtime.ops_http import LoopHeartbeat
    from orleanspy.runtime.readings import SiloReadings

__all__ = ["StatusRecorder"]


class StatusRecorder:
    """``record()`` reads one silo (its ``SiloReadings``); the CPU share is the
    process's CPU time over the wall time since the previous call."""

    def __init__(self, silo: SiloReadings, heartbeat: LoopHeartbeat | None = None) -> None:
        self._silo = silo
        self._heartbeat = heartbeat
        self._last = (time.monotonic(), time.process_time())

    def _cpu_percent(self) -> float:
        wall, cpu = time.monotonic(), time.process_time()
        last_wall, last_cpu = self._last
        self._last = (wall, cpu)
        span = wall - last_wall
        return round(100.0 * (cpu - last_cpu) / span, 1) if span > 0 else 0.0

    def record(self) -> dict[str, object]:
        silo = self._silo
        st = silo.reminder_stats
        rec: dict[str, object] = {
            "version": __version__,
            "pid": os.getpid(),
            "cpu_percent": self._cpu_percent(),
            "loop_lag": None if self._heartbeat is None else round(self._heartbeat.lag, 4),
            "activations": silo.activation_count,
            "reminders_held": 0 if st is None else st.resident,
            # Read by the other silos' orphan checks (``published_types``).
            "grain_types": sorted(silo.hosted_types),
            "orphaned_rows": silo.orphaned_rows,
        }
        by_type = silo.activations_by_type()
        if by_type is not None:
            rec["activations_by_type"] = by_type
        grains = silo.metrics.grains
        if isinstance(grains, RecordingGrainMetrics):
            calls: dict[str, dict[str, list[int]]] = {}
            for (grain_type, method), counts in grains.by_method.items():
                calls.setdefault(grain_type, {})[method] = list(counts)
            rec["calls"] = calls
        rem = silo.metrics.reminders
        if isinstance(rem, RecordingReminderMetrics):
            rec["ticks"] = dict(rem.ticks)
            rec["tick_errors"] = dict(rem.grain_errors)
            rec["lateness"] = {p: list(h.counts) for p, h in rem.lateness.items()}
            rec["missed"] = dict(rem.missed_by_action)
        if st is not None:
            rec["causes"] = {
                "skipped": st.skipped,
                "notified": st.notified,
                "repaired": st.repaired,
                "retries": st.retries,
                "evicted": st.evicted,
                "table_read_errors": st.load_errors,
                "persist_failures": st.persist_failures,
                "cas_conflicts": st.cas_conflicts,
            }
        return rec
