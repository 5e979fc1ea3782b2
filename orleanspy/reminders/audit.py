"""The operator audit log: who did what to which reminder row, when, and how it went.

Every management action (pause, resume, trigger, set-*, repair, delete,
delete-where, import, and those added later: backfill, replay, calendar
changes, limits) goes through one choke point, ``remindable.audit.Auditor``,
which writes an ``AuditRecord`` into the cluster's store beside the reminder
rows. This module is the storage side: the record, the query, the retention,
and the table contract (``AuditedReminderTable``).

**Together or not at all.** A record that describes a row write is written by
the same atomic store operation as the write itself: on Redis one Lua script
over the row's shard, whose keys (the rows, the due index, the shard's audit
hash and time index) share the shard's hash tag, so a Redis Cluster runs it on
one node; on PostgreSQL one statement (a data-modifying ``WITH`` whose insert
reads the rows the update or delete returned), hence one transaction; in memory
one synchronous step of the event loop. A lost race writes neither. A store
error before the operation answered leaves either both or neither (the
caller's error says it may have happened; reading shows which). An action
whose effect is not a row write (a trigger delivers a tick; a batch touches
many rows) is recorded first, ``PENDING``, and the action runs only once that
record is stored; its outcome then replaces it (``settle_audit``). If that
last write fails the record stays ``PENDING``: the action may or may not have
completed, and the log says so rather than nothing.

**Principals** come from what a transport authenticated, never from a message:
``tls:<subject>`` (a gateway client's certificate), ``cluster-secret`` (a
gateway client that proved the secret), ``anonymous`` (a gateway without
either), ``dashboard:<token name>`` (the dashboard served by a silo),
``local`` (code in a silo, and the CLI working on the store directly).

**Retention** is bounded: ``AuditRetention(max_age, max_records)``
(``ReminderOptions.audit_retention`` / ``audit_max_records``). Records older
than ``max_age`` before a new record's time are dropped by the next write that
appends one; beyond ``max_records`` the oldest go (Redis: per shard, at most
``ceil(max_records / shards)``; PostgreSQL: the count is checked every
``AUDIT_TRIM_EVERY`` appends of a table instance, so at most
``AUDIT_COUNT_SLACK`` more are kept meanwhile; memory: on every append).
Reads through the management grain and the CLI see no record older than
``max_age`` either way (``ReminderOperations.audit_log`` bounds the query).
"""

from __future__ import annotations

import enum
import itertools
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Protocol, runtime_checkable

from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.table import ReminderTable
from orleanspy.serialization import register_type

__all__ = [
    "AUDIT_COUNT_SLACK",
    "LOCAL",
    "MAX_AUDIT_QUERY",
    "MAX_DETAIL",
    "AuditAction",
    "AuditOutcome",
    "AuditQuery",
    "AuditRecord",
    "AuditRetention",
    "AuditedReminderTable",
    "MemoryAuditLog",
    "acting_as",
    "acting_principal",
    "new_audit_id",
    "newest_first",
    "row_json",
]

#: The principal of code running in a silo, and of the CLI on the store itself.
LOCAL: Final = "local"
#: The most records one query returns.
MAX_AUDIT_QUERY: Final = 10_000
#: Records a table may keep beyond ``max_records`` (it trims in batches).
AUDIT_COUNT_SLACK: Final = 64
#: The longest ``detail`` text a record keeps.
MAX_DETAIL: Final = 2000
_MAX_PRINCIPAL: Final = 300

acting_principal: ContextVar[str | None] = ContextVar("orleanspy_acting_principal", default=None)
"""Who the management calls made in this context act for (``None``: ``LOCAL``).
Set by the runtime from an authenticated source only: a gateway's transport,
the dashboard's token check (``acting_as``)."""


@contextmanager
def acting_as(principal: str) -> Iterator[None]:
    """Management calls made inside act for ``principal`` (the dashboard, around
    an action its token check allowed)."""
    token = acting_principal.set(principal)
    try:
        yield
    finally:
        acting_principal.reset(token)


_sequence = itertools.count()


