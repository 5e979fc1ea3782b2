"""Placement: which silo activates a grain that has no activation yet.

A strategy is a small frozen value with one method, ``choose``. It is asked only
when the directory has no entry for the grain; once an activation is
registered, calls go to it wherever it is. ``silos`` is the sorted list of
Active silos that host the grain's type; it is never empty when the runtime
asks, but a strategy raises ``SiloUnavailableError`` if it is.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from orleanspy.errors import SiloUnavailableError
from orleanspy.identity import GrainId, SiloAddress

__all__ = [
    "DEFAULT_PLACEMENT",
    "HashBasedPlacement",
    "PlacementStrategy",
    "PreferLocalPlacement",
    "RandomPlacement",
    "choose_silo",
]


@runtime_checkable
class PlacementStrategy(Protocol):
    """Picks the silo for a new activation."""

    def choose(
        self, grain_id: GrainId, local: SiloAddress | None, silos: Sequence[SiloAddress]
    ) -> SiloAddress:
        """One of ``silos`` (sorted Active silos hosting the type) for ``grain_id``.

        ``local`` is the deciding silo, or ``None`` when a client decides.
        Raises ``SiloUnavailableError`` if ``silos`` is empty.
        """
        ...


def _require(grain_id: GrainId, silos: Sequence[SiloAddress]) -> None:
    if not silos:
        raise SiloUnavailableError(f"no active silo hosts grain type {grain_id.type_name!r}")


@dataclass(frozen=True, slots=True)
class RandomPlacement:
    """A uniformly random silo (the default, as in Orleans). ``rng`` may be seeded
    for reproducible tests; by default the module's generator is used."""

    rng: random.Random | None = field(default=None, compare=False, repr=False)

    def choose(
        self, grain_id: GrainId, local: SiloAddress | None, silos: Sequence[SiloAddress]
    ) -> SiloAddress:
        """See ``PlacementStrategy.choose``."""
        _require(grain_id, silos)
        return (self.rng or random).choice(silos)


@dataclass(frozen=True, slots=True)
class PreferLocalPlacement:
    """The deciding silo if it hosts the type, else a random one (``fallback``)."""

    fallback: RandomPlacement = field(default_factory=RandomPlacement)

    def choose(
        self, grain_id: GrainId, local: SiloAddress | None, silos: Sequence[SiloAddress]
    ) -> SiloAddress:
        """See ``PlacementStrategy.choose``."""
        _require(grain_id, silos)
        if local is not None and local in silos:
            return local
        return self.fallback.choose(grain_id, local, silos)


@dataclass(frozen=True, slots=True)
class HashBasedPlacement:
    """``silos[grain_id.uniform_hash() % len(silos)]``: the same silo for a grain in
    every process while the silo set stays the same (not a consistent hash:
    most grains move when a silo joins or leaves)."""

    def choose(
        self, grain_id: GrainId, local: SiloAddress | None, silos: Sequence[SiloAddress]
    ) -> SiloAddress:
        """See ``PlacementStrategy.choose``."""
        _require(grain_id, silos)
        return silos[grain_id.uniform_hash() % len(silos)]


DEFAULT_PLACEMENT: PlacementStrategy = RandomPlacement()


def choose_silo(
    grain_id: GrainId,
    local: SiloAddress | None,
    silos: Sequence[SiloAddress],
    strategy: PlacementStrategy | None = None,
) -> SiloAddress:
    """Apply ``strategy`` (``DEFAULT_PLACEMENT`` when ``None``) to ``silos``."""
    return (strategy or DEFAULT_PLACEMENT).choose(grain_id, local, silos)
