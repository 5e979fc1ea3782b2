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

This module holds the contract and ``ActivationAddress``. The backends are
siblings: ``memory`` (one process, tests), ``redis`` and ``postgres``; ``cached``
is ``CachedDirectory``, an LRU in front of any backend.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from orleanspy.identity import GrainId, SiloAddress

__all__ = ["ActivationAddress", "GrainDirectory"]


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
