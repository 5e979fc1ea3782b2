"""``InMemoryGrainStorage``: grain state held in process memory.

The embedded default and the provider of fast tests. Nothing is durable: the
state lives as long as the provider object. Two silos in one process that are
given the same object share it (the way tests force two activations of one
grain to meet in one store).
"""

from __future__ import annotations

import itertools
from contextlib import AsyncExitStack

from orleanspy.identity import GrainId
from orleanspy.schema import MEMORY_SCHEMA, SchemaVersion
from orleanspy.storage.contract import StoredState

__all__ = ["InMemoryGrainStorage"]


class InMemoryGrainStorage:
    """A ``GrainStorage`` in a dict. Every operation is O(1) and never awaits, so a
    compare-and-swap cannot interleave with another one on the same event loop."""

    schema = SchemaVersion("memory", "grain_state", MEMORY_SCHEMA)

    def __init__(self) -> None:
        # (grain canonical, name): a tuple, so no separator can make two states collide.
        self._states: dict[tuple[str, str], StoredState] = {}
        # One counter for every state: an etag is never reused, also across a clear.
        self._versions = itertools.count(1)

    async def start(self, stack: AsyncExitStack) -> None:
        """Nothing to connect."""

    async def read(self, grain_id: GrainId, name: str) -> StoredState | None:
        return self._states.get((grain_id.canonical, name))

    async def write(
        self, grain_id: GrainId, name: str, data: bytes, etag: str | None
    ) -> str | None:
        key = (grain_id.canonical, name)
        current = self._states.get(key)
        if (current.etag if current is not None else None) != etag:
            return None
        new = str(next(self._versions))
        self._states[key] = StoredState(bytes(data), new)
        return new

    async def clear(self, grain_id: GrainId, name: str, etag: str | None) -> bool:
        key = (grain_id.canonical, name)
        current = self._states.get(key)
        if (current.etag if current is not None else None) != etag:
            return False
        self._states.pop(key, None)
        return True

    def __len__(self) -> int:
        """How many states are stored (for tests)."""
        return len(self._states)
