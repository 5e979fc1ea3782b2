"""Failure detection: probe a few peers, suspect the silent ones, vote them dead.

Each Active silo probes up to ``num_probed_silos`` other Active silos: its
successors in ring order (silos sorted by ``SiloAddress.uniform_hash``), so the
probing duties are spread evenly and every silo is watched by the same few
peers in every silo's view. A peer that misses ``num_missed_probes_limit``
probes in a row is suspected: the prober adds its vote (itself, now) to the
peer's row by compare-and-swap. When the fresh votes, this one included,
reach ``min(num_votes_for_death_declaration, (active + 1) // 2)`` — ``active``
counting Active silos whose heartbeat is not stale — the prober writes the
peer Dead instead. A suspect whose own heartbeat is older than
``i_am_alive_staleness`` is written Dead at once: it is both silent to us and
silent to the table. Votes older than ``death_vote_expiration`` do not count
and are dropped when the row is next written.

Evidence (``ProbeOutcome``). A refused connection (the peer's host answered
that nothing listens on its port) or another incarnation answering on its
address is strong evidence: the prober votes at once, without waiting for
the miss limit, so a process killed on a live host is declared Dead within a
probe interval or so. Silence (a timeout, an unreachable route) is weak
evidence and keeps the miss rule. A refusal of this silo's credentials counts
as a miss, like silence.

Self-suspicion (after Orleans' ``LocalSiloHealthMonitor``). A silo that
probes two or more peers and has had no answer from any of them (an answer,
a refusal, another incarnation: anything that proves its own network works)
for ``probe_timeout * num_missed_probes_limit`` suspects itself: it goes on
probing but casts no vote, so an isolated or mis-deployed silo cannot evict
healthy ones. With a single peer it cannot tell who is cut off and votes as
before (as Orleans does), or a two-silo cluster could never evict a dead one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from orleanspy.clock import Clock
from orleanspy.errors import StorageError
from orleanspy.identity import SiloAddress
from orleanspy.membership.model import MembershipEntry, MembershipSnapshot, SiloStatus
from orleanspy.membership.table import MembershipTable
from orleanspy.messaging.transport import ProbeOutcome
from orleanspy.options import MembershipOptions

__all__ = [
    "HealthMonitor",
    "Ping",
    "ProbeOutcome",
    "judge",
    "probe_targets",
    "self_suspicion_window",
    "votes_needed",
]

log = logging.getLogger(__name__)

Ping = Callable[[SiloAddress, float], Awaitable["bool | ProbeOutcome"]]
"""``ping(silo, timeout_seconds)``: a ``ProbeOutcome``, or ``True`` if ``silo``
answered within the timeout (``False``: silent).

