"""Settings every silo of a cluster must share, checked in the table before joining.

Each membership row records the ring its silo builds (``MembershipEntry.ring_mode``:
``"balanced"`` or ``"hashed"``, from ``MembershipOptions.balanced_ring``). Two
silos that build different rings from the same Active silos disagree on who owns
a hash: both fire some reminders, neither fires others. So before it writes
Joining, a silo compares its ring mode with that of every live member and
refuses to start if one differs, naming both settings and how to fix it; the
credentials verifier is checked the same way (``membership.credentials``).

Live members are counted as for the credentials (``live_members``): Joining,
Active or ShuttingDown, heartbeat not stale, not an earlier incarnation of the
joining silo (it is buried, since this one holds its port). A row without a
ring mode was written by a version that could only build the hashed ring, so
it counts as hashed.

The check cannot be raced: a join is a compare-and-swap on the table version,
so of two silos that read the same table, one insert loses, re-reads the table
and sees the other's row before it tries again.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from orleanspy.errors import ConfigurationError
from orleanspy.identity import SiloAddress
from orleanspy.membership.model import MembershipEntry, MembershipSnapshot, SiloStatus
from orleanspy.options import MembershipOptions

__all__ = [
    "RING_BALANCED",
    "RING_HASHED",
    "RingModeMismatchError",
    "check_ring_mode",
    "live_members",
    "ring_is_balanced",
    "ring_mode",
    "row_ring_mode",
]

RING_BALANCED = "balanced"
RING_HASHED = "hashed"

_LIVE = (SiloStatus.JOINING, SiloStatus.ACTIVE, SiloStatus.SHUTTING_DOWN)


class RingModeMismatchError(ConfigurationError):
    """This silo would build another ring than the cluster's live members."""


def ring_mode(balanced: bool) -> str:
    """The ring mode a silo with ``MembershipOptions(balanced_ring=balanced)`` records."""
    return RING_BALANCED if balanced else RING_HASHED


def row_ring_mode(entry: MembershipEntry) -> str:
    """The ring ``entry``'s silo builds: its recorded mode, hashed when the row has none."""
    return entry.ring_mode if entry.ring_mode is not None else RING_HASHED


def live_members(
    snapshot: MembershipSnapshot, me: SiloAddress, now: datetime, options: MembershipOptions
) -> Iterator[tuple[SiloAddress, MembershipEntry]]:
    """The rows a silo joining as ``me`` must agree with (see the module docstring)."""
    for silo, (entry, _etag) in snapshot.entries.items():
        if silo == me or entry.status not in _LIVE:
            continue
        if entry.is_stale(now, options.i_am_alive_staleness):
            continue
        if silo.host == me.host and silo.port == me.port and silo.generation < me.generation:
            continue  # an earlier run of this very silo: it is buried, not compared
        yield silo, entry


def ring_is_balanced(snapshot: MembershipSnapshot) -> bool:
    """Whether the cluster's Active silos build the balanced ring (all of them say
    so; with none Active, the default). What a reader outside the cluster uses to
    build the ring the silos run."""
    active = [snapshot.entries[s][0] for s in snapshot.active_silos()]
    if not active:
        return MembershipOptions().balanced_ring
    return all(row_ring_mode(e) == RING_BALANCED for e in active)


def _setting(mode: str) -> str:
    if mode == RING_BALANCED:
        return "balanced_ring=True"
    if mode == RING_HASHED:
        return "balanced_ring=False"
    return f"ring mode {mode!r}, which this version does not know"


def check_ring_mode(
    mine: str | None,
    snapshot: MembershipSnapshot,
    me: SiloAddress,
    now: datetime,
    options: MembershipOptions,
) -> None:
    """Raise ``RingModeMismatchError`` if a live member builds another ring than
    ``mine`` (``None``: nothing to check). The message names both settings, the
    member, and the two ways out: join with the cluster's setting, or stop every
    silo and start them all with the new one."""
    if mine is None:
        return
    for silo, entry in live_members(snapshot, me, now, options):
        theirs = row_ring_mode(entry)
        if theirs == mine:
            continue
        recorded = "" if entry.ring_mode is not None else ", its row written before ring modes"
        if mine == RING_BALANCED and theirs == RING_HASHED:
            join = (
                "start this silo with MembershipOptions(balanced_ring=False) "
                "(--set membership.balanced_ring=false, or "
                "ORLEANSPY_MEMBERSHIP_BALANCED_RING=false)"
            )
        elif mine == RING_HASHED and theirs == RING_BALANCED:
            join = "start this silo with balanced_ring=True (the default: drop the setting)"
        else:
            join = f"start this silo with the cluster's {_setting(theirs)}"
        raise RingModeMismatchError(
            f"refusing to join: this silo builds the {mine} ring (MembershipOptions."
            f"{_setting(mine)}) and the cluster the {theirs} ring (member {silo}, "
            f"{entry.status.name}: {_setting(theirs)}{recorded}); nothing was written to "
            "the membership table. Every silo of a cluster must build the same ring, or "
            "they disagree on who owns which reminders. To join this cluster, "
            f"{join}; to move the cluster to the {mine} ring, stop every silo, then "
            f"start them all with {_setting(mine)}."
        )
