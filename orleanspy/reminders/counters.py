"""Per-reminder counters: what became of a reminder's slots since its row was made.

Every tick outcome the reminder service decides is counted for its row:
delivered, failed (an attempt whose ``receive_reminder`` raised; those cut at
their deadline are also counted apart), dead-lettered, deduplicated (a state
had committed the occurrence), and slots skipped, by reason (``SkipReason``).
The last error (``Type: message``) and when it happened are kept too.

Counters belong to the row, like its fire history: a registration that
replaces the row's schedule keeps them, removing the row (unregistering,
deleting, its schedule ending) drops them. They are best effort: an increment
is not compare-and-swap, and one lost with a failed write is not retried
forever (a write whose outcome is unknown may count twice). The service sends
them in batches, with the schedule writes it makes anyway (``CounterDelta``
per row; one round trip per batch, never one per tick).

A table that keeps them is a ``CountingReminderTable`` (optional; the memory,
Redis and PostgreSQL tables are). ``ReminderCounters`` is what a read gives.
Storage codes (Redis hash fields, the memory table's keys) are ``COUNT_CODES``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Final, Protocol, runtime_checkable

from orleanspy.clock import from_ms, to_ms
from orleanspy.identity import GrainId
from orleanspy.reminders.model import SkipReason, error_text
from orleanspy.serialization import register_type

__all__ = [
    "COUNTS",
    "COUNT_CODES",
    "SKIPPED",
    "CounterDelta",
    "CountingReminderTable",
    "ReminderCounters",
    "counters_from_record",
    "counters_record",
]

#: The counters, in the order of a ``CounterDelta``'s vector and of the
#: PostgreSQL columns.
COUNTS: Final = (
    "delivered",
    "failed",
    "deadline_exceeded",
    "dead_lettered",
    "deduplicated",
    "skipped_paused",
    "skipped_overlap",
    "skipped_calendar",
    "skipped_catchup_window",
    "skipped_late",
)
#: Each counter's storage code, in ``COUNTS`` order.
COUNT_CODES: Final = ("d", "f", "x", "l", "q", "sp", "so", "sc", "sw", "sl")
#: The index in ``COUNTS`` of each skip reason's counter.
SKIPPED: Final = {reason: COUNTS.index(f"skipped_{reason.value}") for reason in SkipReason}
#: The longest last-error text kept.
MAX_LAST_ERROR: Final = 500

DELIVERED, FAILED, DEADLINE_EXCEEDED, DEAD_LETTERED, DEDUPLICATED = range(5)


@dataclass(frozen=True, slots=True)
class ReminderCounters:
    """A reminder's counters (module docstring): all zero for a row that has
    none yet (or a table that keeps none)."""

    delivered: int = 0
    failed: int = 0
    deadline_exceeded: int = 0
    dead_lettered: int = 0
    deduplicated: int = 0
    skipped_paused: int = 0
    skipped_overlap: int = 0
    skipped_calendar: int = 0
    skipped_catchup_window: int = 0
    skipped_late: int = 0
    last_error: str | None = None
    last_error_at: datetime | None = None

    def skipped(self, reason: SkipReason | None = None) -> int:
        """Slots skipped for ``reason``, or for any reason (``None``)."""
        if reason is not None:
            return int(getattr(self, f"skipped_{SkipReason(reason).value}"))
        return sum(getattr(self, f"skipped_{r.value}") for r in SkipReason)

    @classmethod
    def from_counts(
        cls, counts: Sequence[int], last_error: str | None, last_error_at: datetime | None
    ) -> ReminderCounters:
        """From the values in ``COUNTS`` order."""
        c = [int(n) for n in counts]
        if len(c) != len(COUNTS):
            raise ValueError(f"{len(COUNTS)} counts expected, got {len(c)}")
        return cls(
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], last_error, last_error_at
        )

    def counts(self) -> tuple[int, ...]:
        """The values in ``COUNTS`` order."""
        return tuple(int(getattr(self, name)) for name in COUNTS)


register_type(ReminderCounters, name="orleanspy.ReminderCounters")
assert tuple(f.name for f in fields(ReminderCounters))[: len(COUNTS)] == COUNTS


class CounterDelta:
    """What to add to one row's counters: a vector in ``COUNTS`` order, and the
    last error seen (it replaces the stored one when set). Mutable: the
    service adds a tick's outcomes to the row's pending delta in place."""

    __slots__ = ("counts", "grain_id", "last_error", "last_error_at", "name")

    def __init__(self, grain_id: GrainId, name: str) -> None:
        self.grain_id = grain_id
        self.name = name
        self.counts = [0] * len(COUNTS)
        self.last_error: str | None = None
        self.last_error_at: datetime | None = None

    def add(self, index: int, n: int = 1) -> None:
        self.counts[index] += n

    def error(self, exc: BaseException, at: datetime) -> None:
        """Remember ``exc`` as the row's last error (``Type: message``)."""
        self.last_error = error_text(exc)[:MAX_LAST_ERROR]
        self.last_error_at = at

    def merge(self, other: CounterDelta) -> None:
        """Add ``other`` (of the same row, newer) into this one."""
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        if other.last_error is not None:
            self.last_error, self.last_error_at = other.last_error, other.last_error_at

    def __bool__(self) -> bool:
        return self.last_error is not None or any(self.counts)

    def __repr__(self) -> str:
        shown = {k: n for k, n in zip(COUNTS, self.counts, strict=True) if n}
        return f"CounterDelta({self.grain_id}, {self.name!r}, {shown}, {self.last_error!r})"


@runtime_checkable
class CountingReminderTable(Protocol):
    """A reminder table that keeps per-row counters (optional; module docstring)."""

    async def add_counts(self, deltas: Sequence[CounterDelta]) -> None:
        """Add each delta to its row's counters (several deltas of one row add
        up; a delta's last error replaces the stored one); deltas of rows that
        do not exist are dropped. One round trip (Redis: one script call, per
        node on a cluster). Not compare-and-swap, not published."""
        ...

    async def read_counts(self, grain_id: GrainId, name: str) -> ReminderCounters:
        """The row's counters (all zero when it has none, or there is no row)."""
        ...


def counters_record(counters: ReminderCounters) -> dict[str, Any]:
    """``counters`` in storage form: the non-zero counts by code, ``e``/``t``
    the last error and its time (ms)."""
    rec: dict[str, Any] = {
        code: n for code, n in zip(COUNT_CODES, counters.counts(), strict=True) if n
    }
    if counters.last_error is not None:
        rec["e"] = counters.last_error
    if counters.last_error_at is not None:
        rec["t"] = to_ms(counters.last_error_at)
    return rec


def counters_from_record(rec: dict[str, Any]) -> ReminderCounters:
    """Inverse of ``counters_record`` (values may be bytes or text, as Redis gives them)."""

    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    counts = [int(text(rec[c])) if c in rec else 0 for c in COUNT_CODES]
    error = rec.get("e")
    at = rec.get("t")
    return ReminderCounters.from_counts(
        counts,
        None if error is None else text(error),
        None if at is None else from_ms(int(text(at))),
    )
