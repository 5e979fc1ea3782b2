"""Test support shipped for users and provider authors.

``ManualClock`` drives time by hand, ``InProcessCluster`` runs several silos in
one process, ``RedisServer`` starts a private ``redis-server`` and ``wait_for``
polls a condition with a deadline. The provider checks live in
``testing.reminder_table``, ``testing.membership_table`` and
``testing.grain_storage`` (``check_grain_storage``).
"""

from orleanspy.testing.clock import ManualClock
from orleanspy.testing.cluster import InProcessCluster, wait_for
from orleanspy.testing.grain_storage import GRAIN_STORAGE_CHECKS, check_grain_storage
from orleanspy.testing.redis_server import RedisServer

__all__ = [
    "GRAIN_STORAGE_CHECKS",
    "InProcessCluster",
    "ManualClock",
    "RedisServer",
    "check_grain_storage",
    "wait_for",
]
