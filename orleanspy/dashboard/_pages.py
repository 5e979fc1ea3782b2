"""The JSON each page draws, from the cluster's status and the series.

Pure functions: no I/O, every string passes through as data (the browser puts
it into the page with ``textContent``, never as markup).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orleanspy.cluster_status import ClusterStatus
from orleanspy.dashboard._series import Series
from orleanspy.dashboard._words import describe, next_slots
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.counters import ReminderCounters
from orleanspy.reminders.letters import DeadLetter
from orleanspy.reminders.model import FireRecord, ReminderEntry

__all__ = [
    "cluster_page",
    "grains_page",
    "letter_summary",
    "reminder_detail",
    "row_summary",
    "timeliness_page",
]

_MAX_EVENTS = 200


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def cluster_page(status: ClusterStatus) -> dict[str, Any]:
    doc = status.to_json()
    doc["events"] = doc["events"][-_MAX_EVENTS:]  # type: ignore[index]
    return doc


def grains_page(status: ClusterStatus, series: Series) -> dict[str, Any]:
    types: dict[str, dict[str, int]] = {}
    totals: dict[tuple[str, str], list[int]] = {}
    silos = []
    for silo in status.silos:
        if silo.status != "active":
            continue
        silos.append(silo.name)
        by_type = silo.record.get("activations_by_type")
        if isinstance(by_type, dict):
            for t, n in by_type.items():
                if isinstance(n, int):
                    types.setdefault(str(t), {})[silo.name] = n
        calls = silo.record.get("calls")
        if isinstance(calls, dict):
            for t, methods in calls.items():
                if not isinstance(methods, dict):
                    continue
                for m, pair in methods.items():
                    if isinstance(pair, list) and len(pair) == 2:
                        acc = totals.setdefault((str(t), str(m)), [0, 0])
                        acc[0] += int(pair[0])
                        acc[1] += int(pair[1])
    rates = {(r["grain_type"], r["method"]): r for r in series.call_rates()}
    calls_out = []
    for (t, m), (n, e) in sorted(totals.items()):
        r = rates.get((t, m), {})
        calls_out.append({"grain_type": t, "method": m, "calls": n, "errors": e,
                          "calls_per_s": r.get("calls_per_s", 0.0),
                          "errors_per_s": r.get("errors_per_s", 0.0)})  # fmt: skip
    calls_out.sort(key=lambda r: (-float(r["calls_per_s"]), -int(r["calls"])))
    return {
        "silos": silos,
        "activations": [
            {"grain_type": t, "by_silo": per, "total": sum(per.values())}
            for t, per in sorted(types.items())
        ],
        "calls": calls_out,
    }


def timeliness_page(status: ClusterStatus, series: Series) -> dict[str, Any]:
    causes: dict[str, int] = {}
    missed: dict[str, int] = {}
    for silo in status.silos:
        for key, target in (("causes", causes), ("missed", missed)):
            values = silo.record.get(key)
            if isinstance(values, dict):
                for k, v in values.items():
                    if isinstance(v, int):
                        target[str(k)] = target.get(str(k), 0) + v
    return {"points": list(series.points), "missed_total": missed, "causes_total": causes}


def row_summary(row: ReminderEntry, orphaned: bool) -> dict[str, Any]:
    return {
        "grain": row.grain_id.canonical,
        "grain_text": str(row.grain_id),
        "grain_type": row.grain_id.type_name,
        "name": row.name,
        "schedule": describe(row),
        "next_due": _iso(row.next_due),
        "last_fire": _iso(row.last_fire),
        "priority": int(row.priority),
        "action": row.action.name.lower(),
        "paused": row.paused,
        "declared": row.declared,
        "orphaned": orphaned,
        "labels": row.labels or {},
        "calendar": row.calendar,
        "on_excluded": None if row.on_excluded is None else row.on_excluded.name.lower(),
    }


def letter_summary(letter: DeadLetter) -> dict[str, Any]:
    """A dead letter for the dead letters page (the traceback included: the
    detail shows it)."""
    return {
        "id": letter.id,
        "grain": letter.grain_id.canonical,
        "grain_text": str(letter.grain_id),
        "name": letter.name,
        "slot": _iso(letter.slot),
        "at": _iso(letter.at),
        "attempts": letter.attempts,
        "error_type": letter.error_type,
        "message": letter.message,
        "traceback": letter.traceback,
        "silo": letter.silo,
        "final": letter.final,
    }


def _fire(rec: FireRecord) -> dict[str, Any]:
    error = getattr(rec, "error", None)
    return {
        "slot": _iso(rec.slot),
        "at": _iso(rec.at),
        "lateness_ms": round(rec.lateness.total_seconds() * 1000, 1),
        "outcome": str(rec.outcome.value),
        "silo": rec.silo,
        "triggered": rec.triggered,
        "backfill": rec.backfill,
        "error": None if error is None else str(error)[:2000],
    }


def backfill_summary(job: BackfillJob | None) -> dict[str, Any] | None:
    """A running backfill's progress for the reminder page."""
    if job is None:
        return None
    return {
        "from": _iso(job.start),
        "to": _iso(job.end),
        "next": _iso(job.next),
        "total": job.total,
        "delivered": job.delivered,
        "failed": job.failed,
        "overlap": job.overlap,
    }


def reminder_detail(
    row: ReminderEntry,
    history: list[FireRecord],
    orphaned: bool,
    backfill: BackfillJob | None = None,
    counters: ReminderCounters | None = None,
) -> dict[str, Any]:
    """A reminder as the dashboard's detail shows it: the row, its next fire times
    (``describe``'s), its history, backfill and counters."""
    doc = row_summary(row, orphaned)
    doc.update(
        start_at=_iso(row.start_at),
        cron=row.cron,
        tz=row.tz,
        period_seconds=None if row.period is None else row.period.total_seconds(),
        next_slots=[_iso(t) for t in next_slots(row)],
        history=[_fire(r) for r in history],
        backfill=backfill_summary(backfill),
        counters=None if counters is None else _counters(counters),
    )
    return doc


def _counters(c: ReminderCounters) -> dict[str, Any]:
    return {
        "delivered": c.delivered, "failed": c.failed, "deadline_exceeded": c.deadline_exceeded,
        "dead_lettered": c.dead_lettered, "deduplicated": c.deduplicated,
        "skipped": c.skipped(), "skipped_paused": c.skipped_paused,
        "skipped_overlap": c.skipped_overlap, "skipped_calendar": c.skipped_calendar,
        "skipped_catchup_window": c.skipped_catchup_window, "skipped_late": c.skipped_late,
        "last_error": c.last_error, "last_error_at": _iso(c.last_error_at),
    }  # fmt: skip
