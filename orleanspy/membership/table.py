"""The membership table contract: the ``MembershipTable`` protocol.

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
The rows, the version and snapshots are in ``orleanspy.membership.model``.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import datetime
from typing import Protocol, runtime_checkable

from orleanspy.identity import SiloAddress
from orleanspy.membership.model import MembershipEntry, MembershipSnapshot, TableVersion

__all__ = ["MembershipTable"]


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
