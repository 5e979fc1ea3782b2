"""``CachedDirectory``: an LRU cache of lookups in front of any grain directory."""

from __future__ import annotations

from collections import OrderedDict
from contextlib import AsyncExitStack

from orleanspy.directory.table import ActivationAddress, GrainDirectory
from orleanspy.identity import GrainId, SiloAddress

__all__ = ["CachedDirectory"]


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
