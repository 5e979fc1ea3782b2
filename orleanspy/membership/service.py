"""``MembershipService``: this silo's view of the cluster and its own row.

It joins (insert Joining, then Active), keeps its heartbeat fresh, re-reads
the table on a timer and after each of its own writes, publishes every newer
snapshot to listeners, sweeps long-dead rows, and leaves gracefully
(ShuttingDown, then Dead). Failure detection runs beside it in
``HealthMonitor``. Nothing else in a silo reads the membership table.

Gossip: after each status change it writes (its own, or a death it declares)
the service tells every other live silo the new table version; a silo told of
a version newer than its own re-reads the table at once. So changes spread in
a network round trip instead of waiting for each silo's periodic read, which
stays as the safety net for gossip that is lost.

Death is final and prompt. A silo learns of its own Dead verdict from the
gossip of the silo that wrote it, or at its next table read (every
``table_refresh_interval``); it then revokes its ownership lease (no more
ticks), stops its loops and calls ``on_declared_dead``. A store that lost its
data (this silo's row gone, or the table version below one already read
without this silo's row as it knows it) is treated the same way, with a
WARNING that says what happened: the silo stops, and a restart joins as a new
incarnation (docs/decisions.md, "A store that lost its data"). A table that
went back in version with this silo's row intact lost its last writes in a
failover (asynchronous replication): the silo adopts it and carries on.

Credentials, versions and ring mode. Each row carries a verifier of the joining
silo's credentials (``membership.credentials``), its release and protocol window
(``orleanspy.versions``) and the ring it builds (``membership.agreement``); a
silo whose verifier differs from that of a live member, whose protocols do not
overlap a live member's, or that insists on another ring, refuses to join,
before it writes anything. Once joined, the service keeps those fields of its
own row true (``_restamp``): a silo that follows the cluster's ring records the
ring it builds when that changes, and a row rewritten by an older silo (a vote)
that dropped fields it did not know gets them back.

Timing reads the injected ``Clock``; only the probe timeout (enforced by the
``ping`` callable) and the bound on the final writes at shutdown run on the
event loop's real time, because they guard I/O rather than schedule work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import timedelta
from typing import Any

from orleanspy.clock import Clock
from orleanspy.errors import MembershipError, SiloDeclaredDeadError, StorageError
from orleanspy.identity import SiloAddress
from orleanspy.membership.agreement import check_ring_mode, check_versions, cluster_ring_mode
from orleanspy.membership.credentials import check_verifier
from orleanspy.membership.health import HealthMonitor, Ping
from orleanspy.membership.lease import ContactLease, lease_duration
from orleanspy.membership.model import MembershipEntry, MembershipSnapshot, SiloStatus
from orleanspy.membership.table import MembershipTable
from orleanspy.options import MembershipOptions
from orleanspy.versions import ProtocolWindow, __version__

__all__ = ["Gossip", "MembershipListener", "MembershipService"]

log = logging.getLogger(__name__)

MembershipListener = Callable[[MembershipSnapshot], None]
# gossip(silo, table_version): tell ``silo`` the table changed; errors are ignored.
Gossip = Callable[[SiloAddress, int], Awaitable[object]]


class MembershipService:
    """Membership for one silo run (``address`` carries its generation).

    ``ping(silo, timeout_seconds)`` probes a peer (see ``health.Ping``);
    ``gossip`` (optional) tells a peer of a new table version, and
    ``gossip_received`` takes such news from one. ``grain_types`` (optional)
    goes into this silo's row: the grain types placement may put here.
    ``on_declared_dead()`` is called once, from a background task, when this
    silo reads itself Dead in the table without having left gracefully, or
    finds that the store lost its data (``stop_reason`` says which); the
    service has then already revoked ``lease`` and stopped its loops, and the
    silo must stop too. ``verifier`` and ``ring_mode`` (optional: ``None``
    records and checks nothing) go into this silo's row and are checked
    against the live members' before joining (``CredentialsMismatchError``,
    ``RingModeMismatchError``; nothing is written then). With ``ring_follows``
    the silo insists on no ring: it records the ring the cluster builds
    (``agreement.cluster_ring_mode`` at join, then ``ring_built``). The row
    also records this release, its protocol window (checked before joining:
    ``IncompatibleVersionError``) and ``schemas``, the store schema versions
    the silo's providers run with.
    """

    def __init__(
        self,
        table: MembershipTable,
        *,
        address: SiloAddress,
        name: str,
        gateway_port: int | None,
        ping: Ping,
        clock: Clock,
        options: MembershipOptions,
        on_declared_dead: Callable[[], None],
        host_name: str = "",
        gossip: Gossip | None = None,
        grain_types: Collection[str] | None = None,
        verifier: str | None = None,
        ring_mode: str | None = None,
        ring_follows: bool = False,
        schemas: Collection[tuple[str, int]] = (),
    ) -> None:
        self._table = table
        self._verifier = verifier
        self._ring_mode = ring_mode
        self._ring_follows = ring_follows
        self._schemas = tuple(sorted(schemas)) or None
        self._restamping: asyncio.Task[None] | None = None
        self.stop_reason: str | None = None
        self._joined = False
        self.address = address
        self.name = name
        self._gateway_port = gateway_port
        self._host_name = host_name
        self._clock = clock
        self._options = options
        self._on_declared_dead = on_declared_dead
        self._snapshot = MembershipSnapshot.empty()
        self._listeners: list[MembershipListener] = []
        self._reads_started = 0
        self._read_applied = 0
        self._published_version = -1
        #: Reads that found the table gone back in version with this silo's row
        #: intact, and were adopted (``_rewind``).
        self.rewinds = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._leaving = False
        self._dead = False
        self._gossip = gossip
        self._grain_types = None if grain_types is None else frozenset(grain_types)
        self._spreading: set[asyncio.Task[None]] = set()
        self._catch_up: asyncio.Task[None] | None = None
        self._catch_up_again = False
        self._gossip_reads = True  # until ``stop_gossip_reads``
        self.lease = ContactLease(
            clock, lease_duration(options), has_peers=self._has_peers, name=name
        )
        self.health = HealthMonitor(
            table,
            address=address,
            ping=ping,
            clock=clock,
            options=options,
            read=self.refresh,
            snapshot=lambda: self._snapshot,
            may_vote=self._may_vote,
            on_death=self._spread,
            on_reached=self.lease.peer_reached,
        )

    # -- the view -----------------------------------------------------------

    @property
    def snapshot(self) -> MembershipSnapshot:
        """The newest snapshot read so far."""
        return self._snapshot

    @property
    def status(self) -> SiloStatus:
        """This silo's status in the newest snapshot (``CREATED`` before joining)."""
        return self._snapshot.status(self.address) or SiloStatus.CREATED

    @property
    def declared_dead(self) -> bool:
        """Whether this silo read itself Dead without leaving gracefully."""
        return self._dead

    def active_silos(self) -> tuple[SiloAddress, ...]:
        """The Active silos of the newest snapshot, sorted."""
        return self._snapshot.active_silos()

    def add_listener(self, listener: MembershipListener) -> Callable[[], None]:
        """Call ``listener(snapshot)`` for every snapshot whose table version is
        higher than any published before, in increasing version order (versions
        written between two reads are not seen separately). A listener added
        after start is called at once with the current snapshot. Listeners run
        synchronously inside the service; an exception is logged and ignored.
        Returns a function that removes the listener."""
        self._listeners.append(listener)
        if self._published_version >= 0:
            self._call(listener, self._snapshot)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    async def refresh(self) -> MembershipSnapshot:
        """Read the table now and publish what is new; returns the newest snapshot.

        Storage errors propagate. A read that completes after a later-started
        read has been applied is discarded, so the view never goes backwards.
        """
        self._reads_started += 1
        seq = self._reads_started
        # What was known when this read began: the table cannot answer with
        # less, unless it lost data.
        known_version = self._snapshot.version.version
        had_row = self._joined and self.address in self._snapshot.entries
        snap = await self._table.read_all()
        # Contact, but not yet proof: a lapsed lease is regained only once this
        # read is known not to say this silo is Dead (below). Regaining it first
        # let held ticks out in the moment before the verdict was applied.
        self.lease.table_written()
        if self._started and not self._leaving and not self._dead:
            if snap.version.version < known_version:
                what = f"the table version went back from {known_version} to {snap.version.version}"
                if not self._own_row_intact(snap):
                    self._store_lost(what)
                    return self._snapshot
                self._rewind(snap, seq, what)
            if had_row and self.address not in snap.entries:
                self._store_lost("this silo's row is gone")
                return self._snapshot
        self._apply(snap, seq)
        if not self._dead and snap.status(self.address) != SiloStatus.DEAD:
            self.lease.table_reached()
        return self._snapshot

    def gossip_received(self, table_version: int) -> None:
        """A peer wrote ``table_version``: re-read the table now, unless this
        silo has seen that version already. Reads caused by gossip never
        overlap: gossip that arrives during one gets one more read after it."""
        if self._started:
            self.lease.peer_reached()
        if not self._started or self._dead or table_version <= self._snapshot.version.version:
            return
        if not self._gossip_reads:
            return
        if self._catch_up is not None and not self._catch_up.done():
            self._catch_up_again = True
            return
        self._catch_up = asyncio.create_task(
            self._catch_up_reads(), name=f"membership:{self.address}:gossip-read"
        )

    # -- life cycle ---------------------------------------------------------

    async def start(self, stack: AsyncExitStack) -> None:
        """Join: write this silo Joining, then Active; then start the loops.

        Lost races on the table version are retried with a fresh read; storage
        errors propagate (a silo cannot start without its table). Pushes the
        cancellation of the loops onto ``stack``; the graceful Dead write is
        ``shutdown()``'s job, so a silo that is torn down without it looks
        crashed to its peers.
        """
        if self._started:
            raise RuntimeError("MembershipService.start() was already called")
        self._started = True
        stack.push_async_callback(self._stop_loops)
        await self._join()
        self._joined = True
        await self.update_status(SiloStatus.ACTIVE)
        log.info("membership joined silo=%s name=%s", self.address, self.name)
        self._spawn(self.health.run(), "probe")
        self._spawn(self._every(self._options.i_am_alive_interval, self._heartbeat), "i-am-alive")
        self._spawn(self._every(self._options.table_refresh_interval, self.refresh), "refresh")
        self._spawn(
            self._every(self._options.defunct_silo_cleanup_interval, self._cleanup), "cleanup"
        )
        # Let the loops take their first step, so their timers are armed by the
        # time start() returns (a test clock advanced next then wakes them).
        await asyncio.sleep(0)

    async def update_status(self, status: SiloStatus) -> None:
        """Write this silo's row with ``status`` (and a fresh heartbeat), retrying
        lost races until it lands, then re-read the table.

        Raises ``SiloDeclaredDeadError`` if the row is already Dead and
        ``status`` is not Dead, ``MembershipError`` if the row is gone.
        """
        while True:
            snap = await self.refresh()
            mine, etag = snap.get(self.address), snap.etag(self.address)
            if mine is None or etag is None:
                raise MembershipError(f"silo {self.address} has no row in the membership table")
            if mine.status == SiloStatus.DEAD:
                if status == SiloStatus.DEAD:
                    return
                raise SiloDeclaredDeadError(f"silo {self.address} is Dead in the table")
            row = self._stamped(mine).with_status(status).with_i_am_alive(self._clock.now())
            version = snap.version.next()
            if await self._table.update_row(row, etag, version):
                self._spread(version.version)
                await self.refresh()
                return
            # Lost to another writer; yield so a table that never suspends
            # cannot turn the retry into a busy loop.
            await asyncio.sleep(0)

    async def shutdown(self) -> bool:
        """Leave gracefully: stop probing, write ShuttingDown (unless this silo
        already wrote it), then Dead; stop the loops.

        The writes are bounded by ``options.shutdown_timeout`` and shielded
        from cancellation: a cancelled caller still waits for them (at most that
        long) before the cancellation goes on. Returns ``True`` if the Dead row
        was written, ``False`` if the store failed or timed out (peers will then
        detect the silo by probing) or the silo never joined or is already
        declared dead.
        """
        if not self._joined or self._dead:
            await self._stop_loops()
            return False
        self._leaving = True
        await self._cancel(lambda t: t.get_name().endswith(":probe"))
        leave = asyncio.ensure_future(self._leave())
        try:
            return await asyncio.shield(leave)
        except asyncio.CancelledError:
            await asyncio.wait([leave])
            raise
        finally:
            await self._stop_loops()

    async def _leave(self) -> bool:
        try:
            async with asyncio.timeout(self._options.shutdown_timeout.total_seconds()):
                if self.status < SiloStatus.SHUTTING_DOWN:
                    await self.update_status(SiloStatus.SHUTTING_DOWN)
                await self.update_status(SiloStatus.DEAD)
        except Exception as exc:  # a timeout included: peers will detect us by probing
            log.warning("membership graceful leave failed silo=%s error=%r", self.address, exc)
            return False
        log.info("membership left silo=%s", self.address)
        return True

    async def _join(self) -> None:
        while True:
            snap = await self.refresh()
            now = self._clock.now()
            # Before anything is written: a silo with other credentials or
            # another ring than the live members' must not take a row, ranges
            # or votes. Checked on every pass: a lost insert re-reads the
            # table and so sees a rival joiner's row.
            check_verifier(self._verifier, snap, self.address, now, self._options)
            check_versions(snap, self.address, now, self._options)
            if self._ring_follows:
                self._ring_mode = cluster_ring_mode(snap)
            else:
                check_ring_mode(self._ring_mode, snap, self.address, now, self._options)
            if await self._bury_earlier_incarnations(snap):
                continue
            existing, etag = snap.get(self.address), snap.etag(self.address)
            if existing is not None and etag is not None:
                # A retried start of the same run: take the row over unless it is Dead.
                if existing.status == SiloStatus.DEAD:
                    raise SiloDeclaredDeadError(f"silo {self.address} is already Dead")
                row = replace(
                    self._stamped(existing).with_status(SiloStatus.JOINING).with_i_am_alive(now),
                    grain_types=self._grain_types,
                )
                ok = await self._table.update_row(row, etag, snap.version.next())
            else:
                row = self._stamped(
                    MembershipEntry(
                        silo=self.address,
                        status=SiloStatus.JOINING,
                        name=self.name,
                        start_time=now,
                        i_am_alive=now,
                        gateway_port=self._gateway_port,
                        host_name=self._host_name,
                        grain_types=self._grain_types,
                        verifier=self._verifier,
                    )
                )
                ok = await self._table.insert_row(row, snap.version.next())
            if ok:
                return
            await asyncio.sleep(0)

    async def _bury_earlier_incarnations(self, snap: MembershipSnapshot) -> bool:
        """Write Dead over a row of an earlier run on this very host and port (it
        crashed: a live one would hold the port). ``True`` if a write was tried,
        so the caller re-reads the table. Peers then drop its grains at once
        instead of waiting for probes to declare it dead."""
        me = self.address
        for silo, (entry, etag) in snap.entries.items():
            if (
                silo.host == me.host
                and silo.port == me.port
                and silo.generation < me.generation
                and entry.status is not SiloStatus.DEAD
            ):
                log.warning("membership: earlier incarnation declared dead silo=%s", silo)
                await self._table.update_row(
                    entry.with_status(SiloStatus.DEAD), etag, snap.version.next()
                )
                return True
        return False

    # -- this silo's own fields ---------------------------------------------

    def _stamped(self, row: MembershipEntry) -> MembershipEntry:
        """``row`` with what this silo records of itself: release, protocol
        window, schema versions and the ring it builds."""
        return replace(
            row,
            ring_mode=self._ring_mode,
            ring_follows=self._ring_follows,
            release=__version__,
            protocols=ProtocolWindow.mine(),
            schemas=self._schemas,
        )

    @property
    def ring_mode(self) -> str | None:
        """The ring this silo records that it builds."""
        return self._ring_mode

    def ring_built(self, mode: str) -> None:
        """A silo that follows the cluster's ring now builds ``mode``: record it
        (a joining silo that insists on a ring compares with this)."""
        if self._ring_follows and mode != self._ring_mode:
            self._ring_mode = mode
            self._check_stamp(self._snapshot)

    def _check_stamp(self, snap: MembershipSnapshot) -> None:
        """Rewrite this silo's row in the background if its own fields are not
        what ``_stamped`` would write (one rewrite at a time)."""
        mine = snap.get(self.address)
        if (
            mine is None
            or not self._joined
            or self._leaving
            or self._dead
            or mine.status is not SiloStatus.ACTIVE
            or mine == self._stamped(mine)
            or (self._restamping is not None and not self._restamping.done())
        ):
            return
        self._restamping = asyncio.create_task(
            self._restamp(), name=f"membership:{self.address}:restamp"
        )

    async def _restamp(self) -> None:
        """CAS-write this silo's row with its own fields, re-reading the table
        after a lost race (a few times: the next read checks again anyway); a
        failed store is left to the next read."""
        try:
            snap = self._snapshot
            for _attempt in range(5):
                mine, etag = snap.get(self.address), snap.etag(self.address)
                if mine is None or etag is None or mine.status is not SiloStatus.ACTIVE:
                    return
                if mine == self._stamped(mine):
                    return
                version = snap.version.next()
                if await self._table.update_row(self._stamped(mine), etag, version):
                    self._spread(version.version)
                    await self.refresh()
                    return
                snap = await self.refresh()
        except StorageError as exc:
            log.warning("membership row rewrite failed silo=%s error=%r", self.address, exc)

    # -- loops --------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.create_task(coro, name=f"membership:{self.address}:{what}")
        self._tasks.append(task)

    async def _every(
        self, interval: timedelta, work: Callable[[], Coroutine[Any, Any, object]]
    ) -> None:
        seconds = interval.total_seconds()
        while True:
            await self._clock.sleep(seconds)
            try:
                await work()
            except StorageError as exc:
                # Outages are expected and already described; the next round retries.
                log.warning(
                    "membership %s failed silo=%s error=%r", work.__name__, self.address, exc
                )
            except Exception:
                log.exception("membership %s failed silo=%s", work.__name__, self.address)

    async def _heartbeat(self) -> None:
        await self._table.update_i_am_alive(self.address, self._clock.now())
        # A dirty write says nothing of this silo's status: it renews the lease
        # but cannot end a lapse (only a read can say it was not declared Dead).
        self.lease.table_written()

    def _has_peers(self) -> bool:
        """Whether another Active silo could declare this one Dead."""
        return any(s != self.address for s in self._snapshot.active_silos())

    async def _cleanup(self) -> None:
        cutoff = self._clock.now() - self._options.defunct_silo_expiration
        deleted = await self._table.delete_dead_before(cutoff)
        if deleted:
            log.info("membership deleted defunct rows silo=%s count=%d", self.address, deleted)

    async def _cancel(self, which: Callable[[asyncio.Task[None]], bool]) -> None:
        doomed = [t for t in self._tasks if which(t) and t is not asyncio.current_task()]
        for task in doomed:
            task.cancel()
        await asyncio.gather(*doomed, return_exceptions=True)

    async def stop_gossip_reads(self) -> None:
        """Read the table on gossip no more: the read under way is cancelled and
        awaited, later gossip is ignored. The silo calls this when it stops
        listening for gossip, before it closes the table's store: a read started
        by gossip that arrived after the loops stopped (a peer leaving at the
        same time) would otherwise run on, or open a connection, past the close."""
        self._gossip_reads = False
        if self._catch_up is not None:
            self._catch_up.cancel()
            await asyncio.gather(self._catch_up, return_exceptions=True)

    async def _stop_loops(self) -> None:
        await self._cancel(lambda t: True)
        for task in (self._catch_up, self._restamping):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        # Gossip already on its way (the Dead row above all) may finish: each
        # send is bounded by the probe timeout.
        spreading = list(self._spreading)
        if spreading:
            await asyncio.wait(spreading, timeout=self._options.probe_timeout.total_seconds())
            for task in spreading:
                task.cancel()
            await asyncio.gather(*spreading, return_exceptions=True)

    # -- gossip -------------------------------------------------------------

    def _spread(self, table_version: int) -> None:
        """Tell every other silo that is not Dead about ``table_version``, in
        the background; a peer that does not answer learns on its next read."""
        gossip = self._gossip
        if gossip is None:
            return
        peers = [
            silo
            for silo, (entry, _etag) in self._snapshot.entries.items()
            if silo != self.address and entry.status < SiloStatus.DEAD
        ]
        for peer in peers:
            task = asyncio.create_task(self._tell(gossip, peer, table_version))
            self._spreading.add(task)
            task.add_done_callback(self._spreading.discard)

    async def _tell(self, gossip: Gossip, peer: SiloAddress, table_version: int) -> None:
        try:
            await gossip(peer, table_version)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("gossip failed silo=%s peer=%s error=%r", self.address, peer, exc)

    async def _catch_up_reads(self) -> None:
        while True:
            self._catch_up_again = False
            try:
                await self.refresh()
            except StorageError as exc:
                log.warning(
                    "membership read after gossip failed silo=%s error=%r", self.address, exc
                )
                return
            if not self._catch_up_again:
                return

    # -- publishing ---------------------------------------------------------

    def _may_vote(self) -> bool:
        return not self._leaving and not self._dead and self.status == SiloStatus.ACTIVE

    def _apply(self, snap: MembershipSnapshot, seq: int) -> None:
        if seq < self._read_applied or snap.version.version < self._snapshot.version.version:
            return
        self._read_applied = seq
        self._snapshot = snap
        if snap.version.version > self._published_version:
            self._published_version = snap.version.version
            for listener in list(self._listeners):
                self._call(listener, snap)
        if snap.status(self.address) == SiloStatus.DEAD and not self._leaving:
            self._declare_dead()
        else:
            self._check_stamp(snap)

    def _call(self, listener: MembershipListener, snap: MembershipSnapshot) -> None:
        try:
            listener(snap)
        except Exception:
            log.exception("membership listener failed silo=%s", self.address)

    def _own_row_intact(self, snap: MembershipSnapshot) -> bool:
        """Whether ``snap`` holds this silo's row in the status this silo knows
        it has: the table went back to an earlier state of this incarnation's
        cluster, not to an empty or foreign one."""
        stored = snap.entries.get(self.address)
        known = self._snapshot.entries.get(self.address)
        return stored is not None and known is not None and stored[0].status == known[0].status

    def _rewind(self, snap: MembershipSnapshot, seq: int, what: str) -> None:
        """Adopt a table that went back in version with this silo's row intact:
        writes the store had acknowledged were lost (an asynchronously replicated
        primary failed over before its replica had them; ``RedisOptions``'
        ``wait_replicas`` prevents it). What they said (a vote, a status) is
        written again by whoever still means it; stopping every silo that had
        read them would turn a lost write into an outage."""
        log.warning(
            "membership table went back silo=%s: %s; writes the store acknowledged "
            "were lost (a failover before replication?); this silo's row is intact, "
            "so it carries on with the table as stored",
            self.address,
            what,
        )
        self.rewinds += 1
        self._read_applied = seq
        self._snapshot = snap
        self._published_version = snap.version.version
        for listener in list(self._listeners):
            self._call(listener, snap)

    def _store_lost(self, what: str) -> None:
        log.warning(
            "membership store lost its data silo=%s: %s (a store restarted empty, "
            "flushed or truncated?); this silo stops and must be restarted, which joins "
            "it as a new incarnation and registers its declared reminders again",
            self.address,
            what,
        )
        self._declare_dead(f"membership store lost its data: {what}")

    def _declare_dead(self, reason: str = "declared Dead in the membership table") -> None:
        if self._dead:
            return
        self._dead = True
        self.stop_reason = reason
        self.lease.revoke(reason)
        log.error("membership: this silo stops silo=%s reason=%s", self.address, reason)
        # Stop every loop but the one that noticed (it cannot await itself);
        # that one ends when its own cancellation arrives from _stop_loops.
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        if current in self._tasks:
            current.cancel()
        try:
            self._on_declared_dead()
        except Exception:
            log.exception("on_declared_dead failed silo=%s", self.address)
