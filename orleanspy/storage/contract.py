"""The grain storage contract. Every backend implements ``GrainStorage``.

A stored state is identified by ``(grain_id, name)`` within the provider's
service id: ``name`` is the state's name on the grain class, so one grain may
keep several states. The provider stores opaque bytes; encoding the state value
(and its format version) is the caller's job (``orleanspy.state``), so a
provider never needs to know the grain's types.

Every stored state carries an etag: a string the provider makes up on each
write, never equal to an etag the same ``(grain_id, name)`` had before, also
across a ``clear`` and a later write (a writer holding an etag from before the
clear must lose). Writes and clears are compare-and-swap on that etag:

- ``etag=None`` means "I read nothing": the write succeeds only if nothing is
  stored; the clear succeeds (it is a no-op) only if nothing is stored.
- ``etag="..."`` means "I read this version": the write or clear succeeds only
  if that exact version is stored.

Lost races are values, not exceptions: ``write`` returns ``None`` and ``clear``
``False``. Exceptions mean the store is unreachable (``StorageUnavailableError``)
or misbehaving (``StorageError``, e.g. a record that is not what this provider
writes). Concurrent writers with the same etag: exactly one wins.

Cost: each operation is one round trip to the store and touches one record;
nothing grows with the number of stored states.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from orleanspy.identity import GrainId

__all__ = ["GrainStorage", "StoredState"]


@dataclass(frozen=True, slots=True)
class StoredState:
    """What ``GrainStorage.read`` returns: the bytes last written and their etag."""

    data: bytes
    etag: str


@runtime_checkable
class GrainStorage(Protocol):
    """Durable, versioned bytes per ``(grain_id, state name)``."""

    async def start(self, stack: AsyncExitStack) -> None:
        """Connect and prepare (e.g. create the schema); push cleanup onto ``stack``.

        Called once before use. A provider given a client it did not create
        never closes it."""
        ...

    async def read(self, grain_id: GrainId, name: str) -> StoredState | None:
        """The stored bytes and their etag, or ``None`` if nothing is stored."""
        ...

    async def write(
        self, grain_id: GrainId, name: str, data: bytes, etag: str | None
    ) -> str | None:
        """Store ``data`` if the stored etag is ``etag`` (``None``: nothing stored).

        Returns the new etag, or ``None`` if the stored etag differs (a lost race;
        nothing was written). ``data`` may be any bytes, empty or megabytes long;
        ``read`` returns them unchanged."""
        ...

    async def clear(self, grain_id: GrainId, name: str, etag: str | None) -> bool:
        """Remove the stored state if the stored etag is ``etag``.

        ``True`` if the state is gone now (removed, or ``etag`` was ``None`` and
        nothing was stored); ``False`` if the stored etag differs (nothing removed)."""
        ...
