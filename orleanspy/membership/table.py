"""The membership table contract: silo rows, the table version, and the protocol.

The membership table is the rendezvous of a cluster: one row per silo run
(``SiloAddress`` includes the generation, so a restarted silo gets a new row)
plus one table-wide ``TableVersion``. Every protocol write (join, status
change, suspicion vote, death declaration) is a compare-and-swap on both the
row's etag and the table version's etag, and bumps the table version; so two
silos that read the same snapshot can never both act on it. Only the
I-am-alive heartbeat is a dirty write that leaves every etag and the version
alone.

Versions, as in Orleans: a writer reads a snapshot with version ``v`` and passes
``v.next()`` (the number plus one, still carrying the etag it read). The table
accepts the write only while its current version etag equals that etag, and
then stores the passed number with a fresh etag.

Lost races are values (``False``), never exceptions. An unreachable store
raises ``StorageUnavailableError``; a misbehaving one ``StorageError``.
Timestamps are timezone-aware UTC datetimes, stored with millisecond precision.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from orleanspy.clock import from_ms, to_ms
from orleanspy.identity import SiloAddress

__all__ = [
    "INITIAL_VERSION",
    "MembershipEntry",
    "MembershipSnapshot",
    "MembershipTable",
    "SiloStatus",
    "TableVersion",
]


class SiloStatus(enum.IntEnum):
    """A silo's life cycle, with Orleans' numbers (they are stored)."""

    CREATED = 1
    JOINING = 2
    ACTIVE = 3
    SHUTTING_DOWN = 4
    STOPPING = 5
    DEAD = 6

    @property
    def is_terminating(self) -> bool:
        """Shutting down, stopping or dead: the silo takes no new work."""
        return self >= SiloStatus.SHUTTING_DOWN


@dataclass(frozen=True, slots=True)
class MembershipEntry:
    """One silo's row.

    ``suspect_times`` holds the suspicion votes cast against this silo: the
    voter and when it voted, oldest first. ``gateway_port`` is the port clients
    connect to on ``silo.host`` (``None``: the silo runs no gateway).
    ``i_am_alive`` is the silo's last heartbeat, written by the silo itself.
    ``grain_types`` names the grain types the silo hosts (``None``: the row
    does not say, and the silo is taken to host every type).
    """

    silo: SiloAddress
    status: SiloStatus
    name: str
    start_time: datetime
    i_am_alive: datetime
    suspect_times: tuple[tuple[SiloAddress, datetime], ...] = ()
    gateway_port: int | None = None
    host_name: str = ""
    grain_types: frozenset[str] | None = None

    def hosts(self, type_name: str) -> bool:
        """Whether grains of ``type_name`` may be placed on this silo."""
        return self.grain_types is None or type_name in self.grain_types

    def with_status(self, status: SiloStatus) -> MembershipEntry:
        return replace(self, status=status)

    def with_i_am_alive(self, at: datetime) -> MembershipEntry:
        return replace(self, i_am_alive=at)

    def fresh_votes(
        self, now: datetime, expiration: timedelta
    ) -> tuple[tuple[SiloAddress, datetime], ...]:
        """The votes younger than ``expiration`` at ``now``."""
        return tuple((v, t) for v, t in self.suspect_times if now - t < expiration)

    def with_vote(self, voter: SiloAddress, at: datetime, expiration: timedelta) -> MembershipEntry:
        """This row with ``voter``'s vote cast (or renewed) at ``at``.

        Expired votes are dropped, so the list cannot grow without bound, and a
        voter holds at most one vote.
        """
        kept = tuple((v, t) for v, t in self.fresh_votes(at, expiration) if v != voter)
        return replace(self, suspect_times=(*kept, (voter, at)))

    def is_stale(self, now: datetime, staleness: timedelta) -> bool:
        """Whether the last heartbeat is older than ``staleness``."""
        return now - self.i_am_alive > staleness

    def to_record(self) -> dict[str, Any]:
        """Storage form: plain msgpack types, times in ms since the epoch.

        Unset optional fields are omitted rather than stored as nil, so a store
        that decodes and re-encodes rows (a Lua script) keeps them intact.
        Status is under ``"s"`` and the heartbeat under ``"ia"``: backends'
        scripts read those two keys.
        """
        rec: dict[str, Any] = {
            "a": str(self.silo),
            "s": int(self.status),
            "n": self.name,
            "t": to_ms(self.start_time),
            "ia": to_ms(self.i_am_alive),
            "v": [[str(v), to_ms(t)] for v, t in self.suspect_times],
            "h": self.host_name,
        }
        if self.gateway_port is not None:
            rec["g"] = self.gateway_port
        if self.grain_types is not None:
            # One string, not a list: a Lua script that re-encodes the row
            # cannot tell an empty list from an empty map.
            rec["gt"] = "\n".join(sorted(self.grain_types))
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> MembershipEntry:
        """Inverse of ``to_record``; extra keys (such as a stored etag) are ignored."""
        votes = rec.get("v") or ()
        return cls(
            silo=SiloAddress.parse(rec["a"]),
            status=SiloStatus(rec["s"]),
            name=rec.get("n", ""),
            start_time=from_ms(int(rec["t"])),
            i_am_alive=from_ms(int(rec["ia"])),
            suspect_times=tuple((SiloAddress.parse(v), from_ms(int(t))) for v, t in votes),
            gateway_port=None if rec.get("g") is None else int(rec["g"]),
            host_name=rec.get("h", ""),
            grain_types=_grain_types(rec.get("gt")),
        )


@dataclass(frozen=True, slots=True)
class TableVersion:
    """The table-wide version: a number that grows by one per protocol write,
    and the opaque etag the table's compare-and-swap checks."""

    version: int
    etag: str

    def next(self) -> TableVersion:
        """What a writer passes after reading ``self``: number + 1, same etag."""
        return TableVersion(self.version + 1, self.etag)


