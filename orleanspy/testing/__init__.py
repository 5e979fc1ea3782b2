"""Test support shipped for users and provider authors.

``ManualClock`` drives time by hand, ``InProcessCluster`` runs several silos in
one process, ``wait_for`` polls a condition with a deadline, ``RedisServer``
starts a private ``redis-server`` and ``PostgresDatabase`` makes a throw-away
database on a running PostgreSQL server. ``duplicate_activations`` builds the
split-brain case for grain state tests, and ``simulate_tick`` delivers a
reminder tick by hand (``receive_reminder`` refuses calls that are not ticks).

The conformance kits, one per provider kind, each with the tuple of its checks:

====================================  =========================  ======================
kit                                   checks                     factory yields
====================================  =========================  ======================
``check_grain_storage(factory)``      ``GRAIN_STORAGE_CHECKS``   a ``GrainStorage``
``check_membership_table(factory)``   ``MEMBERSHIP_TABLE_CHECKS``  a ``MembershipTable``
``check_grain_directory(factory)``    ``GRAIN_DIRECTORY_CHECKS``   a ``GrainDirectory``
``check_reminder_table(factory)``     ``REMINDER_TABLE_CHECKS``  a ``ReminderTable``
``check_stream_provider(factory)``    ``STREAM_PROVIDER_CHECKS``  a ``StreamProvider``
``check_transport(factory)``          ``TRANSPORT_CHECKS``       a ``Transport``
====================================  =========================  ======================

Each takes a ``ProviderFactory``: a callable returning an async context manager
that yields a started provider over an empty store (``started(provider)`` is the
usual one). A transport starts with the sink it delivers to, so
``check_transport``'s factory takes it: ``factory(sink)`` (``RecordingSink`` is
one).
"""

from orleanspy.testing._kit import ProviderFactory, started
from orleanspy.testing.activations import duplicate_activations
from orleanspy.testing.clock import ManualClock
from orleanspy.testing.cluster import InProcessCluster, wait_for
from orleanspy.testing.grain_directory import GRAIN_DIRECTORY_CHECKS, check_grain_directory
from orleanspy.testing.grain_storage import GRAIN_STORAGE_CHECKS, check_grain_storage
from orleanspy.testing.membership_table import MEMBERSHIP_TABLE_CHECKS, check_membership_table
from orleanspy.testing.postgres import PostgresDatabase
from orleanspy.testing.redis_server import RedisServer
from orleanspy.testing.reminder_table import REMINDER_TABLE_CHECKS, check_reminder_table
from orleanspy.testing.stream_provider import STREAM_PROVIDER_CHECKS, check_stream_provider
from orleanspy.testing.ticks import simulate_tick
from orleanspy.testing.transport import TRANSPORT_CHECKS, RecordingSink, check_transport

__all__ = [
    "GRAIN_DIRECTORY_CHECKS",
    "GRAIN_STORAGE_CHECKS",
    "MEMBERSHIP_TABLE_CHECKS",
    "REMINDER_TABLE_CHECKS",
    "STREAM_PROVIDER_CHECKS",
    "TRANSPORT_CHECKS",
    "InProcessCluster",
    "ManualClock",
    "PostgresDatabase",
    "ProviderFactory",
    "RecordingSink",
    "RedisServer",
    "check_grain_directory",
    "check_grain_storage",
    "check_membership_table",
    "check_reminder_table",
    "check_stream_provider",
    "check_transport",
    "duplicate_activations",
    "simulate_tick",
    "started",
    "wait_for",
]
