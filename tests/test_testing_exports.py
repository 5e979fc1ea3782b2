"""What ``orleanspy.testing`` offers at its top level, as its docstring says."""

from __future__ import annotations


def test_the_test_helpers_import_from_orleanspy_testing() -> None:
    from orleanspy.testing import InProcessCluster, ManualClock, RedisServer, wait_for
    from orleanspy.testing.clock import ManualClock as Clock
    from orleanspy.testing.cluster import InProcessCluster as Cluster
    from orleanspy.testing.redis_server import RedisServer as Server

    assert (ManualClock, InProcessCluster, RedisServer) == (Clock, Cluster, Server)
    assert callable(wait_for)
