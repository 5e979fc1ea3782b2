"""The bounded near-due window: every row the service holds, its state and lane.

The window owns row state. A row the service holds is *resident*. It is in
exactly one state:

- ``QUEUED``: in the heap, waiting for its ``next_due``;
- ``DUE``: taken off the heap (``pop_due``), waiting in a priority lane
  (``lanes``) or being delivered.

Every change of a row's state goes through the window: admission and eviction
(``merge``), a tick's re-queue (``push``) or departure (``release``), dropping
(``drop``, also out of its lane), a persisted schedule (``persisted``), and a
registration or management write applied in place (``replace_entry``,
``reschedule``). The window signals, and never calls, the parts that wait on
it: ``head_changed`` (the ticker's sleep) and ``low`` (a quarter of the bucket
free, an eighth while an overdue row waits outside, or half of it turned over,
for the loader). Rows that
``pop_due`` moved into the lanes are the ticker's to hand on
(``LaneDrainer.kick``).

After its tick the row goes back to ``QUEUED`` (if its next slot is inside the
window) or leaves. Rotation: while rows wait outside (``left_outside``: the
loader saw near-due rows it had no room for), a row whose next slot comes
after the best of them in the admission order is released instead of
re-queued, and once a batch of such rows left (a quarter of the bucket size,
or every waiting row) ``low`` is set, so a refill admits waiting rows in their
place. A bucket smaller than the near-due set so rotates through it instead
of keeping the rows it loaded first. It costs one comparison per tick, and
only while something waits; at most as many rows are released as are known
to wait (a batch's worth when the loader's read stopped at its limit: it
reads only a few rows past what it admits, so it sees only that few wait).
Every refill reads the index past the rows held, so the batch trades the
window's fill (between a quarter empty and full) against refills per tick.

The bucket size bounds *all* resident rows, not only the heap:
under a backlog the heap drains into the lanes, and a refill must not then
load more rows behind them, or memory would grow with the table.

The heap is one ``heapq`` min-heap keyed ``(next_due, -priority, seq)``: it
orders firing. Admission is another order: when more rows are near due than
the bucket size, the window holds the highest-priority rows first, then the
earliest due (``admission_key``), the order the table's ``read_due`` answers in.
Removal is lazy: an entry is live only while its ``seq`` maps to a queued row
(``_queued_rows``); stale entries are compacted away when they outnumber live
ones. Entries hold no row, only atomic values, so the garbage collector
untracks them: a tick's re-queue adds nothing that full collections walk.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime

from orleanspy.clock import to_ms
from orleanspy.reminders._service.lanes import Lanes
from orleanspy.reminders.model import ReminderEntry, ScheduleUpdate
from orleanspy.reminders.schedule import Schedule

__all__ = ["DueWindow", "LostWrite", "Row", "RowState", "admission_key"]

log = logging.getLogger(__name__)

#: A rotation batch is a ``1 / _ROTATION_SHARE`` share of the bucket (see the module
#: docstring). An eighth took a refill per 128 ticks at the default bucket, which
#: cost the default window about a third more CPU per tick than a quarter.
_ROTATION_SHARE = 4
#: Rows dropped for a lost CAS whose lost schedule is remembered (``DueWindow.lost``):
#: a few seconds of CAS losses of a large window; the oldest go first.
_LOST_KEPT = 4096
#: Confirmed schedule states kept per row (``Row.confirmed``): a failover loses
#: the writes of the last moments, a few per row at most.
_CONFIRMED_KEPT = 4

#: A row dropped for a lost CAS: the row as held, the write that lost, and the
#: states the table had confirmed for it (``Row.confirmed``).
LostWrite = tuple[ReminderEntry, ScheduleUpdate, tuple[tuple[str | None, datetime], ...]]


class RowState(enum.Enum):
    QUEUED = 1
    DUE = 2
    GONE = 3


class Row:
    """One resident reminder row.

    ``entry`` is the row as loaded or last rewritten by a whole-row write: its
    schedule fields (``start_at``, ``period``, ``cron``, ``tz``), priority and
    action are current; its ``etag``, ``next_due`` and ``last_fire`` are not
    kept up to date per tick. ``etag`` is the one the next schedule CAS must use
    and ``stored_due`` the ``next_due`` the table holds, both advanced in place
    when a schedule write lands (a tick copies no entry). ``next_due`` is the
    local schedule, which runs ahead of the table while persistence is pending.
    ``schedule`` is built once per loaded row (a cron iterator is costly to
    construct). ``last_fire`` is the local delivery time of the last
    acknowledged tick. ``retry_at``: set while a tick whose call failed on the
    call path waits for its retry, back in the heap (it holds no permit
    meanwhile); ``attempts`` counts those failures. Both are cleared when the
    row moves to its next slot. ``overlap_until``: set after a tick that
    outlasted its next slot, to when it returned: slots due by then overlapped
    it (``OverlapPolicy``). ``running``: the slots of an ``ALLOW_ALL`` row
    whose ticks are running beside its next ones (``None``: none yet).
    """

    __slots__ = (
        "attempts",
        "confirmed",
        "deadline",
        "dropped",
        "entry",
        "etag",
        "key",
        "last_fire",
        "next_due",
        "overlap_until",
        "retry",
        "retry_at",
        "running",
        "schedule",
        "seq",
        "state",
        "stored_due",
    )

    def __init__(
        self,
        entry: ReminderEntry,
        schedule: Schedule,
        next_due: datetime,
        last_fire: datetime | None,
    ) -> None:
        self.entry = entry
        #: ``entry.key``, kept: a rewrite of the row keeps its grain and name.
        self.key = entry.key
        self.etag = entry.etag
        self.stored_due = entry.next_due
        # The newest (etag, next_due) pairs the table confirmed for the row, the
        # loaded one first: a row read back in one of these states went back in
        # time (``DueWindow.lost``).
        self.confirmed: tuple[tuple[str | None, datetime], ...] = ((entry.etag, entry.next_due),)
        self.schedule = schedule
        self.next_due = next_due
        self.last_fire = last_fire
        self.state = RowState.GONE
        self.seq = 0
        # Set when the row must not be ticked or re-queued any more (ownership
        # moved, the row was removed or moved by another writer).
        self.dropped = False
        # The retry waiting for this row (a ``RetryPolicy`` retry after a grain
        # error), owned by delivery; ``next_due`` is its time meanwhile.
        self.retry: object | None = None
        self.retry_at: datetime | None = None
        self.attempts = 0
        # The tick call's deadline in seconds, worked out at the first tick (a
        # cron row's next slot costs tens of µs), again after a new schedule.
        self.deadline: float | None = None
        self.overlap_until: datetime | None = None
        self.running: list[datetime] | None = None

    @property
    def priority(self) -> int:
        return int(self.entry.priority)


# (next_due, -priority, seq): only atomic values, so the collector untracks the
# tuple and a heap entry never reaches the oldest generation (rows by seq in
# ``DueWindow._queued_rows``).
_HeapItem = tuple[datetime, int, int]
# (priority, -next_due ms, -seq, row): the smallest is the worst admission key.
_WorstItem = tuple[int, int, int, Row]


class DueWindow:
    """At most ``bucket_size`` resident rows; the ``QUEUED`` ones in one min-heap,
    the ``DUE`` ones waiting for a permit in ``lanes``."""

    def __init__(self, bucket_size: int, *, enable_priority: bool = True, name: str = "") -> None:
        self.bucket_size = bucket_size
        self.lanes: Lanes[Row] = Lanes(enable_priority)
        #: Set when the heap may have a new head (the ticker clears it).
        self.head_changed = asyncio.Event()
        #: Set when a quarter of the bucket is free, or half of it turned over
        #: (ticks finished since ``refilled``): the loader may want to refill.
        self.low = asyncio.Event()
        #: Whether ``low`` is wanted at all (the loader sets it while the table
        #: holds more near-due rows than the window took).
        self.signal_low = False
        self.turnover = 0
        self.cas_conflicts = 0
        #: Rows dropped for a lost CAS, by key: the row as held and the schedule
        #: the lost write carried (``lost_progress``; the loader consults it).
        self.lost: dict[str, LostWrite] = {}
        # Rotation: how many near-due rows wait outside, and the admission key
        # of the best of them (set by the loader; see the module docstring).
        self._waiting = 0
        self._outside: tuple[int, datetime] | None = None
        # Whether a row left outside by the last refill was due already.
        self._overdue_outside = False
        self._released = 0
        self._batch = 1
        self.rotated = 0
        self._name = name
        # Admission order: priority first (the default and the table's order), or
        # due time alone (only for measuring what priority-first admission buys).
        self._priority_first = True
        # The queued rows again, worst admission key first (lowest priority,
        # latest due): who is evicted next, in O(log n). Lazy like the heap, and
        # kept only while it is needed: it is built (O(n)) the first time the
        # window is asked who to evict, maintained from then on, and dropped
        # when the window is less than half full again, so a window that holds
        # its whole near-due set pays nothing for it per tick.
        self._worst: list[_WorstItem] = []
        self._worst_kept = False
        self._rows: dict[str, Row] = {}
        self._heap: list[_HeapItem] = []
        # The queued rows by their heap entry's seq: an entry is live while its
        # seq is here.
        self._queued_rows: dict[int, Row] = {}
        self._seq = itertools.count(1)
        self.high_water = 0

    def __len__(self) -> int:
        """Resident rows (queued and due)."""
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def __iter__(self) -> Iterator[str]:
        """The resident rows' keys: the window is a ``Collection``, so a table's
        ``read_due_skipping`` can take the keys along instead of testing each
        candidate here."""
        return iter(self._rows)

    def get(self, key: str) -> Row | None:
        return self._rows.get(key)

    @property
    def queued(self) -> int:
        """Rows in the heap."""
        return len(self._queued_rows)

    @property
    def space(self) -> int:
        return max(0, self.bucket_size - len(self._rows))

    @property
    def room(self) -> int:
        """Rows a merge could hold: the bucket size less the DUE rows (queued rows
        compete with candidates for it)."""
        return max(0, self.bucket_size - (len(self._rows) - len(self._queued_rows)))

    def head_due(self) -> datetime | None:
        """The earliest ``next_due`` in the heap."""
        self._skip_stale()
        return self._heap[0][0] if self._heap else None

    @property
    def priority_first(self) -> bool:
        """Whether admission is priority first (else due time alone)."""
        return self._priority_first

    @priority_first.setter
    def priority_first(self, value: bool) -> None:
        self._priority_first = value
        self._worst, self._worst_kept = [], False

    def last_admitted(self) -> tuple[int, datetime] | None:
        """The admission key (``-priority, next_due``) of the queued row that would
        be evicted first, or ``None``. O(log n) amortised."""
        row = self._peek_worst()
        if row is None:
            return None
        return (-row.priority if self._priority_first else 0, row.next_due)

    def push(self, row: Row) -> bool:
        """Queue ``row`` (making it resident); ``True`` if it became the head
        (then ``head_changed`` is set).

        The caller checks room for rows that are not yet resident; a row
        coming back from its tick is already counted.
        """
        if row.state is RowState.QUEUED:
            self._unqueue(row)
        head = self.head_due()
        self._rows[row.key] = row
        row.state = RowState.QUEUED
        row.seq = next(self._seq)
        at = row.next_due if row.retry_at is None else row.retry_at
        heapq.heappush(self._heap, (at, -row.priority, row.seq))
        self._queued_rows[row.seq] = row
        if self._worst_kept:
            heapq.heappush(self._worst, self._worst_item(row))
        self.high_water = max(self.high_water, len(self._rows))
        self._maybe_compact()
        new_head = head is None or at < head
        if new_head:
            self.head_changed.set()
        return new_head

    def pop_due(self, now: datetime) -> list[Row]:
        """Take every queued row with ``next_due <= now``, earliest first; they
        become DUE and wait in their lanes."""
        out: list[Row] = []
        heap, queued = self._heap, self._queued_rows
        while heap:
            item = heap[0]
            row = queued.get(item[2])
            if row is None:  # stale
                heapq.heappop(heap)
                continue
            if item[0] > now:
                break
            heapq.heappop(heap)
            del queued[item[2]]
            row.state = RowState.DUE
            out.append(row)
        if out:
            for row in out:
                self.lanes.put(row)
            self._check_low()
        return out

    def take(self) -> Row | None:
        """The next due row to deliver: the oldest of the highest non-empty lane."""
        return self.lanes.pop()

    def retry(self, row: Row, at: datetime) -> None:
        """``row``'s tick failed on the call path: it waits in the heap until ``at``
        (holding no delivery permit), then its slot is planned again (retried,
        or handed to its missed-tick action if it is late by then). A dropped
        row stays out."""
        row.attempts += 1
        row.retry_at = at
        if not row.dropped:
            self.push(row)

    def ticked(
        self, row: Row, next_due: datetime, *, keep: bool, failing_until: datetime | None = None
    ) -> None:
        """``row``'s tick is done and its next slot is ``next_due``: re-queue it if
        ``keep`` (inside the look-ahead), else release it. A dropped row stays out.

        ``failing_until``: the slot went undelivered after call-path failures; the
        row keeps its failure count and is not tried again before then (its
        backoff carries over slots, so a row whose grain stays unreachable
        takes a permit ever more rarely instead of once per slot)."""
        row.next_due = next_due
        if failing_until is not None:
            row.retry_at = failing_until if failing_until > next_due else None
        elif row.retry_at is not None or row.attempts:
            row.retry_at, row.attempts = None, 0
        self.turnover += 1
        if keep and self._waiting and self._outside is not None:
            priority = -row.priority if self._priority_first else 0
            if (priority, next_due) > self._outside:
                # A waiting row comes first: make room for it.
                keep = False
                self._waiting -= 1
                self.rotated += 1
                self._released += 1
                # One refill per batch of releases, not one per tick: a refill
                # reads every near-due row outside, so refilling per release
                # would cost a read per tick.
                if self._released >= self._batch or not self._waiting:
                    self.low.set()
        if not row.dropped:
            if keep:
                self.push(row)
            else:
                self.release(row)
        self._check_low()

    def left_outside(
        self,
        waiting: int,
        best: tuple[int, datetime] | None,
        *,
        more: bool = False,
        overdue: bool = False,
    ) -> None:
        """The loader saw ``waiting`` near-due rows it could not admit, the best
        of them with admission key ``best`` (``admission_key``); replaces what
        a previous refill said. ``more``: its read stopped at a limit, so more
        rows may wait than it saw: the window then counts on a batch's worth
        (the loader reads only a few rows past what it admits). ``overdue``: one
        of them was due already (``low`` then asks for less room)."""
        self._overdue_outside = overdue and waiting > 0
        self._waiting = waiting if best is not None else 0
        if more and self._waiting:
            self._waiting = max(self._waiting, self.bucket_size // _ROTATION_SHARE)
        self._outside = best if waiting else None
        self._released = 0
        self._batch = max(1, min(self._waiting, self.bucket_size // _ROTATION_SHARE))

    def also_outside(self, key: tuple[int, datetime]) -> None:
        """One more near-due row waits outside (a change the window had no room for)."""
        self._waiting += 1
        self._batch = max(1, min(self._waiting, self.bucket_size // _ROTATION_SHARE))
        if self._outside is None or key < self._outside:
            self._outside = key

    def refilled(self, more_available: bool) -> None:
        """A refill ran: turnover counts from here; ``low`` is signalled again
        only if the table holds more rows than the window took."""
        self.turnover = 0
        self.low.clear()
        self.signal_low = more_available

    def release(self, row: Row) -> None:
        """The row leaves memory (whatever its state)."""
        if self._rows.get(row.key) is row:
            del self._rows[row.key]
        if row.state is RowState.QUEUED:
            self._unqueue(row)
        row.state = RowState.GONE
        self._maybe_compact()

    def drop(self, row: Row) -> None:
        """Forget ``row`` for good: it is not ticked or re-queued any more (a
        delivery already running finishes). Out of its lane, out of memory."""
        row.dropped = True
        if row.state is RowState.DUE:
            self.lanes.remove(row)
        self.release(row)
        self.head_changed.set()

    def retain(self, keep: Callable[[Row], bool]) -> list[Row]:
        """Drop every resident row for which ``keep`` is false; return them."""
        gone = [row for row in self._rows.values() if not keep(row)]
        for row in gone:
            self.drop(row)
        return gone

    def persisted(self, update: ScheduleUpdate, etag: str | None, key: str) -> None:
        """The outcome of ``update``, a schedule write of the row ``key``: the held
        row adopts the new etag, or is dropped if another writer moved it (a lost
        CAS; the service has the loader read it again)."""
        row = self._rows.get(key)
        # A held row with another etag was loaded or rewritten after this update
        # was made: the outcome is not about it.
        mine = row is not None and row.etag == update.etag
        if etag is None:
            self.cas_conflicts += 1
            log.info("reminder moved by another writer name=%s key=%s", self._name, key)
            if row is not None and mine:
                self.drop(row)
                self.lost[key] = (row.entry, update, row.confirmed)
                if len(self.lost) > _LOST_KEPT:
                    del self.lost[next(iter(self.lost))]
        elif row is not None and mine:
            row.etag, row.stored_due = etag, update.next_due
            row.confirmed = (*row.confirmed[1 - _CONFIRMED_KEPT :], (etag, update.next_due))

    def replace_entry(self, row: Row, entry: ReminderEntry) -> None:
        """A write kept ``row``'s schedule but changed its stored copy (a new
        priority or action, a new etag): swap it in, keeping the local schedule,
        and move the row to its priority's lane or heap position."""
        waiting = row.state is RowState.DUE and self.lanes.remove(row)
        row.entry, row.etag, row.stored_due = entry, entry.etag, entry.next_due
        if waiting:
            self.lanes.put(row)
        elif row.state is RowState.QUEUED:
            self.push(row)  # the heap's tie-break follows the priority

    def reschedule(self, row: Row, entry: ReminderEntry, schedule: Schedule, *, keep: bool) -> bool:
        """A write moved ``row``'s schedule (a repair, a new period or cron): the
        stored row is the new truth. ``False`` if the row is being delivered
        right now (the caller drops it and loads the new row instead)."""
        waiting = row.state is RowState.DUE and self.lanes.remove(row)
        if row.state is RowState.DUE and not waiting:
            return False
        row.entry, row.schedule = entry, schedule
        row.etag, row.stored_due = entry.etag, entry.next_due
        row.next_due, row.last_fire = entry.next_due, entry.last_fire
        row.retry_at, row.attempts = None, 0
        row.deadline = None
        # Ticks of the old schedule still running are not the new one's.
        row.overlap_until, row.running = None, None
        if keep:
            self.push(row)
        else:
            self.release(row)
        return True

    def merge(self, candidates: Iterable[Row], *, ordered: bool = False) -> tuple[int, list[Row]]:
        """Load ``candidates`` (rows not resident), keeping the first overall in
        the admission order: highest priority first, then earliest due.
        ``ordered``: they come in that order already; they are then taken one at
        a time, and none is drawn after the first that loses (a lazy iterable
        builds only the rows that can make the cut).

        Queued rows compete with the candidates for the room left by DUE rows;
        the last in that order lose: a losing candidate is not loaded, a losing
        queued row is evicted (released; the loader reads it again once there is
        room). Returns ``(loaded, evicted)``. Never exceeds ``bucket_size``, also
        when the bucket size shrank since the last merge.
        """
        order = _order if self._priority_first else _due_order
        fresh: Iterable[Row] = (row for row in candidates if row.key not in self._rows)
        if not ordered:
            fresh = sorted(fresh, key=order)
        evicted: list[Row] = []
        # A bucket size that shrank: the worst queued rows go first.
        while len(self._rows) > self.bucket_size:
            worst = self._peek_worst()
            if worst is None:
                break
            self.release(worst)
            evicted.append(worst)
        loaded = 0
        for row in fresh:
            if len(self._rows) >= self.bucket_size:
                # Full: the candidate takes the place of the worst queued row if
                # it comes strictly before it (candidates come best first, so
                # once one loses, the rest lose too).
                worst = self._peek_worst()
                if worst is None or order(row)[:2] >= order(worst)[:2]:
                    break
                self.release(worst)
                evicted.append(worst)
            self.push(row)
            loaded += 1
        if loaded or evicted:
            self.head_changed.set()
        evicted.sort(key=order)
        return loaded, evicted

    def _worst_item(self, row: Row) -> _WorstItem:
        priority = row.priority if self._priority_first else 0
        return (priority, -to_ms(row.next_due), -row.seq, row)

    def _peek_worst(self) -> Row | None:
        if not self._worst_kept:
            self._rebuild_worst()
            self._worst_kept = True
        worst = self._worst
        while worst:
            row = worst[0][3]
            if row.state is RowState.QUEUED and row.seq == -worst[0][2]:
                return row
            heapq.heappop(worst)
        return None

    def _check_low(self) -> None:
        # Room counts every resident row, due ones too: under a backlog the heap
        # drains into the lanes while the window stays full, and a refill then
        # has no room to fill and no queued row to evict, yet reads every owned
        # range (a restart over 100,000 overdue rows spent most of its CPU
        # refilling after each tick). A quarter of the bucket free is worth a
        # read, an eighth while a row left outside is overdue already: the heap
        # may stay three quarters full of a higher priority's next slots, and
        # lower-priority overdue rows outside then waited for the poll (an idle
        # silo caught up with 10,000 background rows a poll's 200 at a time).
        # Under a backlog the heap also refills with the next slots of delivered
        # rows; a half-turned-over window also asks (a refill then evicts the
        # later rows in favour of the older ones).
        if not self.signal_low:
            return
        share = 8 if self._overdue_outside else 4
        if (
            self.space >= max(1, self.bucket_size // share)
            or self.turnover >= self.bucket_size // 2
        ):
            self.signal_low = False
            self.low.set()

    def _unqueue(self, row: Row) -> None:
        # Invalidates the row's heap entry; the entry itself is dropped lazily.
        self._queued_rows.pop(row.seq, None)
        row.seq = -1
        row.state = RowState.GONE

    def _skip_stale(self) -> None:
        heap, queued = self._heap, self._queued_rows
        while heap and heap[0][2] not in queued:
            heapq.heappop(heap)

    def _maybe_compact(self) -> None:
        queued = len(self._queued_rows)
        if len(self._heap) > 64 and len(self._heap) > 2 * queued:
            self._heap = [item for item in self._heap if item[2] in self._queued_rows]
            heapq.heapify(self._heap)
        if self._worst_kept and 2 * len(self._rows) < self.bucket_size:
            self._worst, self._worst_kept = [], False
        elif len(self._worst) > 64 and len(self._worst) > 2 * queued:
            self._rebuild_worst()

    def _rebuild_worst(self) -> None:
        self._worst = [self._worst_item(row) for row in self._queued_rows.values()]
        heapq.heapify(self._worst)


def admission_key(priority: int, next_due: datetime) -> tuple[int, datetime]:
    """The order in which rows compete for the window (and the table's due
    order): priority descending, then next_due ascending."""
    return (-priority, next_due)


def _order(row: Row) -> tuple[int, datetime, int]:
    return (-row.priority, row.next_due, row.seq)


def _due_order(row: Row) -> tuple[datetime, int, int]:
    return (row.next_due, -row.priority, row.seq)
