"""Test support shipped for users and provider authors.

``ManualClock`` drives time by hand, ``InProcessCluster`` runs several silos in
one process, ``RedisServer`` starts a private ``redis-server`` and ``wait_for``
polls a condition with a deadline. The provider checks live in
``testing.reminder_table`` and ``testing.membership_table``.
"""

from orleanspy.testing.clock import ManualClock
from orleanspy.testing.cluster import InProcessCluster, wait_for
from orleanspy.testing.redis_server import RedisServer

__all__ = ["InProcessCluster", "ManualClock", "RedisServer", "wait_for"]
