"""The in-memory grain directory: one process (single-silo deployments, tests)."""

from __future__ import annotations

from contextlib import AsyncExitStack

from orleanspy.directory.table import ActivationAddress
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.schema import MEMORY_SCHEMA, SchemaVersion

__all__ = ["InMemoryGrainDirectory"]


class InMemoryGrainDirectory:
    """A directory in this process's memory: for one-silo deployments and tests.

    Every operation completes without awaiting, so each is atomic with respect
    to other tasks. ``unregister_silo`` is exact (a per-silo index is kept).
    """

    schema = SchemaVersion("memory", "directory", MEMORY_SCHEMA)

    __slots__ = ("_by_silo", "_entries")

    def __init__(self) -> None:
        self._entries: dict[GrainId, ActivationAddress] = {}
        self._by_silo: dict[SiloAddress, set[GrainId]] = {}

    async def start(self, stack: AsyncExitStack) -> None:
        """Nothing to connect."""

    async def register(self, grain_id: GrainId, address: ActivationAddress) -> ActivationAddress:
        """See ``GrainDirectory.register``."""
        current = self._entries.get(grain_id)
        if current is not None:
            return current
        self._entries[grain_id] = address
        self._by_silo.setdefault(address.silo, set()).add(grain_id)
        return address

    async def lookup(self, grain_id: GrainId) -> ActivationAddress | None:
        """See ``GrainDirectory.lookup``."""
        return self._entries.get(grain_id)

    async def unregister(self, grain_id: GrainId, address: ActivationAddress) -> bool:
        """See ``GrainDirectory.unregister``."""
        if self._entries.get(grain_id) != address:
            return False
        del self._entries[grain_id]
        grains = self._by_silo[address.silo]
        grains.discard(grain_id)
        if not grains:
            del self._by_silo[address.silo]
        return True

    async def unregister_silo(self, silo: SiloAddress) -> int:
        """Remove every entry on ``silo``; returns how many (exact)."""
        grains = self._by_silo.pop(silo, set())
        for grain_id in grains:
            del self._entries[grain_id]
        return len(grains)

    def __len__(self) -> int:
        return len(self._entries)
