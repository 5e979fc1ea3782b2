"""The membership table's data: silo rows, suspicion votes, the table version,
snapshots, and the storage encoding of a row (``to_record``/``from_record``).

The contract these travel through is ``orleanspy.membership.table``.
Timestamps are timezone-aware UTC datetimes, stored with millisecond precision.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from orleanspy.clock import from_ms, to_ms
from orleanspy.identity import SiloAddress
from orleanspy.versions import ProtocolWindow

__all__ = [
    "INITIAL_VERSION",
    "MembershipEntry",
    "MembershipSnapshot",
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
    does not say, and the silo is taken to host every type). ``verifier``
    proves which credentials the silo joined with, without revealing them
    (``membership.credentials``; ``None``: the row does not say).
    ``ring_mode`` names the ring the silo builds, ``"balanced"`` or
    ``"hashed"`` (``membership.agreement``; ``None``: the row does not say,
    and the silo counts as hashed); ``ring_follows``: the silo builds the ring
    the cluster builds rather than insisting on ``ring_mode``.

    ``release`` and ``protocols`` are the silo's release and the protocol window
    it speaks (``orleanspy.versions``; ``None``: a row of 0.1.x, which speaks
    protocol 1 only: ``window``). ``schemas`` names the store schema versions
    its code runs with (``("postgres:reminders", 7)``, sorted; shown, never compared).
    ``extra`` keeps the keys of a newer release's row that this one does not
    know, so that rewriting the row (a vote, a status) does not drop them.
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
    verifier: str | None = None
    ring_mode: str | None = None
    ring_follows: bool = False
    release: str | None = None
    protocols: ProtocolWindow | None = None
    schemas: tuple[tuple[str, int], ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def window(self) -> ProtocolWindow:
        """The protocols the silo speaks (a row that does not say: 0.1.x's, 1 alone)."""
        return self.protocols if self.protocols is not None else ProtocolWindow(1, 1)

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
        if self.verifier is not None:
            rec["cv"] = self.verifier
        if self.ring_mode is not None:
            rec["rm"] = self.ring_mode
        if self.ring_follows:
            rec["rf"] = 1
        if self.release is not None:
            rec["rv"] = self.release
        if self.protocols is not None:
            rec["pw"] = self.protocols.text()
        if self.schemas:
            # One string, as grain_types: a Lua script that re-encodes the row
            # keeps a string as it is.
            rec["sv"] = ";".join(f"{k}={v}" for k, v in self.schemas)
        for key, value in self.extra.items():
            rec.setdefault(key, value)
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> MembershipEntry:
        """Inverse of ``to_record``. Keys this release does not know are kept in
        ``extra`` (a stored etag, ``"e"``, is not: the table owns it)."""
        votes = rec.get("v") or ()
        window = rec.get("pw")
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
            verifier=None if rec.get("cv") is None else str(rec["cv"]),
            ring_mode=None if rec.get("rm") is None else str(rec["rm"]),
            ring_follows=bool(rec.get("rf")),
            release=None if rec.get("rv") is None else str(rec["rv"]),
            protocols=None if window is None else _window(window),
            schemas=_schemas(rec.get("sv")),
            extra={k: v for k, v in rec.items() if k not in _KNOWN_KEYS},
        )


# The keys ``to_record`` writes, and the etag some tables store beside them.
_KNOWN_KEYS = frozenset(
    {"a", "s", "n", "t", "ia", "v", "h", "g", "gt", "cv", "rm", "rf", "rv", "pw", "sv", "e"}
)


def _window(stored: object) -> ProtocolWindow | None:
    """A stored protocol window; a malformed one reads as unknown (``None``:
    protocol 1), so one bad row cannot stop a silo from reading its table."""
    try:
        return ProtocolWindow.parse(str(stored))
    except ValueError:
        return None


def _schemas(stored: object) -> tuple[tuple[str, int], ...] | None:
    if not stored:
        return None
    out: list[tuple[str, int]] = []
    for item in str(stored).split(";"):
        name, _, number = item.partition("=")
        if name and number.isdigit():
            out.append((name, int(number)))
    return tuple(sorted(out))


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

    def hosted_types(self) -> set[str]:
        """The grain types some Active silo names in its row (a row naming none,
        from a silo that hosts everything registered there, adds nothing)."""
        return {t for s in self._active for t in (self.entries[s][0].grain_types or ())}

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


def _grain_types(stored: object) -> frozenset[str] | None:
    if stored is None:
        return None
    text = str(stored)
    return frozenset(text.split("\n")) if text else frozenset()
