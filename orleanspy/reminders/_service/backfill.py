"""Running backfills: the jobs of the rows this silo owns, slot after slot.

``BackfillRunner.run`` reads the store's jobs (``stores.BackfillStore``) every
``JOB_POLL`` (a second: a backfill asked for through another silo starts that
soon; the read is one small hash or table, empty most of the time), and at once
when kicked (a backfill asked for on this silo, or the owned ranges changed).
A silo that owns the whole ring (``sole``: no other Active silo, so every
backfill is asked for on it and kicks it) reads them every ``poll_interval``
only: a lone silo on a ``ManualClock`` moved by months would otherwise wake
every second of them. It starts one task per job whose row this silo owns, at most
``backfill_concurrency`` at a time. A job's task delivers its slots in order
(``backfill.backfill_schedule``), each a grain call ``receive_reminder`` with
``TickStatus.backfill`` and the slot as ``current_tick_time``, at most
``backfill_rate`` per second (paced on the silo's clock), and after each slot
writes the job's progress with a compare-and-swap on its etag:

* so the progress is durable: a silo that stops or dies mid-backfill leaves the
  job at the slot after the last one written, and the next owner of the row
  goes on from there (the slot in flight when it died is delivered again, with
  the same ``occurrence_id``; a grain that commits ticks runs it once);
* a lost swap means the job was cancelled (removed) or written by another
  runner (an ownership move): the task reads it again and stops, or goes on
  from the progress it finds. Before each slot after the first the task reads
  the job too, so a cancel stops it before the next slot (a slot already being
  delivered finishes). The slots run whether or not the reminder is paused
  (a backfill is an operator's explicit request).

The task stops when the silo no longer owns the row (its new owner picks the
job up), when the service drains for a graceful stop (``stop_taking``: a slot
being delivered finishes and its progress is written first), and, after the
last slot, removes the job. A slot whose call fails on
the call path (``delivery.TRANSIENT_ERRORS``) is retried with backoff; a slot
whose ``receive_reminder`` raises is counted as failed and the backfill goes
on (it is recorded in the fire history). A row that is gone ends its job.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from orleanspy._retry import Backoff
from orleanspy._tasks import raise_if_cancelled
from orleanspy.clock import Clock
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders._service.delivery import TRANSIENT_ERRORS, Deliver
from orleanspy.reminders._service.history import NoHistory
from orleanspy.reminders._service.ticker import sleep_or_wake
from orleanspy.reminders.backfill import BackfillJob, backfill_schedule
from orleanspy.reminders.model import (
    TICK_DEDUPLICATED,
    FireOutcome,
    ReminderEntry,
    TickStatus,
    error_text,
)
from orleanspy.reminders.schedule import Schedule
from orleanspy.reminders.stores import BackfillStore
from orleanspy.reminders.table import ReminderTable

__all__ = ["JOB_POLL", "BackfillRunner"]

log = logging.getLogger(__name__)

_MS = timedelta(milliseconds=1)
#: How often the jobs are read, at most (``poll_interval`` when that is shorter).
JOB_POLL = timedelta(seconds=1)


class BackfillRunner:
    """Runs the backfills of the rows ``owns`` says this silo owns (module docstring).

    Counters (they only grow): ``delivered`` slots acknowledged by the grain,
    ``failed`` slots whose grain raised, ``finished`` jobs run to their end.
    """

    def __init__(
        self,
        store: BackfillStore,
        table: ReminderTable,
        clock: Clock,
        options: ReminderOptions,
        *,
        owns: Callable[[GrainId], bool],
        sole: Callable[[], bool] = lambda: False,
        deliver: Deliver,
        history: NoHistory | None = None,
        name: str = "",
    ) -> None:
        self._store = store
        self._table = table
        self._clock = clock
        self._options = options
        self._owns = owns
        self._sole = sole
        self._deliver = deliver
        self._history = history or NoHistory()
        self._name = name
        self._wake = asyncio.Event()
        self._running: dict[str, asyncio.Task[None]] = {}
        # Jobs between the start of a slot's delivery and its progress write.
        self._busy: set[str] = set()
        self._stopping = False
        self.delivered = 0
        self.failed = 0
        self.finished = 0

    def kick(self) -> None:
        """Look at the jobs now (one was asked for, or the owned ranges changed)."""
        self._wake.set()

    @property
    def running(self) -> int:
        """Jobs this silo runs now."""
        return len(self._running)

    async def stop_taking(self) -> None:
        """Start no slot from now on (a graceful stop): jobs waiting for their next
        slot stop now; a slot being delivered finishes, its progress written, then
        its job stops. Returns once no job runs (the caller bounds the wait)."""
        self._stopping = True
        for key, task in list(self._running.items()):
            if key not in self._busy:
                task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def run(self) -> None:
        """Start the owned jobs' tasks until cancelled (then cancel them)."""
        opts = self._options
        backoff = Backoff(opts.retry_initial, opts.retry_max)
        try:
            while True:
                self._wake.clear()
                try:
                    jobs = await self._store.read_backfills()
                    backoff.reset()
                except Exception as exc:
                    raise_if_cancelled()
                    log.warning("backfill jobs not read name=%s error=%r", self._name, exc)
                    wait = self._clock.now() + timedelta(seconds=backoff.next())
                    await sleep_or_wake(self._clock, wait, self._wake)
                    continue
                for job in jobs:
                    if self._stopping or len(self._running) >= opts.backfill_concurrency:
                        break
                    if job.key in self._running or not self._owns(job.grain_id):
                        continue
                    task = asyncio.create_task(
                        self._run_job(job), name=f"backfill-{self._name}-{job.key}"
                    )
                    self._running[job.key] = task
                    task.add_done_callback(functools.partial(self._done, job.key))
                poll = opts.poll_interval if self._sole() else min(opts.poll_interval, JOB_POLL)
                await sleep_or_wake(self._clock, self._clock.now() + poll, self._wake)
        finally:
            tasks = list(self._running.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _done(self, key: str, task: asyncio.Task[None]) -> None:
        self._running.pop(key, None)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.warning("backfill stopped name=%s key=%s error=%r", self._name, key, error)
        self._wake.set()  # a place is free: another job may start

    # -- one job ------------------------------------------------------------------------

    async def _run_job(self, job: BackfillJob) -> None:
        row = await self._table.read(job.grain_id, job.name)
        if row is None:
            await self._store.remove_backfill(job.grain_id, job.name, job.etag)
            log.info("backfill ended: reminder gone name=%s key=%s", self._name, job.key)
            return
        schedule = backfill_schedule(row, job.start)
        log.info(
            "backfill running name=%s key=%s from=%s done=%d of=%d",
            self._name,
            job.key,
            job.next.isoformat(),
            job.done,
            job.total,
        )
        interval = timedelta(seconds=1 / self._options.backfill_rate)
        last: datetime | None = None
        slot = _first(schedule, job)
        while slot is not None:
            if not self._owns(job.grain_id):
                return  # the row's new owner goes on from the progress written
            if last is not None:
                await self._clock.sleep_until(last + interval)
            if self._stopping or not self._owns(job.grain_id):
                return
            if last is not None and not await self._still_asked(job):
                return  # cancelled while this slot waited for its turn
            self._busy.add(job.key)
            try:
                ok = await self._deliver_slot(row, slot)
                if ok is None:
                    return  # ownership moved while the call path failed
                last = self._clock.now()
                following = schedule.next_after(slot)
                mark = job.end if following is None or following >= job.end else following
                moved = await self._advance(job, job.advanced(mark, ok=ok))
            finally:
                self._busy.discard(job.key)
            if moved is None:
                return  # cancelled
            job = moved
            slot = _first(schedule, job)
        if await self._store.remove_backfill(job.grain_id, job.name, job.etag):
            self.finished += 1
            log.info(
                "backfill done name=%s key=%s delivered=%d failed=%d",
                self._name,
                job.key,
                job.delivered,
                job.failed,
            )

    async def _deliver_slot(self, row: ReminderEntry, slot: datetime) -> bool | None:
        """Deliver one backfilled slot: ``True`` if the grain acknowledged it,
        ``False`` if it raised, ``None`` if the silo lost the row while the call
        path kept failing."""
        opts = self._options
        backoff = Backoff(opts.retry_initial, opts.retry_max)
        deadline = opts.tick_timeout.total_seconds()
        while True:
            now = self._clock.now()
            status = TickStatus(
                first_tick_time=row.start_at,
                period=row.period,
                cron=row.cron,
                current_tick_time=slot,
                delivered_at=now,
                priority=int(row.priority),
                due_at=slot,
                payload=row.payload,
                backfill=True,
            )
            try:
                answer = await self._deliver(row, status, deadline)
            except TRANSIENT_ERRORS as exc:
                log.info("backfill slot retry name=%s key=%s error=%r", self._name, row.key, exc)
                await self._clock.sleep(backoff.next())
                if not self._owns(row.grain_id):
                    return None
                continue
            except Exception as exc:
                self.failed += 1
                self._history.fired(
                    row, slot, now, FireOutcome.GRAIN_ERROR, error_text(exc), backfill=True
                )
                log.warning(
                    "backfill slot failed in grain name=%s key=%s slot=%s error=%s",
                    self._name,
                    row.key,
                    slot.isoformat(),
                    error_text(exc),
                )
                return False
            outcome = FireOutcome.DEDUPLICATED if answer == TICK_DEDUPLICATED else FireOutcome.OK
            self.delivered += 1
            self._history.fired(row, slot, now, outcome, backfill=True)
            return True

    async def _still_asked(self, job: BackfillJob) -> bool:
        """Whether the job is still stored (not cancelled) as this runner wrote it
        (one read per slot: the rate bounds it); a store error says yes, and the
        progress write after the slot finds out."""
        try:
            current = await self._store.read_backfill(job.grain_id, job.name)
        except Exception as exc:
            raise_if_cancelled()
            log.warning("backfill job not read name=%s error=%r", self._name, exc)
            return True
        if current is None or current.created != job.created:
            log.info("backfill cancelled name=%s key=%s", self._name, job.key)
            return False
        return True

    async def _advance(self, job: BackfillJob, moved: BackfillJob) -> BackfillJob | None:
        """Write ``moved`` over ``job`` (retried while the store is unreachable);
        the job as stored then, or ``None`` when it was cancelled."""
        opts = self._options
        backoff = Backoff(opts.retry_initial, opts.retry_max)
        assert job.etag is not None
        while True:
            try:
                etag = await self._store.update_backfill(moved, job.etag)
                if etag is not None:
                    return moved.with_etag(etag)
                # Cancelled, or written by another runner: go on from what is there.
                current = await self._store.read_backfill(job.grain_id, job.name)
            except Exception as exc:
                raise_if_cancelled()
                log.warning("backfill progress not written name=%s error=%r", self._name, exc)
                await self._clock.sleep(backoff.next())
                continue
            if current is None or current.created != job.created:
                log.info("backfill cancelled name=%s key=%s", self._name, job.key)
                return None
            return current


def _first(schedule: Schedule, job: BackfillJob) -> datetime | None:
    """The job's next slot to deliver (the first at or after ``job.next``), or
    ``None`` once it is past the range."""
    slot = schedule.next_after(job.next - _MS)
    return slot if slot is not None and slot < job.end else None
