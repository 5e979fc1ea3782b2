"""Which cluster features the reminder service may use now.

A feature tied to a protocol level (``versions.Feature``) is used only while
every live silo speaks that level (``membership.agreement.cluster_level``).
The service asks on its hot path (a tick with a deadline, a counter), so the
level is read at most once per ``REFRESH_S`` of monotonic time and cached: a
feature switches on or off within that long after the membership changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from orleanspy.versions import PROTOCOL, Feature

__all__ = ["REFRESH_S", "ServiceFeatures"]

#: How long a read of the cluster's feature level is used for.
REFRESH_S: Final = 1.0


class ServiceFeatures:
    """``on(feature)``: whether the cluster's level reaches ``feature``;
    ``level`` gives that level (``None``: this release's, for a silo of its own
    or a test)."""

    __slots__ = ("_level", "_read", "_value")

    def __init__(self, level: Callable[[], int] | None = None) -> None:
        self._level = level
        self._value = PROTOCOL
        self._read = float("-inf")

    def on(self, feature: Feature) -> bool:
        if self._level is None:
            return feature <= PROTOCOL
        now = time.monotonic()
        if now - self._read >= REFRESH_S:
            self._value = self._level()
            self._read = now
        return self._value >= feature
