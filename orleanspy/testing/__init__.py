"""Test support shipped for users and provider authors.

``ManualClock`` drives time by hand, ``InProcessCluster`` runs several silos in
one process, ``RedisServer`` starts a private ``redis-server`` and ``wait_for``
polls a condition with a deadline, ``simulate_tick`` delivers a reminder tick
by hand (``receive_reminder`` refuses calls that are not ticks).

Every provider kit (``check_grain_storage``, ``check_membership_table``,
``check_grain_directory``, ``check_reminder_table``, ...) takes a
``ProviderFactory``: a callable returning an async context manager that yields a
started provider over an empty store; ``started(provider)`` is the usual one.
"""

from orleanspy.testing._kit import ProviderFactory, started
from orleanspy.testing.clock import ManualClock
from orleanspy.testing.cluster import InProcessCluster, wait_for
from orleanspy.testing.grain_storage import GRAIN_STORAGE_CHECKS, check_grain_storage
from orleanspy.testing.redis_server import RedisServer
from orleanspy.testing.ticks import simulate_tick

__all__ = [
    "GRAIN_STORAGE_CHECKS",
    "InProcessCluster",
    "ManualClock",
    "ProviderFactory",
    "RedisServer",
    "check_grain_storage",
    "simulate_tick",
    "started",
    "wait_for",
]
