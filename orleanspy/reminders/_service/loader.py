"""Loading: which rows of the table the window holds.

One task serves every request (refills, newly owned ranges, hints, the poll,
the repair pass), so that reads of the table never race each other.

A *refill* reads every owned range with ``read_due(range, now + look_ahead,
limit)`` and keeps the first ``bucket_size`` rows overall in the admission
order — highest priority first, then earliest due (queued rows that lose are
evicted; rows being delivered are never evicted). It reads as many candidates
as the free space takes plus a sixty-fourth of the bucket (to evict worse
queued rows for, and so the rotation knows the best row that waits), never a
bucket's worth to admit a few; the rest come with later refills. A row read
and not admitted is decoded again when a later refill admits it, so the
extra is small. On a ``SkippingReminderTable`` the read leaves the rows the
window holds out (``read_due_skipping``): they are not fetched or decoded
again. After each refill the window learns how many near-due rows it left
outside, the best of them, and whether the read stopped at its limit (more
may wait), for its rotation (``DueWindow.left_outside``). It runs at start,
every ``poll_interval``, on request, when a quarter of the window is free
(counting due rows as held; an eighth, while a row left outside is overdue) or
half of it turned over while the last refill left rows behind, and after the change
feed was lost. A newly owned range is read at once. A change for an owned row
that is not held (or that another writer moved) is read with ``table.read`` and
admitted if it is inside the window and would make the cut; a removal drops
the row. So is a row whose schedule CAS was lost (``reread``): schedule CASes
are not published, so that is how a row another writer moved comes back. A
row read back in a state the table had confirmed to this silo before, behind
the write that lost, went back in time (a failover lost writes the store had
acknowledged): it keeps the schedule this silo delivered, written over it.

Polls. Every poll reads the whole look-ahead of every owned range, with the
rows the window holds left out by the table (``read_due_skipping``): whatever
change notice was lost, a row due within the look-ahead that is not held is
found by the next poll, so within one ``poll_interval``. The held rows cost a
poll only their index entries (Redis) or raw records (PostgreSQL), never a
decode into entries or a schedule. (Polls reading only rows due after an
earlier refill's horizon saved that much more, but a row written due before the
horizon whose notice was lost then waited for the next full poll.)

Repair. Normal loading already takes overdue rows first (``read_due`` returns
the earliest first), so an overdue row is only starved while the window is
full of rows being delivered. Every ``repair_interval`` the repair pass reads
owned rows with ``next_due < now - look_ahead`` that are not held (at most
``bucket_size`` per range) and applies SKIP or NOTIFY to them in place — the
next slot after now is persisted (and NOTIFY published) without taking room in
the window or a delivery permit. FIRE_IMMEDIATELY rows need a delivery, so the
pass leaves them to the window, which loads them first once there is room.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from orleanspy._retry import Backoff
from orleanspy._tasks import raise_if_cancelled
from orleanspy.clock import Clock
from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.metrics import ReminderMetrics
from orleanspy.options import ReminderOptions
from orleanspy.reminders._service.adaptive import LoadSignals, adapted_bucket_size
from orleanspy.reminders._service.history import NoHistory, skip_outcome
from orleanspy.reminders._service.missed import MissedNotifier, plan_tick
from orleanspy.reminders._service.ownership import Ownership
from orleanspy.reminders._service.persist import Persister
from orleanspy.reminders._service.ticker import sleep_or_wake
from orleanspy.reminders._service.window import DueWindow, Row, admission_key
from orleanspy.reminders.counters import SKIPPED
from orleanspy.reminders.model import (
    ENDED,
    MissedReminderAction,
    ReminderChange,
    ReminderEntry,
    ScheduleUpdate,
    SkipReason,
    row_key,
)
from orleanspy.reminders.schedule import schedule_for
from orleanspy.reminders.table import (
    ChangeFeed,
    FencingReminderTable,
    ReminderTable,
    SkippingReminderTable,
    subscribe,
)
from orleanspy.ring import RingRange

__all__ = ["Loader"]

log = logging.getLogger(__name__)


class Loader:
    """Keeps ``window`` filled with the owned rows that fall due soon; see the
    module docstring for when it reads what.

    ``run()`` and ``follow(feed)`` are tasks that run until cancelled; table
    errors are logged, counted in ``load_errors`` and retried with backoff,
    never raised. Data flows one way: the loader reads the table and feeds the
    window; it asks the persister (what is unwritten, which writes landed) and
    publishes NOTIFY skips of the repair pass through the notifier. Nothing
    downstream calls it: it waits on the window's ``low`` signal. The service
    tells it of ring changes (``ranges_changed``) and table changes
    (``notify_change``).
    """

    def __init__(
        self,
        table: ReminderTable,
        clock: Clock,
        options: ReminderOptions,
        *,
        ownership: Ownership,
        window: DueWindow,
        persister: Persister,
        notifier: MissedNotifier,
        load: Callable[[], LoadSignals],
        name: str = "",
        metrics: ReminderMetrics | None = None,
        history: NoHistory | None = None,
    ) -> None:
        self._table = table
        self._clock = clock
        self._options = options
        self._ownership = ownership
        self._window = window
        self._persister = persister
        self._notifier = notifier
        self._load = load
        self._name = name
        self.metrics = metrics or ReminderMetrics()
        self.history = history or NoHistory()
        self._wake = asyncio.Event()
        self._refill_wanted = True
        self._refill_waiters: list[asyncio.Future[None]] = []
        self._new_ranges: list[RingRange] = []
        # Incarnations to fence before the next read (``fence``), with how long
        # fences are kept.
        self._fences: dict[SiloAddress, timedelta | None] = {}
        self.fenced = 0
        self._hints: dict[str, tuple[GrainId, str]] = {}
        self._more_available = False
        # Keys whose stored state changed while a bulk read was running (None:
        # no read is running): that read may return their old state, so it
        # must not load them.
        self._touched: set[str] | None = None
        self.refills = 0
        self.load_errors = 0
        self.evicted = 0
        #: Rows found behind a schedule this silo had written, kept ahead (``_effective``).
        self.rolled_back = 0
        self.repaired = 0

    # -- what the owner reports -------------------------------------------------------

    def ranges_changed(self, new: Sequence[RingRange]) -> None:
        """The owned ranges changed; ``new`` (from ``Ownership.update``) is read now,
        and parts held back for a handover when their time comes."""
        self._hints = {k: v for k, v in self._hints.items() if self._ownership.owns(v[0])}
        if new:
            self._new_ranges.extend(new)
        if new or self._ownership.next_release is not None:
            self._wake.set()  # the loader's next wake-up may be earlier now

    def fence(self, silo: SiloAddress, keep: timedelta | None = None) -> None:
        """Fence ``silo`` (an incarnation seen Dead) in the table before any
        further read: the rows of the ranges taken over from it are read only
        after the table refuses its schedule writes. On a table that is not a
        ``FencingReminderTable`` nothing is fenced. ``keep``: fences older
        than that may be pruned meanwhile."""
        if isinstance(self._table, FencingReminderTable):
            self._fences[silo] = keep
            self._wake.set()

    async def _fence_pending(self) -> None:
        """Fence every incarnation asked for; one that fails stays pending, and
        the read waits (the error is the loader's: logged, retried)."""
        table = self._table
        assert isinstance(table, FencingReminderTable)
        for silo, keep in list(self._fences.items()):
            now = self._clock.now()
            await table.fence(silo, at=now, prune_before=None if keep is None else now - keep)
            del self._fences[silo]
            self.fenced += 1
            log.info("reminder writer fenced name=%s silo=%s", self._name, silo)

    def notify_change(self, change: ReminderChange) -> None:
        """Take a change of the table into account (from the feed or a local hint).

        A removal drops the row. A change of a row not held, due inside the
        window, of a held row that another writer moved, or a whole-row write
        of a held row (a registration or management call: its change carries
        the priority), schedules a read of the row; the echo of our own write
        is ignored.
        """
        grain_id, name, next_due = change.grain_id, change.name, change.next_due
        if not self._ownership.owns(grain_id):
            return
        key = row_key(grain_id, name)
        if self._touched is not None:
            self._touched.add(key)
        row = self._window.get(key)
        if next_due is None:
            if row is not None:
                self._window.drop(row)
            self._hints.pop(key, None)
            return
        if change.entry is not None and change.entry.etag is not None:
            # A local write carries the row: it takes effect now, also while a
            # read runs (that read's answer for the key is stale: ``touched``).
            self._hints.pop(key, None)
            self._admit(key, change.entry)
            return
        if row is not None:
            whole_row = change.priority is not None
            if not whole_row and (
                next_due in (row.next_due, row.stored_due) or self._persister.wrote(key, next_due)
            ):
                return
        elif next_due > self._clock.now() + self._options.look_ahead:
            return
        elif self._window.space == 0:
            # Full: a change that would not make the cut waits for a refill. A
            # change without its priority may be of any: it is read unless it
            # would lose even at the highest priority.
            last = self._window.last_admitted()
            priority = 127 if change.priority is None else change.priority
            if not self._window.priority_first:
                priority = 0
            if last is None or admission_key(priority, next_due) >= last:
                self._more_available = True
                self._window.signal_low = True
                if change.priority is not None:
                    self._window.also_outside(admission_key(priority, next_due))
                return
        self._hints[key] = (grain_id, name)
        self._wake.set()

    def reread(self, grain_id: GrainId, name: str) -> None:
        """Read row ``(grain_id, name)`` again soon and admit it as it is then (a
        schedule CAS on it was lost: another writer moved it, or it is gone)."""
        if self._ownership.owns(grain_id):
            self._hints[row_key(grain_id, name)] = (grain_id, name)
            self._wake.set()

    async def request_refill(self) -> None:
        """Return when a full refill that began after this call finished (``run`` must
        be running; it retries errors, so this waits until a refill succeeds)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._refill_waiters.append(fut)
        self._refill_wanted = True
        self._wake.set()
        await fut

    # -- the tasks --------------------------------------------------------------------

    async def run(self) -> None:
        """Serve refills, range loads, hints, polls and repairs until cancelled."""
        opts = self._options
        backoff = Backoff(opts.retry_initial, opts.retry_max)
        now = self._clock.now()
        next_poll, next_repair = now, now + opts.repair_interval
        while True:
            self._wake.clear()
            now = self._clock.now()
            released = self._ownership.release(now)
            if released:  # a handover's wait is over: read what it held back
                self.ranges_changed(released)
            try:
                if self._fences:
                    await self._fence_pending()
                if self._refill_wanted or now >= next_poll:
                    await self._refill_all()
                    next_poll = now + opts.poll_interval
                elif self._new_ranges:
                    ranges, self._new_ranges = self._new_ranges, []
                    try:
                        await self.refill(ranges)
                    except BaseException:
                        self._new_ranges[:0] = ranges
                        raise
                if self._hints:
                    await self._read_hints()
                if now >= next_repair:
                    await self._repair()
                    next_repair = now + opts.repair_interval
                backoff.reset()
            except Exception as exc:
                raise_if_cancelled()
                self.load_errors += 1
                log.warning("reminder load failed name=%s error=%r", self._name, exc)
                # A new request (a registration's hint, a ring change) cuts the
                # wait short: once the store is back it is served at once, not
                # after a backoff grown during the outage.
                self._wake.clear()
                retry_at = self._clock.now() + timedelta(seconds=backoff.next())
                await sleep_or_wake(self._clock, retry_at, self._wake)
                continue
            raise_if_cancelled()
            wake_at = min(next_poll, next_repair)
            held = self._ownership.next_release
            if held is not None:
                wake_at = min(wake_at, held)
            await sleep_or_wake(self._clock, wake_at, self._wake, self._window.low)
            if self._window.low.is_set():
                self._window.low.clear()
                self._refill_wanted = True

    async def follow(self, feed: ChangeFeed) -> None:
        """Feed table changes to ``notify_change``; resubscribe after an error."""
        backoff = Backoff(self._options.retry_initial, self._options.retry_max)
        gap = False
        try:
            while True:
                try:
                    if gap:
                        # Changes may have been missed while the feed was down:
                        # re-read, but only once the new subscription exists
                        # (a feed that can ``open`` subscribes now), so a change
                        # made between the re-read and the subscription is seen.
                        opener = getattr(feed, "open", None)
                        if opener is not None:
                            await opener()
                        gap = False
                        self._refill_wanted = True
                        self._wake.set()
                    async for change in feed:
                        self.metrics.feed_event()
                        self.notify_change(change)
                        backoff.reset()
                    return  # the feed ended: the table was closed
                except Exception as exc:
                    log.warning("reminder change feed lost name=%s error=%r", self._name, exc)
                    self.metrics.feed_reconnect()
                    await feed.aclose()
                    await self._clock.sleep(backoff.next())
                    feed = subscribe(self._table, self._ownership.feed_scope)
                    gap = True
        finally:
            await feed.aclose()

    # -- reading ----------------------------------------------------------------------

    async def refill(self, ranges: Sequence[RingRange]) -> None:
        """Read ``ranges`` and keep the earliest ``bucket_size`` rows overall.

        Others call it only while ``run`` is not running (reads must not race).
        """
        window = self._window
        window.bucket_size = adapted_bucket_size(self._options, self._load, self._name)
        now = self._clock.now()
        before = now + self._options.look_ahead
        # Candidates: what the free space takes, plus a sixty-fourth of the bucket
        # to evict worse queued rows for and to learn the best row that waits
        # outside (the rotation's next candidate; an answer cut at ``take`` says
        # more may wait). Every row read and not admitted is decoded again by
        # the refill that admits it: reading a bucket's worth to admit an eighth
        # of one decoded eight rows per row admitted, reading an eighth more
        # about two.
        wanted = window.space + max(1, window.bucket_size // 64)
        # Rows we hold come back from the read too (the table may lag behind us):
        # read past them so they cannot hide the rows we are looking for.
        limit = wanted + len(window) + len(self._persister)
        table = self._table
        take = 0
        if isinstance(table, SkippingReminderTable):
            # Held rows are left out by the table itself: they are not fetched or
            # decoded again. They still count towards the limit, so an answer of
            # ``full`` rows may have stopped at it.
            # Only the first ``take`` rows not held are fetched and decoded: those
            # wanted, and room for released rows whose update is still unwritten
            # (the table has them earlier than they are: they come first).
            take = wanted + len(self._persister)
            full = min(limit - len(window), take)
        else:
            full = limit

        def reads_until(until: datetime) -> list[Awaitable[list[ReminderEntry]]]:
            if isinstance(table, SkippingReminderTable):
                return [table.read_due_skipping(r, until, limit, window, take=take) for r in ranges]
            return [table.read_due(r, until, limit) for r in ranges]

        batches, touched = await self._read(reads_until(before))
        if any(len(b) >= full for b in batches):
            # The read stopped at its limit in the priority order: rows of a lower
            # priority that are due already may wait behind higher ones not due
            # for minutes. Read those too, so free room goes to them first (an
            # idle silo otherwise left overdue background rows outside for as
            # long as its higher priorities filled the look-ahead).
            due_now, also = await self._read(reads_until(now))
            batches += due_now
            touched |= also
        # Cheap filters first; schedules are built only for rows that can make the cut.
        found: dict[str, tuple[datetime, int, ReminderEntry, datetime | None]] = {}
        # Rows whose stored state changed while the read ran (our schedule write
        # landed, a change arrived) are left out: the answer may predate it. They
        # may still wait, near due, so they count as "more may wait": without it a
        # read that raced a batch of writes would report nothing outside, the
        # rotation would stop and the window would keep its rows until the poll.
        raced = False
        for batch in batches:
            for entry in batch:
                key = entry.key
                if key in window or key in found:
                    continue
                if key in touched:
                    raced = True
                    continue
                if not self._ownership.owns(entry.grain_id):
                    continue
                next_due, last_fire = self._effective(entry)
                if next_due <= before:
                    found[key] = (next_due, -int(entry.priority), entry, last_fire)
        # Priority first, then due: the window's admission order; rows due already
        # ahead of rows not due yet, so free room is not filled with later rows
        # while earlier ones wait (a queued row is evicted only by a better one in
        # the admission order, never for an earlier one of a lower priority).
        if window.priority_first:
            best = sorted(found.values(), key=lambda c: (c[0] > now, c[1], c[0]))[: window.room]
        else:
            best = sorted(found.values(), key=lambda c: (c[0], c[1]))[: window.room]
        # Rows (and their schedules) are built as the merge takes them, best first:
        # once one loses against a full window the rest are never built.
        fresh = (r for c in best if (r := self._make_row(c[2], c[0], c[3])) is not None)
        loaded, evicted = window.merge(fresh, ordered=True)
        # What waits outside, for the window's rotation: the candidates that did
        # not make it (the evicted rows wait too, but after them).
        left = sorted(
            [(c[1], c[0]) for c in found.values()]
            + [(-row.priority, row.next_due) for row in evicted]
        )[loaded:]
        if not window.priority_first:
            left = sorted((0, due) for _, due in left)
        truncated = raced or any(len(b) >= full for b in batches)
        overdue = any(due <= now for _, due in left)
        window.left_outside(len(left), left[0] if left else None, more=truncated, overdue=overdue)
        self._more_available = loaded < len(found) or truncated
        window.refilled(self._more_available)
        self.refills += 1
        self.metrics.refilled(loaded)
        self.evicted += len(evicted)
        log.debug(
            "reminder refill name=%s ranges=%d loaded=%d evicted=%d resident=%d bucket_size=%d",
            self._name,
            len(ranges),
            loaded,
            len(evicted),
            len(window),
            window.bucket_size,
        )

    async def _refill_all(self) -> None:
        waiters, self._refill_waiters = self._refill_waiters, []
        self._refill_wanted = False
        self._new_ranges.clear()
        try:
            await self.refill(self._ownership.ranges)
        except BaseException:
            self._refill_wanted = True
            self._refill_waiters[:0] = waiters
            raise
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _read(
        self, reads: list[Awaitable[list[ReminderEntry]]]
    ) -> tuple[list[list[ReminderEntry]], set[str]]:
        """The reads' results, and the keys whose stored state changed meanwhile
        (our writes that landed, changes from the feed)."""
        self.metrics.table_reads(len(reads))
        with self._persister.watch() as touched:
            self._touched = touched
            try:
                results = await asyncio.gather(*reads, return_exceptions=True)
            finally:
                self._touched = None
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [r for r in results if not isinstance(r, BaseException)], touched

    def _effective(self, entry: ReminderEntry) -> tuple[datetime, datetime | None]:
        """``(next_due, last_fire)`` of a row as read, with our unwritten update
        applied (the table lags behind while persistence is pending), or with the
        schedule of our lost write when the row went back to a state the table
        had confirmed to us (``_rolled_back``: a failover lost our writes)."""
        pending = self._persister.latest(entry.key)
        if pending is not None and pending.etag == entry.etag:
            return pending.next_due, pending.last_fire
        lost = self._window.lost.pop(entry.key, None)
        if lost is not None and _rolled_back(entry, *lost):
            # The row went back to an earlier schedule of the same registration:
            # a write of ours that the store acknowledged and then lost (a primary
            # that failed over before replicating it). The slots up to ours were
            # delivered; delivering them again is what at-least-once allows but
            # nothing needs. Keep our schedule and write it over the stored row.
            next_due, last_fire = lost[1].next_due, lost[1].last_fire
            self.rolled_back += 1
            log.warning(
                "reminder schedule found behind the one this silo wrote; keeping it "
                "name=%s key=%s stored_next_due=%s kept_next_due=%s",
                self._name,
                entry.key,
                entry.next_due.isoformat(),
                next_due.isoformat(),
            )
            assert entry.etag is not None
            self._persister.submit(
                ScheduleUpdate(entry.grain_id, entry.name, entry.etag, next_due, last_fire),
                entry.key,
            )
            return next_due, last_fire
        return entry.next_due, entry.last_fire

    def _make_row(
        self, entry: ReminderEntry, next_due: datetime, last_fire: datetime | None
    ) -> Row | None:
        try:
            schedule = schedule_for(entry)
        except ReminderError as exc:
            log.warning("reminder row unusable name=%s key=%s error=%s", self._name, entry.key, exc)
            return None
        return Row(entry, schedule, next_due, last_fire)

    async def _read_hints(self) -> None:
        """Read each hinted row and admit it as read, unless its stored state
        changed while the read ran (a change arrived for it, or one of our writes
        landed): the answer may predate that change, so it is read again. A read
        never installs a row older than the newest change seen for its key, nor
        one removed meanwhile."""
        while self._hints:
            key, (grain_id, name) = hint = next(iter(self._hints.items()))
            del self._hints[key]
            self.metrics.table_reads(1)
            try:
                with self._persister.watch() as touched:
                    self._touched = touched
                    try:
                        entry = await self._table.read(grain_id, name)
                    finally:
                        self._touched = None
            except BaseException:
                self._hints.setdefault(key, hint[1])
                raise
            if key in touched:
                if self._ownership.owns(grain_id):
                    self._hints.setdefault(key, hint[1])
                continue
            if self._ownership.owns(grain_id):
                self._admit(key, entry)

    def _admit(self, key: str, entry: ReminderEntry | None) -> None:
        """Bring the window in line with the row as just read."""
        row = self._window.get(key)
        if entry is None or entry.paused:  # a paused row is not delivered: not held
            if row is not None:
                self._window.drop(row)
            return
        if row is not None:
            if entry.etag == row.etag or self._persister.wrote(key, entry.next_due):
                return  # unchanged, or our own write whose outcome is on its way
            if self._update_held(row, entry):
                return
            self._window.drop(row)
        next_due, last_fire = self._effective(entry)
        if next_due > self._clock.now() + self._options.look_ahead:
            return
        new = self._make_row(entry, next_due, last_fire)
        if new is None:
            return
        loaded, evicted = self._window.merge([new])
        self.evicted += len(evicted)
        if not loaded:
            self._more_available = True
            self._window.signal_low = True
            priority = new.priority if self._window.priority_first else 0
            self._window.also_outside(admission_key(priority, new.next_due))

    def _update_held(self, row: Row, entry: ReminderEntry) -> bool:
        """Apply a registration or management write to a held row in place, so it
        takes effect at once and no slot is delivered twice; ``False`` when the
        row must be dropped and read again instead.

        A write that kept the schedule (a new priority or action) swaps the row's
        stored copy and etag, keeps its local schedule (ticks already delivered
        stay delivered), rebases its unwritten update onto the new etag and moves
        it to its priority's lane. A write that moved the schedule (a repair, a
        new period or cron) is the new truth: the row takes the stored schedule,
        and updates of ours still waiting are discarded. A row whose tick is
        being delivered right now keeps that delivery: with a moved schedule it
        is dropped and the new row loaded (the new schedule's slots lie ahead).
        """
        old = row.entry
        same_schedule = entry.next_due == row.stored_due and entry.same_schedule(old)
        if same_schedule:
            assert row.etag is not None and entry.etag is not None
            self._persister.rebase(row.key, row.etag, entry.etag)
            self._window.replace_entry(row, entry)
            return True
        try:
            schedule = schedule_for(entry)
        except ReminderError as exc:
            log.warning("reminder row unusable name=%s key=%s error=%s", self._name, row.key, exc)
            return False
        keep = entry.next_due <= self._clock.now() + self._options.look_ahead
        if not self._window.reschedule(row, entry, schedule, keep=keep):
            return False  # being delivered: drop it, load the new row
        self._persister.discard(row.key)
        return True

    async def _repair(self) -> None:
        """Apply SKIP/NOTIFY in place to long-overdue rows not held (module docstring)."""
        now = self._clock.now()
        before = now - self._options.look_ahead
        limit = self._window.bucket_size
        batches, touched = await self._read(
            [self._table.read_due(r, before, limit) for r in self._ownership.ranges]
        )
        for entry in (e for batch in batches for e in batch):
            key = entry.key
            if (
                entry.next_due >= before
                or entry.etag is None
                or key in self._window
                or key in touched
                or self._persister.latest(key) is not None
                or not self._ownership.owns(entry.grain_id)
            ):
                continue
            try:
                schedule = schedule_for(entry)
            except ReminderError:
                continue
            grace = self._options.grace if entry.grace is None else entry.grace
            plan = plan_tick(
                schedule,
                entry.action,
                entry.next_due,
                now,
                grace,
                catchup_window=entry.catchup_window,
            )
            if plan.deliver:
                # A catch-up (FIRE_IMMEDIATELY) or an on-time tick needs a delivery:
                # the window loads it once there is room.
                self._more_available = True
                self._window.signal_low = True
                continue
            self.repaired += 1
            counts = self._persister.counts
            resumed = entry.resumed_at
            paused = resumed is not None and entry.next_due <= resumed
            reason = SkipReason.PAUSED if paused else SkipReason.LATE
            counts.add(key, entry, SKIPPED[reason], plan.skipped)
            counts.add(key, entry, SKIPPED[SkipReason.CATCHUP_WINDOW], plan.outside)
            if plan.resume is None:  # its last slot passed: the row ends here
                update = ScheduleUpdate(
                    entry.grain_id, entry.name, entry.etag, ENDED, entry.last_fire, remove=True
                )
            else:
                update = ScheduleUpdate(
                    entry.grain_id, entry.name, entry.etag, plan.resume, entry.last_fire
                )
            self._persister.submit(update, entry.key)
            if entry.action is MissedReminderAction.NOTIFY or plan.resume is None:
                await self._notifier.notify(entry, plan.slot, now, plan.missed_ticks, plan.resume)
            self.history.fired(
                entry, plan.slot, now, skip_outcome(entry), final=plan.resume is None
            )


def _rolled_back(
    stored: ReminderEntry,
    held: ReminderEntry,
    lost: ScheduleUpdate,
    confirmed: tuple[tuple[str | None, datetime], ...],
) -> bool:
    """Whether ``stored`` is the row ``held`` (as this silo held it) gone back to
    a state the table had confirmed to this silo before (``confirmed``: the
    etag and ``next_due`` of a write it acknowledged, or of the load), behind
    ``lost``, the schedule write of ours that then lost its CAS. A CAS refused
    on the unchanged row (a fence) is no rollback, and neither is any state the
    silo never saw (another writer's: a re-registration, a management write, a
    previous owner's progress): then the stored row is the truth."""
    if lost.remove or stored.etag == lost.etag or stored.next_due >= lost.next_due:
        return False
    if (stored.etag, stored.next_due) not in confirmed:
        return False
    return replace(stored, next_due=lost.next_due, last_fire=None, etag=None) == replace(
        held, next_due=lost.next_due, last_fire=None, etag=None
    )
