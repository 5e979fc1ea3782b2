"""The bounded near-due window: every row the service holds, and the due-heap.

A row the service holds is *resident*. It is in exactly one state:

- ``QUEUED``: in the heap, waiting for its ``next_due``;
- ``DUE``: taken off the heap by the ticker, waiting in a lane or being delivered.

After its tick the row goes back to ``QUEUED`` (if its next slot is inside the
window) or leaves. The capacity bounds *all* resident rows, not only the heap:
under a backlog the heap drains into the lanes, and a refill must not then
load more rows behind them, or memory would grow with the table.

The heap is one ``heapq`` min-heap keyed ``(next_due, -priority, seq)``: it
orders firing. Admission is another order: when more rows are near due than
the capacity, the window holds the highest-priority rows first, then the
earliest due (``admission_key``), the order the table's ``read_due`` answers in.
Removal is lazy: an entry is live only while its row is ``QUEUED`` with the
same ``seq``; stale entries are compacted away when they outnumber live ones.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Callable, Iterable
from datetime import datetime

from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.schedule import Schedule

__all__ = ["DueWindow", "Row", "RowState", "admission_key"]


class RowState(enum.Enum):
    QUEUED = 1
    DUE = 2
    GONE = 3


class Row:
    """One resident reminder row.

    ``entry`` is the row as last known in the table; its ``etag`` is the one
    the next schedule CAS must use. ``next_due`` is the local schedule, which
    runs ahead of the table while persistence is pending. ``schedule`` is built
    once per loaded row (a cron iterator is costly to construct). ``last_fire``
    is the local delivery time of the last acknowledged tick.
    """

    __slots__ = (
        "dropped",
        "entry",
        "last_fire",
        "next_due",
        "reloaded",
        "schedule",
        "seq",
        "state",
    )

    def __init__(
        self,
        entry: ReminderEntry,
        schedule: Schedule,
        next_due: datetime,
        last_fire: datetime | None,
    ) -> None:
        self.entry = entry
        self.schedule = schedule
        self.next_due = next_due
        self.last_fire = last_fire
        self.state = RowState.GONE
        self.seq = 0
        # Set when the row must not be ticked or re-queued any more (ownership
        # moved, the row was removed or moved by another writer).
        self.dropped = False
        # True until the row's first tick after it was read from the table: the
        # stored schedule may lag behind ticks already delivered (_missed).
        self.reloaded = True

    @property
    def key(self) -> str:
        return self.entry.key

    @property
    def priority(self) -> int:
        return int(self.entry.priority)


_HeapItem = tuple[datetime, int, int, Row]


class DueWindow:
    """At most ``capacity`` resident rows; the ``QUEUED`` ones in one min-heap."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        #: Admission order: priority first (the default and the table's order), or
        #: due time alone (only for measuring what priority-first admission buys).
        self.priority_first = True
        self._rows: dict[str, Row] = {}
        self._heap: list[_HeapItem] = []
        self._queued = 0
        self._seq = itertools.count(1)
        self.high_water = 0

    def __len__(self) -> int:
        """Resident rows (queued and due)."""
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def get(self, key: str) -> Row | None:
        return self._rows.get(key)

    @property
    def queued(self) -> int:
        """Rows in the heap."""
        return self._queued

    @property
    def space(self) -> int:
        return max(0, self.capacity - len(self._rows))

    @property
    def room(self) -> int:
        """Rows a merge could hold: the capacity less the DUE rows (queued rows
        compete with candidates for it)."""
        return max(0, self.capacity - (len(self._rows) - self._queued))

    def head_due(self) -> datetime | None:
        """The earliest ``next_due`` in the heap."""
        self._skip_stale()
        return self._heap[0][0] if self._heap else None

    def last_admitted(self) -> tuple[int, datetime] | None:
        """The admission key (``-priority, next_due``) of the queued row that would
        be evicted first, or ``None`` (a scan: called only when full)."""
        weight = 1 if self.priority_first else 0
        live = [(-item[3].priority * weight, item[0]) for item in self._heap if _live(item)]
        return max(live) if live else None

    def push(self, row: Row) -> bool:
        """Queue ``row`` (making it resident); ``True`` if it became the head.

        The caller checks capacity for rows that are not yet resident; a row
        coming back from its tick is already counted.
        """
        if row.state is RowState.QUEUED:
            self._unqueue(row)
        head = self.head_due()
        self._rows[row.key] = row
        row.state = RowState.QUEUED
        row.seq = next(self._seq)
        heapq.heappush(self._heap, (row.next_due, -row.priority, row.seq, row))
        self._queued += 1
        self.high_water = max(self.high_water, len(self._rows))
        self._maybe_compact()
        return head is None or row.next_due < head

    def pop_due(self, now: datetime) -> list[Row]:
        """Take every queued row with ``next_due <= now``, earliest first; they become DUE."""
        out: list[Row] = []
        heap = self._heap
        while heap:
            item = heap[0]
            if not _live(item):
                heapq.heappop(heap)
                continue
            if item[0] > now:
                break
            heapq.heappop(heap)
            row = item[3]
            row.state = RowState.DUE
            self._queued -= 1
            out.append(row)
        return out

    def release(self, row: Row) -> None:
        """The row leaves memory (whatever its state)."""
        if self._rows.get(row.key) is row:
            del self._rows[row.key]
        if row.state is RowState.QUEUED:
            self._unqueue(row)
        row.state = RowState.GONE
        self._maybe_compact()

    def retain(self, keep: Callable[[Row], bool]) -> list[Row]:
        """Release every resident row for which ``keep`` is false; return them."""
        gone = [row for row in self._rows.values() if not keep(row)]
        for row in gone:
            self.release(row)
        return gone

    def merge(self, candidates: Iterable[Row]) -> tuple[int, list[Row]]:
        """Load ``candidates`` (rows not resident), keeping the first overall in
        the admission order: highest priority first, then earliest due.

        Queued rows compete with the candidates for the room left by DUE rows;
        the last in that order lose: a losing candidate is not loaded, a losing
        queued row is evicted (released; the loader reads it again once there is
        room). Returns ``(loaded, evicted)``. Never exceeds ``capacity``, also
        when the capacity shrank since the last merge.
        """
        fresh = [row for row in candidates if row.key not in self._rows]
        room = self.capacity - (len(self._rows) - self._queued)
        if len(fresh) <= room - self._queued:
            for row in fresh:
                self.push(row)
            return len(fresh), []
        queued = [item[3] for item in self._heap if _live(item)]
        pool = sorted(queued + fresh, key=_order if self.priority_first else _due_order)
        keep = pool[: max(0, room)]
        kept_ids = {id(row) for row in keep}
        evicted = [row for row in queued if id(row) not in kept_ids]
        for row in evicted:
            self.release(row)
        loaded = 0
        for row in keep:
            if row.state is not RowState.QUEUED:
                self.push(row)
                loaded += 1
        return loaded, evicted

    def _unqueue(self, row: Row) -> None:
        # Invalidates the row's heap entry; the entry itself is dropped lazily.
        row.seq = -1
        row.state = RowState.GONE
        self._queued -= 1

    def _skip_stale(self) -> None:
        heap = self._heap
        while heap and not _live(heap[0]):
            heapq.heappop(heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 64 and len(self._heap) > 2 * self._queued:
            self._heap = [item for item in self._heap if _live(item)]
            heapq.heapify(self._heap)


def _live(item: _HeapItem) -> bool:
    row = item[3]
    return row.state is RowState.QUEUED and row.seq == item[2]


def admission_key(priority: int, next_due: datetime) -> tuple[int, datetime]:
    """The order in which rows compete for the window (and the table's due
    order): priority descending, then next_due ascending."""
    return (-priority, next_due)


def _order(row: Row) -> tuple[int, datetime, int]:
    return (-row.priority, row.next_due, row.seq)


def _due_order(row: Row) -> tuple[datetime, int, int]:
    return (row.next_due, -row.priority, row.seq)
