"""The adaptive reminder service (docs/architecture.md, section 2).

One per silo. It owns some ring ranges and, for those, keeps only the rows that
fall due soon in a bounded window; one sleeper wakes when the earliest is due;
due rows wait in priority lanes for a delivery permit; each delivery is a grain
call ``receive_reminder``; after the acknowledgement the next slot is persisted
in batches. The parts live in the private package ``_service/``, one job each:

- ``ownership``: the owned ranges and what a ring change means;
- ``loader``: reads the table and feeds the window (refills, hints, repair,
  change feed);
- ``window``: the rows held, their state and lane, the due-heap (all resident
  rows count against the bound);
- ``ticker``: the one sleeper, moving due rows into their lanes;
- ``lanes``: priority lanes and the lane drainer with its permits;
- ``delivery``: one due row's tick (the grain call, retries, next slot);
- ``herd``: catch-up grain calls ramped after an outage;
- ``missed``: the missed-tick rule (with the catch-up window), the overlap
  policies' plans, and NOTIFY publishing;
- ``concurrent``: an ``ALLOW_ALL`` row's ticks side by side;
- ``persist``: batched, retried CAS writes, with the rows' counters
  (``counting``) and dead letters (``dead_letters``);
- ``features``: which cluster features the service may use now;
- ``adaptive``: the bucket-size formula;
- ``backfill``: the backfill jobs of owned rows, slot after slot (beside the flow).

This module composes them. Data flows one way: table -> loader -> window ->
ticker -> lanes -> lane drainer -> delivery -> persister -> table; the
persister reports each write's outcome to the window, which owns the row. No
part is handed another after construction, and no part calls back up into the
loader: it waits on the window's signals. Only this module tells it of things
from outside the flow: ring changes, local change hints, and lost schedule
CASes, whose rows it reads again (docs/decisions.md has the diagram).

Storage outages. Every table error is logged and retried with backoff; the
service never stops for one. Rows already held keep ticking on their local
schedule; their updates wait in the persister (the newest per row wins, CAS
against the etag the row was loaded with until a write succeeds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import timedelta

from orleanspy.clock import Clock
from orleanspy.identity import SiloAddress
from orleanspy.membership.lease import OwnershipLease, guard
from orleanspy.metrics import ReminderMetrics
from orleanspy.options import ReminderOptions
from orleanspy.reminders._service.adaptive import LoadSignals, adapted_bucket_size, default_load
from orleanspy.reminders._service.backfill import BackfillRunner
from orleanspy.reminders._service.counting import Counts
from orleanspy.reminders._service.dead_letters import DeadLetters
from orleanspy.reminders._service.delivery import TRANSIENT_ERRORS, Deliver, Delivery
from orleanspy.reminders._service.features import ServiceFeatures
from orleanspy.reminders._service.history import History, NoHistory
from orleanspy.reminders._service.lanes import LaneDrainer
from orleanspy.reminders._service.loader import Loader
from orleanspy.reminders._service.missed import MissedNotifier, PublishMissed
from orleanspy.reminders._service.ownership import Ownership
from orleanspy.reminders._service.persist import Persister
from orleanspy.reminders._service.ticker import Ticker
from orleanspy.reminders._service.window import DueWindow
from orleanspy.reminders.model import ReminderChange, ScheduleUpdate
from orleanspy.reminders.stores import BackfillStore
from orleanspy.reminders.table import PausableReminderTable, ReminderTable, subscribe
from orleanspy.ring import RingRange

__all__ = ["TRANSIENT_ERRORS", "LoadSignals", "ReminderService", "ReminderServiceStats"]

log = logging.getLogger(__name__)

#: Upper bound, in seconds of real time, of the final flush at shutdown.
FINAL_FLUSH_SECONDS = 5.0
#: Upper bound of the fire history's share of it (best effort: what is still
#: buffered then is dropped, so a history backlog does not stretch every stop).
HISTORY_FLUSH_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class ReminderServiceStats:
    """A snapshot of the service's state and counters (counters only grow).

    ``loaded``: rows in the due-heap; ``queued``: due rows waiting for a permit;
    ``in_flight``: deliveries running; ``resident``: every row held (heap and
    due), never above ``bucket_size`` except briefly for dropped rows whose
    delivery is still finishing; ``high_water``: the most rows ever resident;
    ``rotated``: rows released after their tick to make room for a row waiting
    outside a full window. ``grain_retries``: attempts queued under a row's
    ``RetryPolicy``; ``retries_given_up``: retries dropped because the next slot
    came first; ``ended``: rows removed after their last slot (delivered or
    skipped; the repair pass's ends are in ``repaired``); ``fenced``: Dead
    incarnations fenced in the table (``fence``); ``deduplicated``: ticks not
    run again because the grain's state had committed their occurrence
    (``PersistentState.write(tick=...)``). ``dead_lettered``: ticks that failed
    their last attempt; ``dead_letters_written``: those written to the table
    as dead letters; ``deadline_exceeded``: runs cancelled at their deadline;
    ``overlap_skipped``: slots skipped because the row's previous tick still
    ran (``OverlapPolicy``); ``catchup_skipped``: slots older than their row's
    catch-up window; ``counts_written``: row counter deltas written;
    ``backfilled``: backfilled slots the grain acknowledged; ``backfill_failed``:
    backfilled slots whose grain raised; ``backfills_running``: backfills this
    silo runs now."""

    bucket_size: int
    loaded: int
    queued: int
    in_flight: int
    resident: int
    high_water: int
    persist_pending: int
    delivered: int
    grain_errors: int
    retries: int
    missed: int
    skipped: int
    notified: int
    repaired: int
    cas_conflicts: int
    persisted: int
    persist_failures: int
    refills: int
    load_errors: int
    evicted: int
    rotated: int = 0
    grain_retries: int = 0
    retries_given_up: int = 0
    ended: int = 0
    fenced: int = 0
    deduplicated: int = 0
    dead_lettered: int = 0
    dead_letters_written: int = 0
    deadline_exceeded: int = 0
    overlap_skipped: int = 0
    catchup_skipped: int = 0
    counts_written: int = 0
    backfilled: int = 0
    backfill_failed: int = 0
    backfills_running: int = 0
    #: Rows read back behind a schedule this silo had written (a write the store
    #: acknowledged and lost in a failover): the schedule was kept, not replayed.
    rolled_back: int = 0


class ReminderService:
    """Delivers the ticks of the reminder rows in this silo's ring ranges.

    ``deliver(entry, status)`` makes the grain call ``receive_reminder`` and
    returns its answer on acknowledgement (``TICK_DEDUPLICATED``: the grain did
    not run it again). If it raises one of ``TRANSIENT_ERRORS`` the
    same tick is retried with backoff; any other exception is the grain's own
    failure: logged, counted, and the tick counts as delivered (retried only
    under the row's ``RetryPolicy``).
    ``publish_missed`` receives a ``MissedReminder`` for NOTIFY rows. ``load``
    gives the signals for the adaptive bucket size (``options.adaptive``).
    ``metrics`` records ticks, reads and writes (default: nothing).
    ``lease`` (a cluster silo's ``OwnershipLease``) is consulted before every
    delivery: while it is not held no tick is delivered; a tick that waited
    for it is retried, so a row that moved meanwhile is not delivered here.
    A revoked lease (the silo was declared Dead) stops every delivery at once.
    ``level`` gives the cluster's feature level (``membership.agreement.
    cluster_level``; default: this release's): tick deadlines, dead letters and
    per-row counters are used only while it reaches their ``Feature``.
    """

    def __init__(
        self,
        table: ReminderTable,
        *,
        deliver: Deliver,
        clock: Clock,
        options: ReminderOptions,
        publish_missed: PublishMissed | None = None,
        load: Callable[[], LoadSignals] | None = None,
        name: str = "",
        metrics: ReminderMetrics | None = None,
        lease: OwnershipLease | None = None,
        level: Callable[[], int] | None = None,
    ) -> None:
        if lease is not None:
            deliver = guard(deliver, lease)
        features = ServiceFeatures(level)
        self._table = table
        self._name = name
        load = load or default_load
        self._ownership = Ownership()
        self._window = window = DueWindow(
            adapted_bucket_size(options, load, name),
            enable_priority=options.enable_priority,
            name=name,
        )
        self._notifier = notifier = MissedNotifier(publish_missed, name)
        # Fire history goes to the table from its own task (``_service.history``).
        self._history: History | None = None
        history: NoHistory | None = None
        if options.history_size and isinstance(table, PausableReminderTable):
            self._history = history = History(table, keep=options.history_size, silo=name)
        self._persister = persister = Persister(
            table,
            clock,
            options,
            self._persisted,
            metrics=metrics,
            # An ended row's final record must reach its history before the row ends.
            before_removals=None if self._history is None else self._history.flush,
            counts=Counts(table, features),
            letters=DeadLetters(table, clock, options, features, silo=name),
        )
        self._delivery = delivery = Delivery(
            clock,
            options,
            window,
            persister,
            notifier,
            deliver=deliver,
            name=name,
            metrics=metrics,
            history=history,
            features=features,
        )
        self._drainer = LaneDrainer(window, options.permits, delivery.tick)
        self._ticker = Ticker(clock, window, self._drainer.kick)
        self._loader = Loader(
            table,
            clock,
            options,
            ownership=self._ownership,
            window=window,
            persister=persister,
            notifier=notifier,
            load=load,
            name=name,
            metrics=metrics,
            history=history,
        )
        self._backfills: BackfillRunner | None = None
        if isinstance(table, BackfillStore):
            self._backfills = BackfillRunner(
                table,
                table,
                clock,
                options,
                owns=self._ownership.owns,
                sole=self._ownership.owns_everything,
                deliver=deliver,
                history=history,
                name=name,
            )
        self._running = False
        self._tick_timeout = options.tick_timeout.total_seconds()
        self._clock = clock
        self._handover_delay = options.handover_delay

    # -- public surface ---------------------------------------------------------------

    async def start(self, stack: AsyncExitStack) -> None:
        """Subscribe to the change feed and start the tasks (sleeper, lane drainer,
        persister, loader). Pushes onto ``stack``: cancelling them, then a final
        flush of pending persistence bounded by ``FINAL_FLUSH_SECONDS`` and
        shielded from cancellation."""
        # Subscribe before the first refill so that no change falls in between.
        feed = subscribe(self._table, self._ownership.feed_scope)
        stack.push_async_callback(self._final_flush)
        tasks = [
            asyncio.create_task(coro, name=f"reminders-{part}-{self._name}")
            for part, coro in (
                ("ticker", self._ticker.run()),
                ("drainer", self._drainer.run()),
                ("persister", self._persister.run()),
                ("loader", self._loader.run()),
                ("feed", self._loader.follow(feed)),
                *([("history", self._history.run())] if self._history else []),
                *([("backfill", self._backfills.run())] if self._backfills else []),
            )
        ]
        stack.push_async_callback(_cancel, tasks)
        stack.callback(self._delivery.close)
        self._running = True
        log.info(
            "reminder service started name=%s bucket_size=%d", self._name, self._window.bucket_size
        )

    def set_ranges(self, ranges: Sequence[RingRange], from_live: Sequence[RingRange] = ()) -> None:
        """Own exactly ``ranges`` from now on (called on every ring change).

        Rows outside them leave memory at once, including due rows still waiting
        for a permit; a delivery already running finishes (at least once). Newly
        owned ranges are read right away, except ``from_live``: the part taken
        over from a silo that is still alive, read ``handover_delay`` later
        (that silo finishes its ticks in flight and writes their schedules
        meanwhile; ``ReminderOptions.handover_delay``).
        """
        delay = self._handover_delay
        if from_live and delay:
            until = self._clock.now() + delay
            new = self._ownership.assign(ranges, hold=from_live, until=until)
        else:
            new = self._ownership.assign(ranges)
        self._window.retain(lambda row: self._ownership.owns(row.entry.grain_id))
        self._loader.ranges_changed(new)
        self.kick_backfills()
        log.info(
            "reminder ranges changed name=%s ranges=%d new=%d held=%d resident=%d",
            self._name,
            len(self._ownership.ranges),
            len(new),
            len(from_live) if delay else 0,
            len(self._window),
        )

    def fence(self, silo: SiloAddress, *, keep: timedelta | None = None) -> None:
        """``silo`` (that incarnation) is Dead: fence it in the table before the
        next read, so the rows this service takes over from it are read only
        once the table refuses its schedule writes (``FencingReminderTable``),
        and no tick it still delivers is persisted as progress. Call it before
        ``set_ranges`` of the ring change its death causes. ``keep``: fences
        older than that may be pruned meanwhile. A no-op on a table that does
        not fence."""
        self._loader.fence(silo, keep)

    def kick_backfills(self) -> None:
        """Look for backfills to run now (one was asked for here, or the owned
        ranges changed); otherwise they are looked for every ``poll_interval``."""
        if self._backfills is not None:
            self._backfills.kick()

    def notify_change(self, change: ReminderChange) -> None:
        """Take a change of the table into account (from the feed or a local hint).

        A removal drops the row. A change of a row not held, due inside the
        window, or of a held row that another writer moved, schedules a read of
        the row; the echo of this service's own write is ignored.
        """
        self._loader.notify_change(change)

    async def refill_now(self) -> None:
        """Run a full refill and return when one that began after this call finished.

        Before ``start`` the refill runs inline. Errors are retried by the loader
        (this call waits until a refill succeeds)."""
        if not self._running:
            await self._loader.refill(self._ownership.ranges)
            return
        await self._loader.request_refill()

    async def wait_persisted(self) -> None:
        """Return once no schedule update is waiting to be written."""
        await self._persister.wait_idle()

    async def drain(self, timeout: float | None = None) -> bool:
        """Hand over cleanly: deliver nothing more, let the ticks in flight finish
        and write every schedule update; ``True`` if all of that happened within
        ``timeout`` seconds of real time (default: ``tick_timeout`` plus
        ``FINAL_FLUSH_SECONDS``), else ``False`` (the rest is left: those ticks
        may repeat on the next owner, at least once). Never raises.

        A stopping silo calls it before it tells the cluster it is leaving, so
        the next owners of its ranges read the table after its last write and
        no slot is delivered twice. The rows stay held until the ranges change;
        the service's tasks keep running until the start stack closes.
        """
        if timeout is None:
            timeout = self._tick_timeout + FINAL_FLUSH_SECONDS
        self._drainer.stop_taking()
        in_flight = self._drainer.in_flight
        try:
            async with asyncio.timeout(timeout):
                if self._backfills is not None:
                    # A backfilled slot being delivered finishes and its progress
                    # is written before the next owner reads the job.
                    await self._backfills.stop_taking()
                await self._drainer.wait_idle()
                await self._persister.wait_idle()
        except TimeoutError:
            log.warning(
                "reminder hand-over incomplete name=%s in_flight=%d unwritten=%d "
                "(their ticks may repeat on the next owner)",
                self._name,
                self._drainer.in_flight,
                len(self._persister),
            )
            return False
        log.info("reminder service drained name=%s finished_in_flight=%d", self._name, in_flight)
        return True

    @property
    def ranges(self) -> tuple[RingRange, ...]:
        """The ranges owned now: those the ring assigns, less parts taken over
        from a live silo whose ``handover_delay`` has not passed yet."""
        return self._ownership.ranges

    @property
    def stats(self) -> ReminderServiceStats:
        w, d, p, ld = self._window, self._drainer, self._persister, self._loader
        dl = self._delivery
        return ReminderServiceStats(
            bucket_size=w.bucket_size,
            loaded=w.queued,
            queued=len(w.lanes),
            in_flight=d.in_flight,
            resident=len(w),
            high_water=w.high_water,
            persist_pending=len(p),
            delivered=dl.delivered,
            grain_errors=dl.grain_errors,
            retries=dl.retries,
            # The repair pass skips rows in place: each one was missed and skipped.
            missed=dl.missed + ld.repaired,
            skipped=dl.skipped + ld.repaired,
            notified=self._notifier.notified,
            repaired=ld.repaired,
            cas_conflicts=w.cas_conflicts,
            persisted=p.written,
            persist_failures=p.failures,
            refills=ld.refills,
            load_errors=ld.load_errors,
            evicted=ld.evicted,
            rotated=w.rotated,
            grain_retries=dl.grain_retries,
            retries_given_up=dl.retries_given_up,
            ended=dl.ended,
            fenced=ld.fenced,
            deduplicated=dl.deduplicated,
            dead_lettered=dl.dead_lettered,
            dead_letters_written=p.letters.written,
            deadline_exceeded=dl.deadline_exceeded,
            overlap_skipped=dl.overlap_skipped,
            catchup_skipped=dl.catchup_skipped,
            counts_written=p.counts.written,
            backfilled=0 if self._backfills is None else self._backfills.delivered,
            backfill_failed=0 if self._backfills is None else self._backfills.failed,
            backfills_running=0 if self._backfills is None else self._backfills.running,
            rolled_back=ld.rolled_back,
        )

    # -- wiring -----------------------------------------------------------------------

    def _persisted(self, update: ScheduleUpdate, etag: str | None, key: str) -> None:
        """A schedule write's outcome: the window adopts it; a lost CAS also has
        the loader read the row again (schedule CASes are not published, so no
        change would bring it back)."""
        self._window.persisted(update, etag, key)
        if etag is None:
            self._loader.reread(update.grain_id, update.name)

    # -- shutdown ---------------------------------------------------------------------

    async def _final_flush(self) -> None:
        """Write what the stopping service still holds, within ``FINAL_FLUSH_SECONDS``.

        The schedule updates (what at-least-once rests on) and the fire history
        (best effort, within ``HISTORY_FLUSH_SECONDS``) are written side by side,
        each on its own connection: a history backlog, slower to write on
        PostgreSQL, must neither delay the schedules nor use up their budget."""

        async def history() -> None:
            if self._history is None:
                return
            try:
                async with asyncio.timeout(HISTORY_FLUSH_SECONDS):
                    await self._history.flush()
            except TimeoutError:
                log.warning(
                    "reminder history not written at stop name=%s records=%d",
                    self._name,
                    self._history.buffered,
                )

        async def bounded() -> int:
            try:
                async with asyncio.timeout(FINAL_FLUSH_SECONDS):
                    left, _ = await asyncio.gather(self._persister.flush(), history())
                    return left
            except TimeoutError:
                return len(self._persister)

        self._running = False
        # Shielded: a cancelled shutdown still gets its bounded flush.
        left = await asyncio.shield(asyncio.ensure_future(bounded()))
        if left:
            log.warning(
                "reminder updates not persisted at stop name=%s rows=%d (their ticks repeat)",
                self._name,
                left,
            )


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            log.error("reminder service task failed error=%r", result)
