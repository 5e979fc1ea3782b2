"""Where a grain lives: the seam between the dispatcher and directory/placement.

The embedded silo hosts everything itself (``LocalLocator``); a cluster silo
uses the grain directory, placement and membership (``runtime.cluster``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from orleanspy.grain import GrainDefinition
from orleanspy.identity import GrainId, SiloAddress

if TYPE_CHECKING:
    from orleanspy.directory.table import ActivationAddress

__all__ = ["LocalLocator", "Locator"]


class Locator(Protocol):
    """Finds or chooses the silo for a grain and records activations."""

    @property
    def local_only(self) -> bool:
        """``True`` when this silo hosts every grain (no directory, no placement).
        Fixed for the locator's life: the dispatcher reads it once."""
        ...

    def cached(self, grain_id: GrainId) -> SiloAddress | None:
        """The silo of a known activation, without I/O, if the cache has it."""
        ...

    async def locate(
        self,
        grain_id: GrainId,
        definition: GrainDefinition | None,
        prefer: SiloAddress | None = None,
    ) -> SiloAddress:
        """The silo that has (or should create) the grain's activation, among
        those that host its type; ``definition`` (its placement) may be unknown
        here when this silo does not host the type. ``prefer``: a grain with no
        live activation is placed there, instead of by its strategy, when that
        silo hosts the type (reminder-affine placement)."""
        ...

    async def register(
        self, grain_id: GrainId, address: ActivationAddress
    ) -> ActivationAddress | None:
        """Claim the grain for ``address``; ``None`` if claimed, else the winner."""
        ...

    async def unregister(self, grain_id: GrainId, address: ActivationAddress) -> None:
        """Release the claim (if it is still ours)."""
        ...

    def invalidate(self, grain_id: GrainId) -> None:
        """Forget what the cache knows of ``grain_id``."""
        ...

    async def silo_unreachable(self, silo: SiloAddress) -> bool:
        """A send to ``silo`` failed; ``True`` if it is now known to be gone, so
        the message may be routed again."""
        ...

    def knows(self, silo: SiloAddress) -> bool:
        """``True`` if ``silo`` is this silo or a live member of the cluster as
        this silo last read the membership table (no I/O)."""
        ...

    async def learn(self, silo: SiloAddress) -> bool:
        """``knows(silo)``, after re-reading the membership table if it does not
        (rate-limited): for a silo that joined since the last read."""
        ...


class LocalLocator:
    """Every grain lives here: the embedded single-silo default."""

    def __init__(self, address: SiloAddress) -> None:
        self._address = address

    @property
    def local_only(self) -> bool:
        return True

    def cached(self, grain_id: GrainId) -> SiloAddress | None:
        return self._address

    async def locate(
        self,
        grain_id: GrainId,
        definition: GrainDefinition | None,
        prefer: SiloAddress | None = None,
    ) -> SiloAddress:
        return self._address

    async def register(
        self, grain_id: GrainId, address: ActivationAddress
    ) -> ActivationAddress | None:
        return None

    async def unregister(self, grain_id: GrainId, address: ActivationAddress) -> None:
        return None

    def invalidate(self, grain_id: GrainId) -> None:
        return None

    async def silo_unreachable(self, silo: SiloAddress) -> bool:
        return False

    def knows(self, silo: SiloAddress) -> bool:
        return silo == self._address

    async def learn(self, silo: SiloAddress) -> bool:
        return silo == self._address