def new_audit_id() -> str:
    """A fresh record id: 32 hex digits, the wall clock's ms, a counter of this
    process and random digits, so that records made in one millisecond by one
    process sort in the order they were made (the log orders by time, then id)."""
    return f"{time.time_ns() // 1_000_000:012x}{next(_sequence) % 0x1000000:06x}" + (
        os.urandom(7).hex()
    )


class AuditAction(enum.StrEnum):
    """The actions this release audits (a record's ``action`` is a string, so an
    action added later needs no change here)."""

    PAUSE = "pause"
    RESUME = "resume"
    TRIGGER = "trigger"
    SET_PRIORITY = "set_priority"
    SET_ACTION = "set_action"
    SET_GRACE = "set_grace"
    REPAIR = "repair"
    DELETE = "delete"
    DELETE_WHERE = "delete_where"
    PAUSE_WHERE = "pause_where"
    RESUME_WHERE = "resume_where"
    SET_CALENDAR = "set_calendar"
    DELETE_CALENDAR = "delete_calendar"
    BACKFILL = "backfill"
    CANCEL_BACKFILL = "cancel_backfill"
    IMPORT = "import"
    REPLAY = "replay"
    DISCARD = "discard"


class AuditOutcome(enum.StrEnum):
    """How an audited action went."""

    OK = "ok"  #: done: the row was written (or the batch, the trigger ran)
    UNCHANGED = "unchanged"  #: nothing to do: the row already was so (pause of a paused row)
    ABSENT = "absent"  #: no such row (a delete of a row that was not there)
    PENDING = "pending"  #: recorded before the action; no outcome could be written after it
    FAILED = "failed"  #: ran and failed (the trigger's grain raised; a batch stopped)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audited action (or, for a batch, one row it wrote).

    ``before``/``after``: the row as read before and as written (``None``: absent,
    removed); ``detail``: the action's arguments or counts as short JSON text;
    ``batch``: the id of the batch's own record, on the records of the rows a
    batch wrote; ``via``: where the action ran (a silo's name, ``cli``).
    """

    id: str
    at: datetime
    principal: str
    action: str
    outcome: AuditOutcome
    grain_id: GrainId | None = None
    name: str | None = None
    before: ReminderEntry | None = None
    after: ReminderEntry | None = None
    detail: str | None = None
    batch: str | None = None
    via: str | None = None

    def __post_init__(self) -> None:
        if type(self.action) is not str:  # an AuditAction: stored and compared as its text
            object.__setattr__(self, "action", str(self.action))
        # A string arrives where the enum left (the codec carries its value).
        if type(self.outcome) is not AuditOutcome:
            try:
                outcome = AuditOutcome(self.outcome)
            except ValueError:
                outcome = AuditOutcome.FAILED
            object.__setattr__(self, "outcome", outcome)

    def to_record(self) -> dict[str, Any]:
        """Storage form (msgpack types; rows as ``ReminderEntry.to_record``)."""
        rec: dict[str, Any] = {
            "i": self.id,
            "t": to_ms(self.at),
            "p": self.principal,
            "a": self.action,
            "o": str(self.outcome),
        }
        if self.grain_id is not None:
            rec["g"] = self.grain_id.canonical
        for key, value in (("n", self.name), ("d", self.detail), ("k", self.batch)):
            if value is not None:
                rec[key] = value
        if self.via is not None:
            rec["v"] = self.via
        if self.before is not None:
            rec["b"] = self.before.to_record()
        if self.after is not None:
            rec["f"] = self.after.to_record()
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> AuditRecord:
        """Inverse of ``to_record``; an outcome this release does not know reads as
        ``FAILED`` (never an error: the log is read by older tools too)."""
        grain = rec.get("g")
        before, after = rec.get("b"), rec.get("f")
        try:
            outcome = AuditOutcome(str(rec.get("o")))
        except ValueError:
            outcome = AuditOutcome.FAILED
        return cls(
            id=str(rec["i"]),
            at=from_ms(int(rec["t"])),
            principal=str(rec["p"]),
            action=str(rec["a"]),
            outcome=outcome,
            grain_id=None if grain is None else GrainId.parse(grain),
            name=rec.get("n"),
            before=None if before is None else ReminderEntry.from_record(before),
            after=None if after is None else ReminderEntry.from_record(after),
            detail=rec.get("d"),
            batch=rec.get("k"),
            via=rec.get("v"),
        )

    def settled(self, outcome: AuditOutcome, detail: str | None = None) -> AuditRecord:
        """This record with its outcome (and detail, when given): what
        ``settle_audit`` stores in place of a pending one."""
        return AuditRecord(
            self.id, self.at, self.principal, self.action, outcome, self.grain_id,
            self.name, self.before, self.after,
            self.detail if detail is None else detail, self.batch, self.via,
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """For ``orleanspy audit --json`` and the dashboard: times ISO 8601, rows
        as ``row_json``."""
        return {
            "id": self.id,
            "at": self.at.isoformat(),
            "principal": self.principal,
            "action": self.action,
            "outcome": str(self.outcome),
            "grain": None if self.grain_id is None else str(self.grain_id),
            "reminder": self.name,
            "detail": None if self.detail is None else _json_or_text(self.detail),
            "batch": self.batch,
            "via": self.via,
            "before": None if self.before is None else row_json(self.before),
            "after": None if self.after is None else row_json(self.after),
        }


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def row_json(row: ReminderEntry) -> dict[str, Any]:
    """A row's fields an operator reads in an audit record, JSON types only."""

    def iso(t: datetime | None) -> str | None:
        return None if t is None else t.isoformat()

    def seconds(d: timedelta | None) -> float | None:
        return None if d is None else d.total_seconds()

    doc: dict[str, Any] = {
        "start_at": iso(row.start_at),
        "next_due": iso(row.next_due),
        "last_fire": iso(row.last_fire),
        "period_s": seconds(row.period),
        "cron": row.cron,
        "tz": row.tz,
        "priority": int(row.priority),
        "action": row.action.name.lower(),
        "paused": row.paused,
        "grace_s": seconds(row.grace),
        "declared": row.declared,
    }
    optional = {
        "jitter_s": seconds(row.jitter),
        "starts_at": iso(row.starts_at),
        "ends_at": iso(row.ends_at),
        "max_ticks": row.max_ticks,
    }
    doc.update({k: v for k, v in optional.items() if v is not None})
    return doc


@dataclass(frozen=True, slots=True)
class AuditRetention:
    """How long and how many records the log keeps (module docstring)."""

    max_age: timedelta
    max_records: int

    def __post_init__(self) -> None:
        if not isinstance(self.max_age, timedelta) or self.max_age <= timedelta(0):
            raise ReminderError(f"audit max_age must be a positive timedelta, got {self.max_age!r}")
        if (
            isinstance(self.max_records, bool)
            or not isinstance(self.max_records, int)
            or (self.max_records < 1)
        ):
            raise ReminderError(f"audit max_records must be an int >= 1, got {self.max_records!r}")

    def per_shard(self, shards: int) -> int:
        """The records one of ``shards`` shards keeps (Redis)."""
        return max(1, math.ceil(self.max_records / shards))

    def cutoff_ms(self, at: datetime) -> int:
        """Records before this (ms) are past ``max_age`` as of ``at``."""
        return to_ms(at - self.max_age)


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Which records to read: of one grain (and reminder ``name``), one
    ``principal``, one ``action``, in ``[since, until]``; newest first, at most
    ``limit`` (1..``MAX_AUDIT_QUERY``)."""

    grain_id: GrainId | None = None
    name: str | None = None
    principal: str | None = None
    action: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 100

    def __post_init__(self) -> None:
        if self.name is not None and self.grain_id is None:
            raise ReminderError("an audit query for a reminder name needs its grain too")
        if (
            isinstance(self.limit, bool)
            or not isinstance(self.limit, int)
            or not (1 <= self.limit <= MAX_AUDIT_QUERY)
        ):
            raise ReminderError(f"an audit query returns 1..{MAX_AUDIT_QUERY} records")
        for what, at in (("since", self.since), ("until", self.until)):
            if at is not None and (not isinstance(at, datetime) or at.tzinfo is None):
                raise ReminderError(f"audit query {what}: a timezone-aware datetime")
        if self.principal is not None and len(self.principal) > _MAX_PRINCIPAL:
            raise ReminderError(f"an audit principal has at most {_MAX_PRINCIPAL} characters")

    @property
    def since_ms(self) -> int | None:
        return None if self.since is None else to_ms(self.since)

    @property
    def until_ms(self) -> int | None:
        return None if self.until is None else to_ms(self.until)

    def matches(self, rec: AuditRecord) -> bool:
        """Whether ``rec`` is one this query asks for (all but ``limit``)."""
        if self.grain_id is not None and rec.grain_id != self.grain_id:
            return False
        if self.name is not None and rec.name != self.name:
            return False
        if self.principal is not None and rec.principal != self.principal:
            return False
        if self.action is not None and rec.action != self.action:
            return False
        at = to_ms(rec.at)
        if self.since is not None and at < to_ms(self.since):
            return False
        return self.until is None or at <= to_ms(self.until)


def newest_first(records: Sequence[AuditRecord], limit: int) -> list[AuditRecord]:
    """``records`` in the log's order (time descending, then id descending), the
    first ``limit``."""
    return sorted(records, key=lambda r: (to_ms(r.at), r.id), reverse=True)[:limit]


@runtime_checkable
class AuditedReminderTable(ReminderTable, Protocol):
    """A reminder table that keeps the audit log beside its rows (module docstring).

    ``record`` arguments are written as given (their ``after`` need not carry
    the new etag). Each write that appends a record also applies ``retention``
    as of the record's time: records before ``max_age`` ago are dropped (at
    least those in the same part of the store: a Redis shard), and at most
    ``max_records + AUDIT_COUNT_SLACK`` are kept, the newest (a store in N parts
    that each trim their own keeps at most ``ceil(max_records / N) +
    AUDIT_COUNT_SLACK`` per part). Records are read newest first: time
    descending, ties by id descending.
    """

    async def upsert_if_audited(
        self,
        entry: ReminderEntry,
        expected_etag: str | None,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> str | None:
        """``upsert_if``, and append ``record`` in the same atomic operation: the
        new etag, or ``None`` when the condition did not hold (then neither the
        row nor the record is written, and nothing is published)."""
        ...

    async def remove_audited(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> bool:
        """``remove``, and append ``record`` in the same atomic operation; ``False``
        (nothing removed, nothing appended) when the row is gone or moved on."""
        ...

    async def append_audit(self, record: AuditRecord, retention: AuditRetention) -> None:
        """Append ``record`` on its own (an action whose effect is not one row write)."""
        ...

    async def settle_audit(self, record: AuditRecord) -> bool:
        """Replace the stored record with ``record``'s id by ``record`` (a pending
        record by its outcome); ``False`` if it is no longer stored (trimmed)."""
        ...

    async def read_audit(self, query: AuditQuery) -> list[AuditRecord]:
        """The records ``query`` selects, newest first, at most ``query.limit``."""
        ...


class MemoryAuditLog:
    """The log of an in-process table: records by id, trimmed exactly."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: dict[str, AuditRecord] = {}

    def append(self, record: AuditRecord, retention: AuditRetention) -> None:
        """Keep ``record``; drop from the oldest appended while past ``max_age``
        or beyond ``max_records`` (appends come in time order: one clock)."""
        records = self._records
        records[record.id] = record
        cutoff = retention.cutoff_ms(record.at)
        while len(records) > 1:
            oldest = next(iter(records.values()))
            if len(records) <= retention.max_records and to_ms(oldest.at) >= cutoff:
                break
            del records[oldest.id]

    def settle(self, record: AuditRecord) -> bool:
        if record.id not in self._records:
            return False
        self._records[record.id] = record
        return True

    def read(self, query: AuditQuery) -> list[AuditRecord]:
        return newest_first([r for r in self._records.values() if query.matches(r)], query.limit)


register_type(AuditRecord, name="orleanspy.AuditRecord")
register_type(AuditQuery, name="orleanspy.AuditQuery")
