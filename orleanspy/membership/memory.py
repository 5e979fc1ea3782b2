"""``InMemoryMembershipTable``: the membership table of a single process.

For the embedded silo and for tests. Every method runs without awaiting
anything, so each one is atomic with respect to the event loop; that is the
whole of its concurrency control.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import datetime

from orleanspy.identity import SiloAddress
from orleanspy.membership.model import (
    INITIAL_VERSION,
    MembershipEntry,
    MembershipSnapshot,
    SiloStatus,
    TableVersion,
)
from orleanspy.schema import MEMORY_SCHEMA, SchemaVersion

__all__ = ["InMemoryMembershipTable"]


class InMemoryMembershipTable:
    """A ``MembershipTable`` held in a dict. Etags are the table version number
    at which a row was written, which no later write can reuse."""

    schema = SchemaVersion("memory", "membership", MEMORY_SCHEMA)

    def __init__(self) -> None:
        self._rows: dict[SiloAddress, tuple[MembershipEntry, str]] = {}
        self._version = INITIAL_VERSION

    async def start(self, stack: AsyncExitStack) -> None:
        """Nothing to connect; the table lives as long as the object."""

    async def read_all(self) -> MembershipSnapshot:
        return MembershipSnapshot(dict(self._rows), self._version)

    async def insert_row(self, entry: MembershipEntry, version: TableVersion) -> bool:
        if entry.silo in self._rows or not self._version_matches(version):
            return False
        self._write(entry, version)
        return True

    async def update_row(self, entry: MembershipEntry, etag: str, version: TableVersion) -> bool:
        current = self._rows.get(entry.silo)
        if current is None or current[1] != etag or not self._version_matches(version):
            return False
        self._write(entry, version)
        return True

    async def update_i_am_alive(self, silo: SiloAddress, at: datetime) -> None:
        current = self._rows.get(silo)
        if current is not None:
            self._rows[silo] = (current[0].with_i_am_alive(at), current[1])

    async def delete_dead_before(self, cutoff: datetime) -> int:
        doomed = [
            s
            for s, (e, _) in self._rows.items()
            if e.status == SiloStatus.DEAD and e.i_am_alive < cutoff
        ]
        for silo in doomed:
            del self._rows[silo]
        return len(doomed)

    def _version_matches(self, version: TableVersion) -> bool:
        if version.etag != self._version.etag:
            return False
        if version.version <= self._version.version:
            raise ValueError(
                f"table version {version.version} is not above the stored "
                f"{self._version.version}: pass snapshot.version.next()"
            )
        return True

    def _write(self, entry: MembershipEntry, version: TableVersion) -> None:
        etag = str(version.version)
        self._rows[entry.silo] = (entry, etag)
        self._version = TableVersion(version.version, etag)
