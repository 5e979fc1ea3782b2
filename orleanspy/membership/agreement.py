"""Settings every silo of a cluster must share, checked in the table before joining;
and what the cluster's rows say together: its feature level and its ring.

**Versions.** Each row records the protocol window its silo speaks
(``MembershipEntry.window``; ``orleanspy.versions``). A joining silo whose window
does not overlap a live member's is refused before it writes anything
(``check_versions``: ``IncompatibleVersionError`` naming both releases and the
window). The cluster's feature level (``cluster_level``) is the lowest newest
protocol among the live rows: a ``versions.Feature`` is used only at or above it.

**The ring.** Each membership row records the ring its silo builds
(``MembershipEntry.ring_mode``: ``"balanced"`` or ``"hashed"``). Two silos that
build different rings from the same Active silos disagree on who owns a hash:
both fire some reminders, neither fires others. A silo with
``MembershipOptions.balanced_ring`` set insists on that ring; one without it (the
default) follows the cluster: it builds the ring of the Active silos that insist
(every 0.1.x silo insists, on its own setting), and the balanced one when none
does (``cluster_ring_mode``), so the balanced ring switches on once the last
silo that insists on the hashed one has left. A follower records the ring it
builds now, so a joining silo that insists compares with the truth. Before it
writes Joining, an insisting silo compares its ring mode with that of every
live member and refuses to start if one differs, naming both settings and how
to fix it; the credentials verifier is checked the same way
(``membership.credentials``).

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
from orleanspy.versions import (
    PROTOCOL,
    Feature,
    FeatureUnavailableError,
    IncompatibleVersionError,
    ProtocolWindow,
    incompatibility,
    release_of,
)

__all__ = [
    "RING_BALANCED",
    "RING_HASHED",
    "RingModeMismatchError",
    "check_ring_mode",
    "check_versions",
    "cluster_level",
    "cluster_ring_mode",
    "live_members",
    "require_feature",
    "ring_mode",
    "row_release",
    "row_ring_mode",
]

RING_BALANCED = "balanced"
RING_HASHED = "hashed"

_LIVE = (SiloStatus.JOINING, SiloStatus.ACTIVE, SiloStatus.SHUTTING_DOWN)


class RingModeMismatchError(ConfigurationError):
    """This silo would build another ring than the cluster's live members."""


def ring_mode(balanced: bool | None) -> str | None:
    """The ring mode a silo with ``MembershipOptions(balanced_ring=balanced)``
    insists on (``None``: it follows the cluster)."""
    if balanced is None:
        return None
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


def cluster_ring_mode(snapshot: MembershipSnapshot) -> str:
    """The ring the cluster's Active silos build: that of the Active silos that
    insist on one (a row that does not follow: every 0.1.x row, or a silo with
    ``balanced_ring`` set), the hashed one if they disagree; the balanced one when
    every Active silo follows, or none is Active. Every silo that follows
    computes this from the same snapshot, so they all build the same ring."""
    insisting = {
        row_ring_mode(e)
        for s in snapshot.active_silos()
        if not (e := snapshot.entries[s][0]).ring_follows
    }
    if not insisting:
        return RING_BALANCED
    return RING_BALANCED if insisting == {RING_BALANCED} else RING_HASHED


def row_release(entry: MembershipEntry) -> str:
    """The release a row's silo runs, for messages (a row that does not say: 0.1.x)."""
    return entry.release if entry.release is not None else "0.1.x"


def cluster_level(snapshot: MembershipSnapshot, mine: int = PROTOCOL) -> int:
    """The cluster's feature level: the newest protocol every live row (Joining,
    Active or ShuttingDown) speaks, at most ``mine``. Joining rows count, so a
    feature switches off before an older silo that is joining can take work;
    Dead rows do not."""
    level = mine
    for entry, _etag in snapshot.entries.values():
        if entry.status in _LIVE:
            level = min(level, entry.window.newest)
    return level


def require_feature(snapshot: MembershipSnapshot, feature: Feature | str, what: str = "") -> None:
    """Raise ``FeatureUnavailableError`` unless every live row speaks the level of
    ``feature`` (a ``Feature``, or its name; ``cluster_level``): the message
    names ``what`` asked for it, the feature, and each silo that lacks it
    (address, status, release)."""
    wanted = feature if isinstance(feature, Feature) else Feature[feature]
    lacking = tuple(
        f"{silo} ({entry.status.name}, orleanspy {row_release(entry)})"
        for silo, (entry, _etag) in sorted(snapshot.entries.items(), key=lambda kv: str(kv[0]))
        if entry.status in _LIVE and entry.window.newest < wanted
    )
    if not lacking:
        return
    asker = f"{what} needs" if what else "this needs"
    raise FeatureUnavailableError(
        f"{asker} the cluster feature {wanted.name} (protocol {int(wanted)}, "
        f"{release_of(int(wanted))}), which {len(lacking)} live silo(s) lack: "
        f"{', '.join(lacking)}. Nothing was written; finish the roll (every silo on a "
        "release that speaks it) and try again (docs/upgrades.md)",
        wanted.name,
        lacking,
    )


def check_versions(
    snapshot: MembershipSnapshot,
    me: SiloAddress,
    now: datetime,
    options: MembershipOptions,
    mine: ProtocolWindow | None = None,
) -> None:
    """Raise ``IncompatibleVersionError`` if a live member speaks no protocol this
    silo speaks (``mine``, default this release's window). Nothing is written
    before the check, so a refused silo leaves the table as it was."""
    window = mine if mine is not None else ProtocolWindow.mine()
    for silo, entry in live_members(snapshot, me, now, options):
        who = f"member {silo} ({entry.status.name}, orleanspy {row_release(entry)})"
        why = incompatibility(window, entry.window, who)
        if why is not None:
            raise IncompatibleVersionError(
                f"refusing to join: {why}. Nothing was written to the membership table. "
                "A cluster runs two adjacent minor releases side by side while it rolls "
                "(docs/upgrades.md)."
            )


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
