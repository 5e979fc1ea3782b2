"""What the ``orleanspy`` command prints: tables, a row in full, its history, the
cluster's status."""

from __future__ import annotations

import json
from collections.abc import Container, Sequence
from typing import Any

from orleanspy.reminders.model import FireRecord, ReminderEntry

__all__ = [
    "history_table",
    "print_json",
    "row_detail",
    "rows_table",
    "status_text",
    "table",
]


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def print_json(doc: object) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True))


def _schedule(row: ReminderEntry) -> str:
    if row.cron:
        text = f"cron {row.cron} {row.tz or 'UTC'}"
    elif row.period is not None:
        text = f"every {row.period}"
    else:
        text = f"once at {row.start_at:%Y-%m-%d %H:%M:%S}Z"
    if row.jitter is not None:
        text += f", jitter {row.jitter}"
    if row.starts_at is not None:
        text += f", from {row.starts_at:%Y-%m-%d %H:%M:%S}Z"
    if row.ends_at is not None:
        text += f", until {row.ends_at:%Y-%m-%d %H:%M:%S}Z"
    if row.max_ticks is not None:
        text += f", {row.max_ticks} ticks"
    if row.retry is not None:
        text += f", retry {row.retry.max_attempts}x/{row.retry.backoff}"
    return text


def _state(row: ReminderEntry, orphaned: bool = False) -> str:
    parts = ["paused" if row.paused else "active"]
    if row.declared:
        parts.append("declared")
    if orphaned:
        parts.append("orphaned")
    return ",".join(parts)


def rows_table(rows: Sequence[ReminderEntry], orphaned: Container[str] = ()) -> str:
    return table(
        ("NEXT DUE", "GRAIN", "NAME", "SCHEDULE", "PRIORITY", "ACTION", "STATE"),
        [
            (
                f"{r.next_due:%Y-%m-%d %H:%M:%S}Z",
                str(r.grain_id),
                r.name,
                _schedule(r),
                int(r.priority),
                r.action.name.lower(),
                _state(r, r.key in orphaned),
            )
            for r in rows
        ],
    )


_OPTIONAL = frozenset(
    {"one_shot", "jitter_seconds", "starts_at", "ends_at", "max_ticks", "final_due", "payload",
     "retry", "overlap", "catchup_window_seconds", "deadline_seconds", "resumed_at",
     "labels", "calendar", "on_excluded"}
)  # fmt: skip


def row_detail(row: ReminderEntry) -> str:
    from orleanspy._cli_reminders import entry_json

    # The optional schedule fields only when set: most rows have none of them.
    doc = {k: v for k, v in entry_json(row).items() if k not in _OPTIONAL or v not in (None, False)}
    width = max(len(k) for k in doc)
    return "\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in doc.items())


def history_table(history: Sequence[FireRecord]) -> str:
    return table(
        ("LAST FIRED SLOT", "AT", "LATENESS", "OUTCOME", "SILO", "ERROR"),
        [
            (
                f"{r.slot:%Y-%m-%d %H:%M:%S}Z",
                f"{r.at:%H:%M:%S.%f}"[:-3],
                f"{r.lateness.total_seconds() * 1000:.0f} ms",
                r.outcome.value
                + (f" (attempt {r.attempt})" if r.attempt > 1 else "")
                + (" (final)" if r.final else "")
                + (" (triggered)" if r.triggered else ""),
                r.silo,
                "" if r.error is None else r.error[:80],
            )
            for r in history
        ],
    )


def status_text(status: Any) -> str:
    head = (f"cluster {status.cluster_id!r} service {status.service_id!r} "
            f"(membership version {status.table_version}, feature level "
            f"{status.feature_level}, {status.ring} ring)")  # fmt: skip
    headers = ("NAME", "STATUS", "ADDRESS", "GATEWAY", "VERSION", "PROTOCOLS", "UPTIME", "RING",
               "ACTIVATIONS", "REMINDERS", "CPU", "HEARTBEAT")  # fmt: skip
    rows = [
        (s.name, s.status, s.address, s.gateway, s.version, s.protocols,
         _duration(s.uptime_seconds) if s.status == "active" else None,
         f"{s.ring_share:.1f}%", s.activations, s.reminders,
         None if s.cpu_percent is None else f"{s.cpu_percent:.0f}%",
         None if s.last_heartbeat is None else f"{s.last_heartbeat:%H:%M:%S}Z")
        for s in status.silos
    ]  # fmt: skip
    events = [
        f"  {e.at:%Y-%m-%d %H:%M:%S}Z  {e.kind:<9}  {e.name or e.silo}"
        + (f"  (vote by {e.by})" if e.by else "")
        for e in status.events[-10:]
    ]
    tail = "\n\nrecent membership events:\n" + "\n".join(events) if events else ""
    if status.orphaned_rows:
        tail += (f"\n\norphaned reminder rows: {status.orphaned_rows} (their grain types are "
                 "hosted by no silo: orleanspy reminders orphans)")  # fmt: skip
    return f"{head}\n{table(headers, rows)}{tail}"


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
