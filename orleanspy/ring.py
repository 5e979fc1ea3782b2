"""The consistent-hash ring: ranges of the 32-bit uniform hash space."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HASH_SPACE", "RingRange"]

HASH_SPACE = 1 << 32


@dataclass(frozen=True, slots=True)
class RingRange:
    """Hashes in ``(begin, end]``; wraps when ``begin >= end``; ``(0, 0)`` is everything."""

    begin: int
    end: int

    def __post_init__(self) -> None:
        if not (0 <= self.begin < HASH_SPACE and 0 <= self.end < HASH_SPACE):
            raise ValueError(f"ring range bounds must be in [0, 2**32): {self}")

    def __contains__(self, h: object) -> bool:
        if not isinstance(h, int):
            return False
        if self.begin < self.end:
            return self.begin < h <= self.end
        return h > self.begin or h <= self.end

    @property
    def size(self) -> int:
        """How many hash values the range holds."""
        return (self.end - self.begin) % HASH_SPACE or HASH_SPACE

    @classmethod
    def full(cls) -> RingRange:
        return cls(0, 0)
