"""Batched schedule persistence with retry.

After a tick is acknowledged the service submits a ``ScheduleUpdate`` (a CAS of
``next_due``/``last_fire`` against the etag the row was loaded with). Updates
are written in batches of up to ``persist_batch`` — one ``update_schedule_many``
round trip when the table offers it, else concurrent ``update_schedule`` calls.

Per row only the latest update matters: a newer one supersedes a pending older
one. When a write succeeds while a newer update for the same row waits, the
newer one is rebased onto the new etag; when it loses its CAS, the newer one
(same stale etag) is discarded with it. Storage errors keep the updates pending
and the batch is retried with backoff, for as long as it takes.

Unknown outcomes. A write that failed with a storage error (a timeout, a
dropped connection) may still have been applied — a frozen Redis runs it when
it wakes up. Such updates are remembered. When a later CAS of the row then
fails, the row is read back before anything is decided: if it holds the
``next_due``/``last_fire`` of one of our unconfirmed writes, that write was
ours and applied. The row keeps its local schedule, adopts the stored etag,
and the newest update is written on top of it. Only a row that holds someone
else's schedule counts as moved by another writer.

Removals. A row whose schedule ended (``ScheduleUpdate.remove``) is removed
against its etag in the same pipeline, so it supersedes and is rebased like any
update of the row, and is written only after the tick it follows.

Counters and dead letters. The per-row counters waiting in ``counts`` are
written beside every batch (concurrently, each in its own round trip: never
one per tick), and the dead letters waiting in ``letters`` before it, so a
slot's letter is stored before the progress that moves past it.

Under a stream of ticks a partial batch is not written before ``LINGER_S``
(real time) has passed since the previous write ended: ticks finish a few at a
time, and a round trip per handful of rows costs more than the rows themselves.
A full batch, or the first update after a quiet spell, is written at once.
Persistence then lags the tick by at most that much more, which only widens the
at-least-once window of a crash.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime

from orleanspy._retry import Backoff
from orleanspy._tasks import raise_if_cancelled
from orleanspy.clock import Clock, to_ms
from orleanspy.metrics import ReminderMetrics
from orleanspy.options import ReminderOptions
from orleanspy.reminders._service.counting import Counts
from orleanspy.reminders._service.dead_letters import DeadLetters
from orleanspy.reminders._service.features import ServiceFeatures
from orleanspy.reminders.model import ScheduleUpdate, row_key
from orleanspy.reminders.table import BatchingReminderTable, EndingReminderTable, ReminderTable

__all__ = ["LINGER_S", "REMOVED", "Persister", "update_key"]

log = logging.getLogger(__name__)

# Unconfirmed writes remembered per row: the first since the last confirmed
# write (all carry the same expected etag, so only the first of them to reach
# the store can apply) and the newest ones.
_UNCERTAIN_PER_ROW = 8

#: How long a partial batch waits for more updates before it is written.
LINGER_S = 0.025
#: The "etag" a removal (``ScheduleUpdate.remove``) reports when it took place.
REMOVED = ""


def update_key(update: ScheduleUpdate) -> str:
    """The row key of an update (same form as ``ReminderEntry.key``)."""
    return row_key(update.grain_id, update.name)


class Persister:
    """Writes schedule updates; reports each outcome to
    ``on_result(update, etag | None, key)``.

    ``on_result`` gets the new etag, or ``None`` for a lost CAS (row gone or
    moved by another writer), and the row's key (``update_key(update)``). It is
    not called for updates that are still pending when the persister stops.
    ``before_removals`` (the fire history's flush) is awaited before a batch
    that removes ended rows, so their final records are in before they go.
    ``counts`` and ``letters`` (module docstring) are written with the batches;
    by default the table's, used while the cluster's level allows.
    """

    def __init__(
        self,
        table: ReminderTable,
        clock: Clock,
        options: ReminderOptions,
        on_result: Callable[[ScheduleUpdate, str | None, str], None],
        *,
        metrics: ReminderMetrics | None = None,
        before_removals: Callable[[], Awaitable[None]] | None = None,
        counts: Counts | None = None,
        letters: DeadLetters | None = None,
    ) -> None:
        self._table = table
        features = ServiceFeatures()
        self.counts = counts if counts is not None else Counts(table, features)
        self.letters = (
            letters if letters is not None else DeadLetters(table, clock, options, features)
        )
        self.counts.waiting = self._waits
        self._before_removals = before_removals
        self.metrics = metrics or ReminderMetrics()
        self._batching = isinstance(table, BatchingReminderTable)
        self._clock = clock
        self._options = options
        self._on_result = on_result
        self._pending: dict[str, ScheduleUpdate] = {}
        self._writing: dict[str, ScheduleUpdate] = {}
        # Writes whose outcome is unknown (they raised), per row key.
        self._uncertain: dict[str, list[ScheduleUpdate]] = {}
        # Rows rewritten by a management call that kept their schedule: old etag
        # -> new etag, for writes made against the old one still in flight.
        self._rebased: dict[str, tuple[str, str]] = {}
        # Key sets of readers that want to know which rows' stored state changed.
        self._watchers: list[set[str]] = []
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.written = 0
        self.failures = 0
        self.recognised = 0
        self._last_write_end = float("-inf")  # loop time

    def _waits(self, key: str) -> bool:
        return key in self._pending

    def __len__(self) -> int:
        """Rows with an update not yet written."""
        return len(self._pending.keys() | self._writing.keys())

    def submit(self, update: ScheduleUpdate, key: str) -> None:
        """Queue ``update`` of the row ``key`` (``update_key(update)``, which the
        caller holds: formatting it again is a measurable share of a tick); it
        supersedes any pending update of the same row."""
        self._pending[key] = update
        self._idle.clear()
        self._ready.set()

    def rebase(self, key: str, old_etag: str, new_etag: str) -> None:
        """The row was rewritten from ``old_etag`` to ``new_etag`` by someone who
        kept its schedule (a management call): a pending update made against the
        old etag now applies to the new one."""
        pending = self._pending.get(key)
        if pending is not None and pending.etag == old_etag:
            self._pending[key] = replace(pending, etag=new_etag)
        writing = self._writing.get(key)
        if writing is not None and writing.etag == old_etag:
            # Its CAS will fail on the new etag: it is written again on top.
            self._rebased[key] = (old_etag, new_etag)

    def discard(self, key: str) -> None:
        """Forget the pending update of row ``key`` (its schedule was replaced)."""
        self._pending.pop(key, None)
        self._uncertain.pop(key, None)
        self._rebased.pop(key, None)
        if not self._pending and not self._writing:
            self._idle.set()

    def latest(self, key: str) -> ScheduleUpdate | None:
        """The newest unwritten update of row ``key``."""
        return self._pending.get(key) or self._writing.get(key)

    def wrote(self, key: str, next_due: datetime) -> bool:
        """Whether an unwritten or unconfirmed update of row ``key`` carries
        ``next_due`` (to tell the echo of our own write on the change feed from
        another writer's change)."""
        due_ms = to_ms(next_due)
        return any(
            u is not None and to_ms(u.next_due) == due_ms
            for u in (
                self._pending.get(key),
                self._writing.get(key),
                *self._uncertain.get(key, ()),
            )
        )

    @contextmanager
    def watch(self) -> Iterator[set[str]]:
        """Collect, while the block runs, the keys of rows whose write outcome
        arrived (their stored state changed): a bulk read running meanwhile may
        have returned their old state."""
        touched: set[str] = set()
        self._watchers.append(touched)
        try:
            yield touched
        finally:
            self._watchers.remove(touched)

    async def wait_idle(self) -> None:
        """Return once nothing is pending or being written (for tests and tools)."""
        await self._idle.wait()

    async def run(self) -> None:
        """Write until cancelled; back off while the table fails."""
        backoff = Backoff(self._options.retry_initial, self._options.retry_max)
        while True:
            while not self._pending:
                self._ready.clear()
                await self._ready.wait()
            if len(self._pending) < self._options.persist_batch:
                loop = asyncio.get_running_loop()
                wait = self._last_write_end + LINGER_S - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
            ok = await self._write_batch()
            self._last_write_end = asyncio.get_running_loop().time()
            raise_if_cancelled()
            if ok:
                backoff.reset()
            else:
                await self._clock.sleep(backoff.next())

    async def flush(self) -> int:
        """Try each pending update once, without backoff; return how many remain.

        Used at shutdown (bounded by the caller): updates that cannot be written
        now are left, and their ticks repeat on the next owner (at least once).
        """
        attempts = len(self._pending)
        while self._pending and attempts > 0:
            attempts -= min(attempts, self._options.persist_batch)
            if not await self._write_batch():
                break
        # What waited for a batch that never came (a tick's failed attempt).
        if self.letters.pending:
            await self.letters.write()
        if self.counts.pending:
            await self.counts.write()
        return len(self._pending)

    async def _write_batch(self) -> bool:
        keys = list(self._pending)[: self._options.persist_batch]
        batch = [self._pending.pop(k) for k in keys]
        self._writing.update(zip(keys, batch, strict=True))
        results: Sequence[str | BaseException | None]
        self.metrics.persisted(len(batch))
        try:
            letters_ok = not self.letters.pending or await self.letters.write()
        except asyncio.CancelledError:
            self._requeue(batch)
            self._writing_done(keys)
            raise
        if not letters_ok:
            # A slot's letter before the progress past it (module docstring):
            # the batch waits for the store with it.
            self.failures += 1
            self._requeue(batch)
            self._writing_done(keys)
            return False
        try:
            if self.counts.pending:
                results, _ = await asyncio.gather(self._write(batch), self.counts.write(keys))
            else:
                results = await self._write(batch)
        except asyncio.CancelledError:
            self._requeue(batch)
            self._writing_done(keys)
            raise
        except Exception as exc:
            self.failures += 1
            log.warning("reminder persistence failed rows=%d error=%r", len(batch), exc)
            self._remember(batch)
            self._requeue(batch)
            self._writing_done(keys)
            return False
        ok = True
        lost: list[ScheduleUpdate] = []
        for key, update, result in zip(keys, batch, results, strict=True):
            if isinstance(result, BaseException):
                ok = False
                self.failures += 1
                log.warning("reminder persistence failed key=%s error=%r", key, result)
                self._remember([update])
                self._requeue([update])
            elif result is None and key in self._uncertain:
                lost.append(update)
            else:
                self._settle(update, result, key)
        if lost:
            try:
                ok = await self._recognise(lost) and ok
            finally:
                self._writing_done(keys)
        else:
            self._writing_done(keys)
        if not self._pending and not self._writing:
            self._idle.set()
        return ok

    def _writing_done(self, keys: list[str]) -> None:
        for k in keys:
            self._writing.pop(k, None)

    def _remember(self, batch: list[ScheduleUpdate]) -> None:
        for update in batch:
            seen = self._uncertain.setdefault(update_key(update), [])
            seen.append(update)
            if len(seen) > _UNCERTAIN_PER_ROW:
                del seen[1]

    async def _recognise(self, lost: list[ScheduleUpdate]) -> bool:
        """Settle CASes that failed after unconfirmed writes of the same rows: read
        each row and tell our own applied write from another writer's change."""
        reads = await asyncio.gather(
            *(self._table.read(u.grain_id, u.name) for u in lost), return_exceptions=True
        )
        ok = True
        for update, row in zip(lost, reads, strict=True):
            key = update_key(update)
            if isinstance(row, BaseException):
                ok = False
                log.warning("reminder persistence re-read failed key=%s error=%r", key, row)
                self._requeue([update])
                continue
            mine = None
            if row is not None and row.etag is not None:
                stored = (to_ms(row.next_due), _ms(row.last_fire))
                mine = next(
                    (
                        u
                        for u in reversed(self._uncertain.get(key, []))
                        if u.etag == update.etag and (to_ms(u.next_due), _ms(u.last_fire)) == stored
                    ),
                    None,
                )
            if mine is None or row is None or row.etag is None:
                self._uncertain.pop(key, None)
                self._settle(update, None, key)
                continue
            # Our unconfirmed write was applied: the row is ours at its new etag.
            self.recognised += 1
            log.info("reminder write recognised as applied key=%s", key)
            self._settle(mine, row.etag, key)
            if update is not mine and key not in self._pending:
                moved = (update.next_due, update.last_fire) != (mine.next_due, mine.last_fire)
                if moved:
                    self._pending[key] = replace(update, etag=row.etag)
                    self._ready.set()
        return ok

    async def _write(self, batch: list[ScheduleUpdate]) -> Sequence[str | BaseException | None]:
        if any(u.remove for u in batch):
            return await self._write_with_removals(batch)
        if self._batching:
            table: BatchingReminderTable = self._table  # type: ignore[assignment]
            return await table.update_schedule_many(batch)
        return await asyncio.gather(
            *(
                self._table.update_schedule(u.grain_id, u.name, u.etag, u.next_due, u.last_fire)
                for u in batch
            ),
            return_exceptions=True,
        )

    async def _write_with_removals(
        self, batch: list[ScheduleUpdate]
    ) -> Sequence[str | BaseException | None]:
        """A batch holding removals (rows whose schedule ended): the CASes as usual,
        each removal as ``end`` (``remove`` on a table that cannot end rows) against
        its etag. A removal that took place
        reports ``REMOVED`` as its etag, a lost one ``None``, as a lost CAS."""
        if self._before_removals is not None:
            # The fire history's buffered records first (the final ticks' among
            # them): records of a row that is gone are dropped.
            await self._before_removals()
        cas = [u for u in batch if not u.remove]
        gone = [u for u in batch if u.remove]
        # An ending table keeps the ended row's history readable.
        table = self._table
        end = table.end if isinstance(table, EndingReminderTable) else table.remove
        removed, written = await asyncio.gather(
            asyncio.gather(
                *(end(u.grain_id, u.name, u.etag) for u in gone), return_exceptions=True
            ),
            self._write(cas) if cas else _nothing(),
        )
        by_update: dict[int, str | BaseException | None] = {}
        for u, ok in zip(gone, removed, strict=True):
            by_update[id(u)] = ok if isinstance(ok, BaseException) else (REMOVED if ok else None)
        for u, etag in zip(cas, written, strict=True):
            by_update[id(u)] = etag
        return [by_update[id(u)] for u in batch]

    def _requeue(self, batch: list[ScheduleUpdate]) -> None:
        for update in batch:
            # A newer update submitted meanwhile supersedes the failed one.
            self._pending.setdefault(update_key(update), update)

    def _settle(self, update: ScheduleUpdate, etag: str | None, key: str) -> None:
        for touched in self._watchers:
            touched.add(key)
        rebased = self._rebased.pop(key, None)
        if etag is None and rebased is not None and rebased[0] == update.etag:
            # Lost only to a management rewrite that kept the schedule: write the
            # same schedule again on the new etag (a newer update supersedes it).
            if key not in self._pending:
                self._pending[key] = replace(update, etag=rebased[1])
                self._ready.set()
            return
        if etag is not None:
            self._uncertain.pop(key, None)
        newer = self._pending.get(key)
        if newer is not None and newer.etag == update.etag:
            if etag is None:
                del self._pending[key]
                # Lost with it: the outcome is the newest schedule's (what the
                # row had reached here), so that is the one reported.
                update = newer
            else:
                self._pending[key] = replace(newer, etag=etag)
        self.written += etag is not None
        self._on_result(update, etag, key)


async def _nothing() -> Sequence[str | BaseException | None]:
    return []


def _ms(t: datetime | None) -> int | None:
    return None if t is None else to_ms(t)