It must enforce the timeout itself (it runs on real time, not the membership
clock). An exception counts as silence.
"""

_STRONG = (ProbeOutcome.REFUSED, ProbeOutcome.GONE)
# Outcomes that prove this silo's own network works.
_REACHED = (ProbeOutcome.ANSWERED, ProbeOutcome.REFUSED, ProbeOutcome.GONE)


def self_suspicion_window(options: MembershipOptions) -> timedelta:
    """How long a silo probing two or more peers may go without any answer
    before it suspects itself: ``probe_timeout * num_missed_probes_limit``."""
    return options.probe_timeout * options.num_missed_probes_limit


# Lost compare-and-swaps are expected when several silos vote on one suspect at
# once; a few immediate re-reads settle it, and the next probe round retries.
_VOTE_ATTEMPTS = 5


def probe_targets(snapshot: MembershipSnapshot, me: SiloAddress, count: int) -> list[SiloAddress]:
    """The up to ``count`` Active silos that follow ``me`` in ring order, excluding ``me``."""
    ring = sorted(
        (s.uniform_hash(), s) for s in {*snapshot.active_silos(), me}
    )  # ``me`` anchors the walk even before it is Active in this snapshot
    start = next(i for i, (_, s) in enumerate(ring) if s == me)
    successors = [s for _, s in ring[start + 1 :] + ring[:start]]
    return successors[:count]


def votes_needed(snapshot: MembershipSnapshot, now: datetime, options: MembershipOptions) -> int:
    """``min(num_votes_for_death_declaration, (active + 1) // 2)``, at least 1, where
    ``active`` counts Active silos whose heartbeat is not stale (Orleans' rule: a
    small cluster must still be able to evict)."""
    active = sum(
        1
        for entry, _ in snapshot.entries.values()
        if entry.status == SiloStatus.ACTIVE
        and not entry.is_stale(now, options.i_am_alive_staleness)
    )
    return max(1, min(options.num_votes_for_death_declaration, (active + 1) // 2))


def judge(
    suspect: MembershipEntry,
    snapshot: MembershipSnapshot,
    voter: SiloAddress,
    now: datetime,
    options: MembershipOptions,
) -> MembershipEntry:
    """The suspect's row after ``voter`` votes at ``now``: with the vote added, and
    Dead if the fresh votes reach the votes needed or its heartbeat is stale."""
    voted = suspect.with_vote(voter, now, options.death_vote_expiration)
    fresh = voted.fresh_votes(now, options.death_vote_expiration)
    if suspect.is_stale(now, options.i_am_alive_staleness) or len(fresh) >= votes_needed(
        snapshot, now, options
    ):
        return voted.with_status(SiloStatus.DEAD)
    return voted


class HealthMonitor:
    """The probe loop of one silo.

    ``read`` reads the table and publishes the result to the membership
    service (it returns the service's latest snapshot); ``may_vote`` says
    whether this silo may still vote (Active, not leaving, not declared dead);
    ``on_death(version)`` hears of every death this silo writes, with the
    table version it wrote. ``on_reached()`` is called after every probe
    round in which some peer answered (the ownership lease counts it).

    Counters (they only grow): ``probes_sent``, ``probes_failed``,
    ``suspicions`` (suspect votes written), ``declared_dead`` (deaths written),
    ``votes_withheld`` (votes not cast while this silo suspected itself).
    """

    def __init__(
        self,
        table: MembershipTable,
        *,
        address: SiloAddress,
        ping: Ping,
        clock: Clock,
        options: MembershipOptions,
        read: Callable[[], Awaitable[MembershipSnapshot]],
        snapshot: Callable[[], MembershipSnapshot],
        may_vote: Callable[[], bool],
        on_death: Callable[[int], None] = lambda _version: None,
        on_reached: Callable[[], None] = lambda: None,
    ) -> None:
        self._table = table
        self._on_reached = on_reached
        self._last_reached = clock.now()
        self._self_suspected = False
        self.votes_withheld = 0
        self._on_death = on_death
        self._me = address
        self._ping = ping
        self._clock = clock
        self._options = options
        self._read = read
        self._snapshot = snapshot
        self._may_vote = may_vote
        self._missed: dict[SiloAddress, int] = {}
        self.probes_sent = 0
        self.probes_failed = 0
        self.suspicions = 0
        self.declared_dead = 0

    @property
    def missed(self) -> dict[SiloAddress, int]:
        """Consecutive missed probes per currently probed silo (a copy)."""
        return dict(self._missed)

    @property
    def self_suspected(self) -> bool:
        """Whether this silo suspects itself (see the module docstring)."""
        return self._self_suspected

    async def run(self) -> None:
        """Probe every ``probe_interval`` until cancelled; errors are logged and
        the next round goes on."""
        interval = self._options.probe_interval.total_seconds()
        while True:
            await self._clock.sleep(interval)
            try:
                await self.probe_once()
            except StorageError as exc:
                log.warning("membership vote failed silo=%s error=%r", self._me, exc)
            except Exception:
                log.exception("membership probe round failed silo=%s", self._me)

    async def probe_once(self) -> None:
        """One round: probe the targets at once; vote at once on strong evidence,
        and on those over the miss limit unless this silo suspects itself."""
        targets = probe_targets(self._snapshot(), self._me, self._options.num_probed_silos)
        self._missed = {s: n for s, n in self._missed.items() if s in targets}
        results = await asyncio.gather(*(self._probe(s) for s in targets))
        self.probes_sent += len(targets)
        if any(r in _REACHED for r in results):
            self._last_reached = self._clock.now()
            self._on_reached()
        self._update_self_suspicion(len(targets))
        for silo, outcome in zip(targets, results, strict=True):
            if outcome is ProbeOutcome.ANSWERED:
                self._missed.pop(silo, None)
                continue
            self.probes_failed += 1
            if outcome in _STRONG:
                self._missed[silo] = self._options.num_missed_probes_limit
                log.info(
                    "membership probe %s silo=%s target=%s: voting at once",
                    outcome.value,
                    self._me,
                    silo,
                )
                await self.suspect_or_kill(silo)
                continue
            misses = self._missed.get(silo, 0) + 1
            self._missed[silo] = misses
            log.info(
                "membership probe missed silo=%s target=%s misses=%d outcome=%s",
                self._me,
                silo,
                misses,
                outcome.value,
            )
            if misses >= self._options.num_missed_probes_limit:
                if self._self_suspected:
                    self.votes_withheld += 1
                    continue
                await self.suspect_or_kill(silo)

    def _update_self_suspicion(self, monitored: int) -> None:
        silent_for = self._clock.now() - self._last_reached
        suspected = monitored >= 2 and silent_for > self_suspicion_window(self._options)
        if suspected and not self._self_suspected:
            log.warning(
                "membership: no peer answered for %.1fs (%d probed); this silo suspects "
                "itself and casts no votes silo=%s",
                silent_for.total_seconds(),
                monitored,
                self._me,
            )
        elif self._self_suspected and not suspected:
            log.warning("membership: peers answer again; this silo votes again silo=%s", self._me)
        self._self_suspected = suspected

    async def suspect_or_kill(self, silo: SiloAddress) -> bool:
        """Vote ``silo`` suspect, or write it Dead when the votes suffice.

        Re-reads the table before each attempt and retries lost races a few
        times. Returns ``True`` when the table holds this silo's vote or the
        suspect's death (including when it was already Dead), ``False`` when
        this silo may not vote, the suspect has no row, or every attempt lost.
        """
        for _ in range(_VOTE_ATTEMPTS):
            snap = await self._read()
            if not self._may_vote():
                return False
            suspect, etag = snap.get(silo), snap.etag(silo)
            if suspect is None or etag is None:
                return False
            if suspect.status == SiloStatus.DEAD:
                return True
            now = self._clock.now()
            verdict = judge(suspect, snap, self._me, now, self._options)
            version = snap.version.next()
            if await self._table.update_row(verdict, etag, version):
                if verdict.status == SiloStatus.DEAD:
                    self.declared_dead += 1
                    self._on_death(version.version)
                else:
                    self.suspicions += 1
                log.warning(
                    "membership %s silo=%s suspect=%s votes=%d",
                    "declared dead" if verdict.status == SiloStatus.DEAD else "voted",
                    self._me,
                    silo,
                    len(verdict.fresh_votes(now, self._options.death_vote_expiration)),
                )
                await self._read()
                return True
        return False

    async def _probe(self, silo: SiloAddress) -> ProbeOutcome:
        try:
            result = await self._ping(silo, self._options.probe_timeout.total_seconds())
        except Exception as exc:
            log.debug("membership probe raised silo=%s target=%s error=%r", self._me, silo, exc)
            return ProbeOutcome.SILENT
        if isinstance(result, ProbeOutcome):
            return result
        return ProbeOutcome.ANSWERED if result else ProbeOutcome.SILENT
