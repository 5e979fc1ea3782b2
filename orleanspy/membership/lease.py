"""The ownership lease: whether this silo may still deliver the reminders it owns.

Peers declare a silo Dead after it missed ``num_missed_probes_limit`` probes
in a row, and probe rounds are ``probe_interval`` apart; so the soonest they
can write the verdict is ``num_missed_probes_limit * probe_interval`` after
the silo was last reachable (each probe failing at once; timeouts only make
it later). A silo that has in that long reached neither the membership table
nor any peer must assume it may have been declared Dead and its reminders
taken over: its lease lapses and it delivers none of them until it has read
the table again, which either renews the lease or tells it it is Dead
(``revoke``: the lease never comes back). With this bound the isolated silo
stops at most about one probe interval after the earliest possible Dead
write (docs/decisions.md, "Ownership lease").

Reaching a peer counts (a probe answered, gossip received), so a
cluster-wide storage outage, during which the silos still reach each other,
keeps every lease and every silo ticking. A silo alone in the table has no
peer who could declare it Dead or take its reminders over: its lease holds.

The reminder service consults ``OwnershipLease`` before each delivery
(``guard``); the membership service renews and revokes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Protocol, TypeVar, runtime_checkable

from orleanspy.clock import Clock
from orleanspy.errors import SiloUnavailableError
from orleanspy.options import MembershipOptions

__all__ = ["ContactLease", "LeaseLapsedError", "OwnershipLease", "guard", "lease_duration"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@runtime_checkable
class OwnershipLease(Protocol):
    """What the reminder service asks before it delivers a tick it owns."""

    def held(self) -> bool:
        """Whether this silo may deliver the reminders it owns right now."""
        ...

    async def wait_held(self) -> None:
        """Return once ``held()`` is true again (never, once revoked)."""
        ...


class LeaseLapsedError(SiloUnavailableError):
    """A tick waited for a lapsed lease; it is planned again (a transient error,
    so the reminder service retries it unless the row moved meanwhile)."""


def lease_duration(options: MembershipOptions) -> timedelta:
    """``num_missed_probes_limit * probe_interval``: the soonest peers can declare
    a silo Dead after it was last reachable (see the module docstring)."""
    return options.probe_interval * options.num_missed_probes_limit


class ContactLease:
    """An ``OwnershipLease`` renewed by contact with the table or a peer.

    ``has_peers()`` says whether another Active silo is in the table (without
    one, the lease holds). ``table_reached()`` (a read that shows this silo is
    not Dead) renews the lease and ends a lapse; ``peer_reached()`` and
    ``table_written()`` (a heartbeat, or a read not yet checked) renew it but do
    not end a lapse (only a read can say the silo was not declared Dead
    meanwhile); ``revoke`` ends it for good. Timing reads ``clock``.
    """

    def __init__(
        self,
        clock: Clock,
        duration: timedelta,
        *,
        has_peers: Callable[[], bool],
        name: str = "",
    ) -> None:
        self._clock = clock
        self._duration = duration
        self._has_peers = has_peers
        self._name = name
        self._contact = clock.now()
        self._lapsed = False
        self._revoked: str | None = None
        self._regained = asyncio.Event()
        self._regained.set()
        self.lapses = 0
        #: When the lease last lapsed (clock time), or ``None``.
        self.lapsed_at: datetime | None = None

    @property
    def duration(self) -> timedelta:
        return self._duration

    @property
    def revoked(self) -> str | None:
        """Why the lease was revoked, or ``None``."""
        return self._revoked

    def table_reached(self) -> None:
        self._contact = self._clock.now()
        if self._lapsed and self._revoked is None:
            self._lapsed = False
            self._regained.set()
            log.warning(
                "ownership lease regained silo=%s: the membership table was read again; "
                "reminders resume",
                self._name,
            )

    def peer_reached(self) -> None:
        self._contact = self._clock.now()

    def table_written(self) -> None:
        """The table took a write (or answered a read not yet checked): renews the
        lease like ``peer_reached`` and, like it, does not end a lapse."""
        self._contact = self._clock.now()

    def revoke(self, reason: str) -> None:
        if self._revoked is None:
            self._revoked = reason
            self._regained.clear()
            log.warning("ownership lease revoked silo=%s reason=%s", self._name, reason)

    def held(self) -> bool:
        if self._revoked is not None or self._lapsed:
            return False
        if not self._has_peers():
            return True
        silent = self._clock.now() - self._contact
        if silent <= self._duration:
            return True
        self._lapsed = True
        self.lapses += 1
        self.lapsed_at = self._clock.now()
        self._regained.clear()
        log.warning(
            "ownership lease lapsed silo=%s: reached neither the membership table nor any "
            "peer for %.1fs (peers may declare it Dead after %.1fs); its reminders pause "
            "until the table is read again",
            self._name,
            silent.total_seconds(),
            self._duration.total_seconds(),
        )
        return False

    async def wait_held(self) -> None:
        while not self.held():
            await self._regained.wait()


def guard(call: Callable[..., Awaitable[T]], lease: OwnershipLease) -> Callable[..., Awaitable[T]]:
    """``call`` made only while ``lease`` is held. Without the lease it waits
    for it, then raises ``LeaseLapsedError`` instead of calling, so the caller
    re-plans with what it learned meanwhile (a row it no longer owns is gone)."""

    async def guarded(*args: object) -> T:
        if not lease.held():
            await lease.wait_held()
            raise LeaseLapsedError("the ownership lease lapsed; the tick is planned again")
        return await call(*args)

    return guarded
