"""Force two activations of one grain to exist at once, for tests of grain state.

In a cluster, a grain can briefly have two activations while membership
changes (a silo wrongly suspected, a directory entry lost with its Redis). The
runtime makes that rare, which makes it hard to test. ``duplicate_activations``
makes it certain: it starts ``count`` embedded silos that share grain storage but
have a directory each, so calling one grain through every silo activates it on
every silo::

    async with duplicate_activations("redis://127.0.0.1:6379/0") as (a, b):
        await a.client.get_grain(Account, "x").deposit(5)   # activation 1 writes
        await b.client.get_grain(Account, "x").deposit(7)   # activation 2 read first?
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from orleanspy.identity import GrainId
from orleanspy.options import SiloOptions
from orleanspy.runtime.silo import Silo
from orleanspy.storage.contract import GrainStorage, StoredState

__all__ = ["duplicate_activations"]


class _Shared:
    """A provider started once by ``duplicate_activations``, not by each silo."""

    def __init__(self, inner: GrainStorage) -> None:
        self._inner = inner

    async def start(self, stack: AsyncExitStack) -> None:
        """Already started."""

    async def read(self, grain_id: GrainId, name: str) -> StoredState | None:
        return await self._inner.read(grain_id, name)

    async def write(
        self, grain_id: GrainId, name: str, data: bytes, etag: str | None
    ) -> str | None:
        return await self._inner.write(grain_id, name, data, etag)

    async def clear(self, grain_id: GrainId, name: str, etag: str | None) -> bool:
        return await self._inner.clear(grain_id, name, etag)


@asynccontextmanager
async def duplicate_activations(
    storage: str | GrainStorage,
    count: int = 2,
    *,
    storage_name: str = "default",
    options: SiloOptions | None = None,
) -> AsyncIterator[list[Silo]]:
    """``count`` started embedded silos whose grain storage ``storage_name`` is
    ``storage`` (a URL each silo opens, or a provider started here once and
    shared); each has its own directory, so each activates every grain it is
    called for. ``options`` is the template (``redis_url`` must be unset)."""
    if count < 2:
        raise ValueError("duplicate_activations needs at least two silos")
    async with AsyncExitStack() as stack:
        shared: str | GrainStorage = storage
        if not isinstance(storage, str):
            await storage.start(stack)
            shared = _Shared(storage)
        base = options or SiloOptions()
        silos = []
        for i in range(count):
            providers = {**(base.storage or {}), storage_name: shared}
            opts = dataclasses.replace(base, name=f"twin-{i}", storage=providers)
            silos.append(await stack.enter_async_context(Silo.local(opts)))
        yield silos
