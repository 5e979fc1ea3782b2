"""The dashboard's reminder search: what it asks (``Query``), the order it answers
in (``Position``), cursors, and what a store answers for one part (``Part``);
``_reminder_reads`` has the order in words and ``_reminder_stores`` the readers."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Final

from orleanspy.clock import to_ms
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderEntry, row_key

__all__ = [
    "PAUSED_START",
    "SCHEDULED_START",
    "Page",
    "Part",
    "Position",
    "Query",
    "key_of",
    "parse_cursor",
    "take",
]

_MAX_CURSOR: Final = 4096


@dataclass(frozen=True, slots=True)
class Query:
    """A search. ``grain_type``: exact type ('' any); ``key_prefix``: the key's
    start (string keys; ``i:4`` or ``u:...`` for int and UUID keys); ``name``:
    the reminder name's start; ``priority``: exact; ``state``: ``any``,
    ``paused``, ``active`` or ``orphaned`` (its grain type is hosted by no
    Active silo)."""

    grain_type: str = ""
    key_prefix: str = ""
    name: str = ""
    priority: int | None = None
    state: str = "any"

    @property
    def prefix(self) -> str:
        """The start every matching row key has."""
        if not self.grain_type:
            return ""
        if not self.key_prefix:
            return f"{self.grain_type}/"
        key = self.key_prefix
        tagged = key[:2] in ("s:", "i:", "u:")
        return f"{self.grain_type}/{key if tagged else 's:' + key}"

    def matches_key(self, key: str, hosted: Container[str] | None) -> bool:
        grain, _, name = key.rpartition("|")
        if not grain.startswith(self.prefix) or not name.startswith(self.name):
            return False
        if self.state == "orphaned":
            return hosted is not None and grain.partition("/")[0] not in hosted
        return True

    def matches_row(self, row: ReminderEntry) -> bool:
        if self.priority is not None and int(row.priority) != self.priority:
            return False
        if self.state == "paused":
            return row.paused
        if self.state == "active":
            return not row.paused
        return True


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """A place in the search order: ``due`` (ms) among the scheduled rows, ``None``
    among the paused ones; then the grain's canonical text and the name. The
    origin of a part is ``Position(due, "", "")`` (before every key)."""

    due: int
    grain: str
    name: str

    @classmethod
    def of(cls, row: ReminderEntry) -> Position:
        due = -1 if row.paused else to_ms(row.next_due)
        return cls(due, row.grain_id.canonical, row.name)

    @classmethod
    def of_key(cls, due: int, key: str) -> Position:
        grain, _, name = key.rpartition("|")
        return cls(due, grain, name)

    @property
    def key(self) -> str:
        return f"{self.grain}|{self.name}" if self.grain else ""

    def cursor(self) -> str:
        hexed = self.key.encode().hex()
        return f"z:{hexed}" if self.due < 0 else f"a:{self.due}:{hexed}"


#: Where the paused part starts.
PAUSED_START: Final = Position(-1, "", "")
#: Where the scheduled part starts.
SCHEDULED_START: Final = Position(0, "", "")


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[ReminderEntry]
    cursor: str | None
    """Where the next page starts; ``None`` at the end."""
    scanned: int


@dataclass(frozen=True, slots=True)
class Part:
    """What one store answered for one part of the order: the matching rows in
    order, the position of the last row it examined (``None``: it reached the
    part's end), and how many it examined."""

    rows: list[ReminderEntry]
    last: Position | None
    scanned: int


def parse_cursor(cursor: str | None) -> Position:
    """The position after which a page starts (``ValueError`` when malformed)."""
    if not cursor:
        return SCHEDULED_START
    if len(cursor) > _MAX_CURSOR:
        raise ValueError("cursor too long")
    kind, _, rest = cursor.partition(":")
    if kind == "a":
        due, sep, hexed = rest.partition(":")
        if not sep or not due.isdigit() or len(due) > 15:
            raise ValueError("malformed cursor")
        return _at(int(due), hexed)
    if kind == "z":
        return _at(-1, rest)
    raise ValueError("malformed cursor")


def _at(due: int, hexed: str) -> Position:
    try:
        key = bytes.fromhex(hexed).decode()
    except (ValueError, UnicodeDecodeError):
        raise ValueError("malformed cursor") from None
    if not key:
        return Position(due, "", "")
    grain, sep, name = key.rpartition("|")
    if not sep:
        raise ValueError("malformed cursor")
    GrainId.parse(grain)  # ValueError when it is not a grain id
    return Position(due, grain, name)


def take(
    examined: list[tuple[Position, ReminderEntry | None]], query: Query, limit: int
) -> tuple[list[ReminderEntry], Position | None]:
    """Walk ``examined`` (positions in order, each with its row when its key
    matched and it was read, else ``None``): the matching rows, at most
    ``limit``, and the position the next page starts after (the ``limit``-th
    row's, else the last examined)."""
    rows: list[ReminderEntry] = []
    for position, row in examined:
        if row is not None and query.matches_row(row):
            rows.append(row)
            if len(rows) >= limit:
                return rows, position
    return rows, examined[-1][0] if examined else None


def key_of(row: ReminderEntry) -> str:
    return row_key(row.grain_id, row.name)
