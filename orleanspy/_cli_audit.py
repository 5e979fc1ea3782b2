"""``orleanspy audit``: the operator audit log, filtered, as a table or JSON.

Read through a gateway's management grain when a silo answers (what every
silo's reads are bounded by: ``ReminderOptions.audit_retention``), else from
the reminder table directly, like the reminder commands (``_cli_reminders``).
Times are ISO 8601 (``2026-12-01T09:00:00+00:00``; UTC when no offset is
given) or an age: ``90s``, ``15m``, ``2h``, ``7d`` ago.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from orleanspy.errors import ReminderError
from orleanspy.reminders.audit import MAX_AUDIT_QUERY, AuditQuery, AuditRecord

__all__ = ["add_arguments", "audit_table", "parse_when", "query_of", "run_audit"]

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])\Z")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The filters of ``orleanspy audit``."""
    p.add_argument("--grain", metavar="GRAIN",
                   help="only this grain's records, TYPE/KEY (no env)")  # fmt: skip
    p.add_argument("--name", metavar="NAME", help="only this reminder's (needs --grain; no env)")
    p.add_argument("--principal", metavar="WHO",
                   help="only actions of this principal, e.g. dashboard:ops, "
                   "tls:CN=ops, cluster-secret, local (no env)")  # fmt: skip
    p.add_argument(
        "--action",
        metavar="ACTION",
        help="only this action: pause, resume, trigger, set_priority, ... (no env)",
    )
    p.add_argument(
        "--since",
        metavar="WHEN",
        help="from this time: ISO 8601, or an age such as 2h, 7d (no env)",
    )
    p.add_argument("--until", metavar="WHEN", help="up to this time, as --since (no env)")
    p.add_argument("--limit", type=int, metavar="N", default=100,
                   help=f"at most this many records, newest first (1..{MAX_AUDIT_QUERY}; "
                   "default 100; no env)")  # fmt: skip


def parse_when(text: str, now: datetime) -> datetime:
    """An ISO 8601 time (UTC if it names no offset) or an age before ``now``;
    ``ValueError`` saying the forms otherwise."""
    age = _AGE.match(text.strip())
    if age is not None:
        return now - timedelta(seconds=float(age.group(1)) * _UNITS[age.group(2)])
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"not a time: {text!r}; write ISO 8601 (2026-12-01T09:00:00Z) or an age "
            "(90s, 15m, 2h, 7d)"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def query_of(args: argparse.Namespace, now: datetime) -> AuditQuery:
    """The query the flags ask for; ``ValueError`` (a usage error) for bad ones."""
    from orleanspy._cli_reminders import parse_grain_id

    grain = None if args.grain is None else parse_grain_id(args.grain)
    try:
        return AuditQuery(
            grain_id=grain,
            name=args.name,
            principal=args.principal,
            action=args.action,
            since=None if args.since is None else parse_when(args.since, now),
            until=None if args.until is None else parse_when(args.until, now),
            limit=args.limit,
        )
    except ReminderError as exc:
        raise ValueError(str(exc)) from None


async def run_audit(access: Any, query: AuditQuery, as_json: bool) -> int:
    """Print the records ``query`` selects (``access``: the reminder access of
    ``_cli_reminders.open_reminders``)."""
    records: list[AuditRecord] = list(await access.audit_log(query))
    if as_json:
        print(json.dumps([r.to_json() for r in records], indent=2, sort_keys=True))
    elif records:
        print(audit_table(records))
    else:
        print("no audit records match")
    return 0


def audit_table(records: Sequence[AuditRecord]) -> str:
    """Records as a text table, newest first."""
    headers = ("WHEN", "PRINCIPAL", "ACTION", "GRAIN", "REMINDER", "OUTCOME", "DETAIL")
    rows = [
        (
            r.at.isoformat(timespec="milliseconds"),
            r.principal,
            r.action,
            "-" if r.grain_id is None else str(r.grain_id),
            r.name or "-",
            str(r.outcome),
            (r.detail or "")[:60],
        )
        for r in records
    ]
    cells = [list(headers), *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )
