"""The cluster side of a silo: locating grains through the directory and placement,
following membership into the ring, and building the Redis/gRPC providers.

``ClusterLocator`` is the dispatcher's ``Locator`` in a cluster. ``RingFollower``
turns membership snapshots into ring changes for the reminder service and
drops directory-cache entries and connections of silos that died.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from orleanspy.directory.cached import CachedDirectory
from orleanspy.directory.table import ActivationAddress
from orleanspy.errors import SiloUnavailableError, UnknownGrainTypeError
from orleanspy.grain import GrainDefinition
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.membership.agreement import RING_BALANCED, cluster_ring_mode
from orleanspy.membership.model import MembershipSnapshot, SiloStatus
from orleanspy.membership.service import MembershipService
from orleanspy.messaging.transport import Transport
from orleanspy.placement import DEFAULT_PLACEMENT
from orleanspy.ring import ConsistentRing, RingRange, taken_from_live

__all__ = ["ClusterLocator", "RingFollower"]

log = logging.getLogger(__name__)

# A silo that cannot be reached makes us re-read the table, but not more often
# than this: a burst of failed sends must not become a burst of table reads.
_REFRESH_MIN_INTERVAL = 0.5


class ClusterLocator:
    """Grain location for a cluster silo: directory (with an LRU cache) and placement.

    Directory entries on silos the membership knows as dead (or gone from the
    table) are removed when they are met; a grain with no live entry is placed
    with its class's strategy among the Active silos.
    """

    def __init__(self, *, address: Callable[[], SiloAddress], directory: CachedDirectory) -> None:
        self._address = address
        self._directory = directory
        self._membership_service: MembershipService | None = None
        self._last_refresh = 0.0
        self._alive_for: MembershipSnapshot | None = None
        self._alive_set: set[SiloAddress] = set()
        self._member_set: set[SiloAddress] = set()
        self._refreshing: asyncio.Future[MembershipSnapshot] | None = None

    def attach(self, membership: MembershipService) -> None:
        """Wire the membership service (it needs the transport's bound address,
        so it is created after the dispatcher that owns this locator)."""
        self._membership_service = membership

    @property
    def _membership(self) -> MembershipService:
        if self._membership_service is None:
            raise RuntimeError("ClusterLocator used before attach(membership)")
        return self._membership_service

    @property
    def local_only(self) -> bool:
        return False

    def _alive(self, silo: SiloAddress) -> bool:
        # Asked on every call: answer from a set rebuilt once per snapshot.
        self._follow_snapshot()
        return silo in self._alive_set or silo == self._address()

    def _follow_snapshot(self) -> None:
        snapshot = self._membership.snapshot
        if snapshot is not self._alive_for:
            self._alive_for = snapshot
            # A silo restarted on the same host and port supersedes its earlier
            # incarnations as soon as its row appears, before they are declared
            # Dead: what lived there is gone.
            newest: dict[tuple[str, int], int] = {}
            for s in snapshot.entries:
                endpoint = (s.host, s.port)
                newest[endpoint] = max(newest.get(endpoint, s.generation), s.generation)
            self._alive_set = {
                s for s, (entry, _etag) in snapshot.entries.items()
                if entry.status <= SiloStatus.ACTIVE
                and s.generation == newest[s.host, s.port]
            }  # fmt: skip
            # Members may still send and must get answers while they shut down.
            self._member_set = {
                s for s, (entry, _etag) in snapshot.entries.items()
                if entry.status < SiloStatus.DEAD and s.generation == newest[s.host, s.port]
            }  # fmt: skip

    def cached(self, grain_id: GrainId) -> SiloAddress | None:
        hit = self._directory.peek(grain_id)
        if hit is None:
            return None
        if not self._alive(hit.silo):
            self._directory.invalidate(grain_id)
            return None
        return hit.silo

    async def locate(
        self,
        grain_id: GrainId,
        definition: GrainDefinition | None,
        prefer: SiloAddress | None = None,
    ) -> SiloAddress:
        found = await self._directory.lookup(grain_id)
        if found is not None:
            if self._alive(found.silo):
                return found.silo
            await self._directory.unregister(grain_id, found)
        strategy = (definition.placement if definition else None) or DEFAULT_PLACEMENT
        snapshot = self._membership.snapshot
        # Only silos whose row says they host the type are candidates.
        silos = snapshot.hosting(grain_id.type_name)
        if not silos:
            if snapshot.active_silos():
                raise UnknownGrainTypeError.known(
                    f"no active silo hosts grain type {grain_id.type_name!r}",
                    snapshot.hosted_types(),
                )
            me = self._address()
            status = snapshot.status(me)
            if status is not None and status.is_terminating:
                # Leaving, and nobody left to take the grain: placing it here
                # would activate it again while the silo deactivates its
                # grains (and its queued calls would come back each round).
                raise SiloUnavailableError(
                    f"silo {me} is shutting down and no other silo is active to place {grain_id} on"
                )
            silos = (me,)  # not joined yet: this silo is all there is
        if prefer is not None and prefer in silos:
            return prefer
        chosen: SiloAddress = strategy.choose(grain_id, self._address(), silos)
        return chosen

    async def register(
        self, grain_id: GrainId, address: ActivationAddress
    ) -> ActivationAddress | None:
        winner = await self._directory.register(grain_id, address)
        if winner != address and not self._alive(winner.silo):
            # The winner's silo is dead: clear its entry and claim once more.
            await self._directory.unregister(grain_id, winner)
            winner = await self._directory.register(grain_id, address)
        return None if winner == address else winner

    async def unregister(self, grain_id: GrainId, address: ActivationAddress) -> None:
        await self._directory.unregister(grain_id, address)

    def invalidate(self, grain_id: GrainId) -> None:
        self._directory.invalidate(grain_id)

    def knows(self, silo: SiloAddress) -> bool:
        self._follow_snapshot()
        return silo in self._member_set or silo == self._address()

    async def learn(self, silo: SiloAddress) -> bool:
        if self.knows(silo):
            return True
        await self._refresh(wait=True)
        return self.knows(silo)

    async def _refresh(self, *, wait: bool = False) -> None:
        """Re-read the table: concurrent callers share one read, and reads start
        at most every ``_REFRESH_MIN_INTERVAL`` (``wait``: wait for the next one
        rather than give up)."""
        refreshing = self._refreshing
        if refreshing is None or refreshing.done():
            since = time.monotonic() - self._last_refresh
            if since < _REFRESH_MIN_INTERVAL:
                if not wait:
                    return
                await asyncio.sleep(_REFRESH_MIN_INTERVAL - since)
                await self._refresh()
                return
            self._last_refresh = time.monotonic()
            refreshing = self._refreshing = asyncio.ensure_future(self._membership.refresh())
        try:
            await asyncio.shield(refreshing)
        except Exception as exc:
            log.warning("membership refresh failed error=%r", exc)

    async def silo_unreachable(self, silo: SiloAddress) -> bool:
        """A send to ``silo`` failed: re-read membership (rate-limited) and say
        whether the silo is now known to be gone (so the call may be re-routed)."""
        self._directory.invalidate_silo(silo)
        if not self._alive(silo):
            return True
        # Concurrent failures share one table read; within the rate limit no
        # read starts and the silo counts as alive.
        await self._refresh()
        return not self._alive(silo)


class RingFollower:
    """Keeps the ring in step with membership and tells its listeners.

    On each snapshot: rebuild the ring over the Active silos (balanced or not
    as ``balanced`` says, ``MembershipOptions.balanced_ring``; ``None``: the
    ring the cluster builds, ``agreement.cluster_ring_mode``, told to
    ``on_mode`` when it changes); if it changed,
    pass this silo's ranges to ``on_ranges``, with the part of them it took
    over from silos that are still Active (``ring.taken_from_live``). Silos that left (Dead or gone)
    have their cached directory entries dropped and connections closed, and
    are passed to ``on_dead`` once each, before the ring change their death
    causes (the reminder service fences them before it reads their rows).
    """

    def __init__(
        self,
        *,
        address: Callable[[], SiloAddress],
        directory: CachedDirectory,
        transport: Transport,
        on_ranges: Callable[[tuple[RingRange, ...], tuple[RingRange, ...]], None],
        on_dead: Callable[[SiloAddress], None] | None = None,
        buckets_per_silo: int = 30,
        balanced: bool | None = True,
        on_mode: Callable[[str], None] | None = None,
    ) -> None:
        self._address = address
        self._on_dead = on_dead
        self._directory = directory
        self._transport = transport
        self._on_ranges = on_ranges
        self._buckets = buckets_per_silo
        self._insists = balanced
        self._balanced = balanced is not False
        self._on_mode = on_mode
        self.ring = ConsistentRing.build((), buckets_per_silo, balanced=self._balanced)
        self._known_dead: set[SiloAddress] = set()
        self.changes = 0

    def __call__(self, snapshot: MembershipSnapshot) -> None:
        me = self._address()
        for silo, (entry, _etag) in snapshot.entries.items():
            if entry.status is SiloStatus.DEAD and silo not in self._known_dead and silo != me:
                self._known_dead.add(silo)
                self._directory.invalidate_silo(silo)
                self._transport.disconnect(silo)
                if self._on_dead is not None:
                    self._on_dead(silo)
        active = snapshot.active_silos()
        if self._insists is None:
            mode = cluster_ring_mode(snapshot)
            self._balanced = mode == RING_BALANCED
            if self._on_mode is not None:
                self._on_mode(mode)
        ring = ConsistentRing.build(active, self._buckets, balanced=self._balanced)
        if ring != self.ring:
            old, self.ring = self.ring, ring
            self.changes += 1
            ranges = ring.ranges_of(me) if me in active else ()
            if not old.silos and me in active:
                # This silo's first ring: the others' ring without it is what
                # they went by until it joined.
                others = tuple(s for s in active if s != me)
                old = ConsistentRing.build(others, self._buckets, balanced=self._balanced)
            from_live = taken_from_live(old, ring, me) if me in active else ()
            log.info(
                "ring changed silos=%d own_ranges=%d from_live=%d",
                len(active),
                len(ranges),
                len(from_live),
            )
            self._on_ranges(ranges, from_live)
