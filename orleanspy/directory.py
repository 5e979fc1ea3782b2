"""The grain directory: which activation of a grain is the live one, and where.

A grain has at most one registered activation in the cluster. The silo that
activates a grain registers it; the first registration wins and every other
silo that raced to activate the same grain is told the winner, gives up its own
activation and forwards to it. Callers look activations up before sending.

Entries are not leased: an entry of a silo that died stays until someone meets
it. A caller that looks up an address on a silo its membership view knows to
be dead calls ``unregister(grain_id, dead_address)`` (a compare-and-delete, so
only the stale entry goes) and registers afresh. ``unregister_silo`` is the
bulk form a backend may support on top of that.

This module holds the contract, ``ActivationAddress``, the in-memory directory
(one process, tests) and ``CachedDirectory``, an LRU in front of any backend.
The Redis backend lives in ``orleanspy.redis_directory`` so ``redis`` loads only
when it is chosen.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from orleanspy.identity import GrainId, SiloAddress

__all__ = ["ActivationAddress", "CachedDirectory", "GrainDirectory", "InMemoryGrainDirectory"]


@dataclass(frozen=True, slots=True)
class ActivationAddress:
    """One activation: the silo hosting it and an id unique to this activation.

    A grain deactivated and activated again on the same silo gets a new
    ``activation_id``, so a stale address never matches the new activation.
    """

    silo: SiloAddress
    activation_id: str


@runtime_checkable
class GrainDirectory(Protocol):
    """Maps a ``GrainId`` to its single registered ``ActivationAddress``.

    Lost races are values: ``register`` returns the winner, ``unregister``
    returns ``False``. Exceptions mean the store is unreachable
    (``StorageUnavailableError``) or misbehaving (``StorageError``).
    """

    async def start(self, stack: AsyncExitStack) -> None:
        """Connect and prepare; push cleanup onto ``stack``. Called once before use."""
        ...

    async def register(self, grain_id: GrainId, address: ActivationAddress) -> ActivationAddress:
        """Register ``address`` for ``grain_id`` unless the grain already has an entry.

        Returns ``address`` if it was stored. Otherwise (lost race, or the grain
        was registered before) returns the existing entry unchanged: the caller
        forwards to that winner and drops its own activation. Registering an
        address that is already the entry returns it (idempotent).
        """
        ...

    async def lookup(self, grain_id: GrainId) -> ActivationAddress | None:
        """The registered activation of ``grain_id``, or ``None``.

        The entry may name a silo that has since died; the caller checks it
        against membership and clears it with ``unregister``.
        """
        ...

    async def unregister(self, grain_id: GrainId, address: ActivationAddress) -> bool:
        """Remove the entry of ``grain_id`` only if it equals ``address``.

        Returns ``True`` if it was removed; ``False`` if there was no entry or the
        entry is another activation (a newer one must not be removed by a stale
        caller).
        """
        ...

    async def unregister_silo(self, silo: SiloAddress) -> int:
        """Best effort: remove entries of activations on ``silo`` (declared dead).

        Returns how many entries were removed. A backend that cannot find a
        silo's entries cheaply may remove none and return ``0``; those entries
        are then cleared one by one when callers meet them (see the module doc).
        Must never remove an entry of another silo.
        """
        ...


class InMemoryGrainDirectory:
    """A directory in this process's memory: for one-silo deployments and tests.

    Every operation completes without awaiting, so each is atomic with respect
    to other tasks. ``unregister_silo`` is exact (a per-silo index is kept).
    """

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


class CachedDirectory:
    """An LRU cache of lookups in front of any ``GrainDirectory``.

    A lookup that hits the cache does no I/O. Misses (``None``) are not cached:
    a grain may be registered elsewhere the next moment. ``register`` caches the
    winner it gets back; ``unregister`` and ``unregister_silo`` drop what they
    remove. The cache may hold an entry another silo has since replaced — callers
    that find an address stale (the silo is dead or says the activation is gone)
    call ``invalidate`` and look up again.
    """

    __slots__ = ("_cache", "_epoch", "_inner", "_max_size")

    def __init__(self, inner: GrainDirectory, max_size: int = 100_000) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self._inner = inner
        self._max_size = max_size
        self._cache: OrderedDict[GrainId, ActivationAddress] = OrderedDict()
        # Bumped on every invalidation. A lookup that raced with one (the inner
        # read started before it) must not put back what was just dropped.
        self._epoch = 0

    @property
    def inner(self) -> GrainDirectory:
        return self._inner

    async def start(self, stack: AsyncExitStack) -> None:
        """Start the inner directory."""
        await self._inner.start(stack)

    async def register(self, grain_id: GrainId, address: ActivationAddress) -> ActivationAddress:
        """Register through the inner directory; cache and return the winner."""
        epoch = self._epoch
        winner = await self._inner.register(grain_id, address)
        if epoch == self._epoch:
            self._put(grain_id, winner)
        return winner

    async def lookup(self, grain_id: GrainId) -> ActivationAddress | None:
        """The cached entry, or the inner directory's (cached if found)."""
        hit = self._cache.get(grain_id)
        if hit is not None:
            self._cache.move_to_end(grain_id)
            return hit
        epoch = self._epoch
        found = await self._inner.lookup(grain_id)
        if found is not None and epoch == self._epoch:
            self._put(grain_id, found)
        return found

    def peek(self, grain_id: GrainId) -> ActivationAddress | None:
        """The cached entry of ``grain_id``, if any (no I/O; the dispatcher's fast path)."""
        return self._cache.get(grain_id)

    async def unregister(self, grain_id: GrainId, address: ActivationAddress) -> bool:
        """Unregister through the inner directory; the cached entry is dropped either
        way (if the inner entry differed, the cache was stale)."""
        self.invalidate(grain_id)
        removed = await self._inner.unregister(grain_id, address)
        self.invalidate(grain_id)
        return removed

    async def unregister_silo(self, silo: SiloAddress) -> int:
        """Unregister through the inner directory and drop the silo's cached entries."""
        self.invalidate_silo(silo)
        removed = await self._inner.unregister_silo(silo)
        self.invalidate_silo(silo)
        return removed

    def invalidate(self, grain_id: GrainId) -> None:
        """Forget the cached entry of ``grain_id`` (no I/O)."""
        self._epoch += 1
        self._cache.pop(grain_id, None)

    def invalidate_silo(self, silo: SiloAddress) -> int:
        """Forget every cached entry on ``silo``; returns how many (no I/O).

        A scan of the cache: silos die rarely, and an index per silo would cost
        memory on every entry.
        """
        self._epoch += 1
        stale = [g for g, a in self._cache.items() if a.silo == silo]
        for grain_id in stale:
            del self._cache[grain_id]
        return len(stale)

    def clear(self) -> None:
        """Forget everything cached."""
        self._epoch += 1
        self._cache.clear()

    def _put(self, grain_id: GrainId, address: ActivationAddress) -> None:
        self._cache[grain_id] = address
        self._cache.move_to_end(grain_id)
        if len(self._cache) > self._max_size:
            self._cache.popitem(last=False)

    def __len__(self) -> int:
        """How many entries are cached."""
        return len(self._cache)