INITIAL_VERSION = TableVersion(0, "")
"""The version of an empty table: insert the first row with ``INITIAL_VERSION.next()``."""


@dataclass(frozen=True)
class MembershipSnapshot:
    """The whole table as read at one instant: each silo's row with its etag,
    and the table version."""

    entries: Mapping[SiloAddress, tuple[MembershipEntry, str]]
    version: TableVersion
    _active: tuple[SiloAddress, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        frozen = MappingProxyType(dict(self.entries))
        object.__setattr__(self, "entries", frozen)
        active = sorted(s for s, (e, _) in frozen.items() if e.status == SiloStatus.ACTIVE)
        object.__setattr__(self, "_active", tuple(active))

    @classmethod
    def empty(cls) -> MembershipSnapshot:
        return cls({}, INITIAL_VERSION)

    def get(self, silo: SiloAddress) -> MembershipEntry | None:
        found = self.entries.get(silo)
        return None if found is None else found[0]

    def etag(self, silo: SiloAddress) -> str | None:
        found = self.entries.get(silo)
        return None if found is None else found[1]

    def status(self, silo: SiloAddress) -> SiloStatus | None:
        entry = self.get(silo)
        return None if entry is None else entry.status

    def active_silos(self) -> tuple[SiloAddress, ...]:
        """The Active silos, sorted (the ring's members)."""
        return self._active

    def hosting(self, type_name: str) -> tuple[SiloAddress, ...]:
        """The Active silos that host ``type_name``, sorted."""
        return tuple(s for s in self._active if self.entries[s][0].hosts(type_name))

    def gateways(self) -> list[tuple[str, int]]:
        """``(host, gateway_port)`` of every Active silo that runs a gateway, sorted."""
        out = []
        for silo in self._active:
            entry, _ = self.entries[silo]
            if entry.gateway_port is not None:
                out.append((silo.host, entry.gateway_port))
        return sorted(out)

    def __len__(self) -> int:
        return len(self.entries)


@runtime_checkable
class MembershipTable(Protocol):
    """Durable silo rows of one cluster, with a table-wide version.

    Implementations: ``orleanspy.membership.memory.InMemoryMembershipTable``,
    ``orleanspy.membership.redis.RedisMembershipTable``. Prove a new one with
    ``orleanspy.testing.membership_table.check_membership_table``.
    """

    async def start(self, stack: AsyncExitStack) -> None:
        """Connect and prepare; push cleanup onto ``stack``. Called once before use."""
        ...

    async def read_all(self) -> MembershipSnapshot:
        """Every row with its etag, and the table version, read atomically: the
        version is exactly the one the rows were written under. An empty table
        has version ``INITIAL_VERSION`` (``0``, etag ``""``)."""
        ...

    async def insert_row(self, entry: MembershipEntry, version: TableVersion) -> bool:
        """Add ``entry`` as a new row, if ``entry.silo`` has no row yet and the
        table's current version etag equals ``version.etag``.

        ``version`` is the *next* version: ``snapshot.version.next()``. On
        success the table's version becomes ``version.version`` with a fresh
        etag, the row gets a fresh etag, and ``True`` is returned. ``False``
        (nothing written) when the row exists or the version etag differs: the
        caller re-reads and tries again. ``ValueError`` when the etag matches
        but ``version.version`` is not above the stored number (the caller
        forgot ``.next()``; versions never go backwards).
        """
        ...

    async def update_row(self, entry: MembershipEntry, etag: str, version: TableVersion) -> bool:
        """Replace the row of ``entry.silo`` with ``entry``, if the row exists with
        etag ``etag`` and the table's version etag equals ``version.etag``.

        As for ``insert_row``, ``version`` is ``snapshot.version.next()``; on
        success the version number becomes ``version.version`` with a fresh
        etag and the row gets a fresh etag. ``False`` (nothing written) on a
        missing row, a stale row etag, or a stale version etag. The row is
        stored as given, including its ``i_am_alive``.
        """
        ...

    async def update_i_am_alive(self, silo: SiloAddress, at: datetime) -> None:
        """Set the row's ``i_am_alive`` to ``at`` without any check: the row etag
        and the table version stay as they are, so this never makes another
        writer's compare-and-swap fail. A missing row is left missing."""
        ...

    async def delete_dead_before(self, cutoff: datetime) -> int:
        """Delete the Dead rows whose ``i_am_alive`` is before ``cutoff``; return
        how many were deleted. Other rows and the version are untouched."""
        ...


def _grain_types(stored: object) -> frozenset[str] | None:
    if stored is None:
        return None
    text = str(stored)
    return frozenset(text.split("\n")) if text else frozenset()
