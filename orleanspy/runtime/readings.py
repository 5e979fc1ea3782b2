"""What a silo shows to the code that reports on it, and nothing more.

``SiloReadings`` is the narrow, read-only source that the Prometheus exporter
(``orleanspy._prometheus``) and the status record (``runtime.status``) read; a
silo hands one out with ``Silo.readings()``. The readers never touch the
silo's private parts, and they import no ``Silo``: this module depends on
lower layers only. Every reading is taken when it is asked for (scrape time),
so a reading held across calls stays current; ``None`` means the part is
absent (the silo was never started, runs no reminder service or no
membership).

The transport's optional counters are found with the named protocols of
``orleanspy.messaging.transport`` (``WireCounters``, ``PeerCounters``,
``QueueDepths``) and ``isinstance``, never with ``getattr``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from orleanspy.messaging.transport import Transport
from orleanspy.metrics import SiloMetrics
from orleanspy.reminders.service import ReminderServiceStats

__all__ = ["MembershipReading", "SiloReadings"]


@dataclass(frozen=True, slots=True)
class MembershipReading:
    """The membership table as this silo sees it, and its probing counters."""

    #: Silos in the table, by ``SiloStatus`` name.
    by_status: dict[str, int]
    probes_sent: int
    probes_failed: int
    suspicions: int
    declared_dead: int


class SiloReadings(Protocol):
    """A read-only view of one silo for metrics and status (see the module docstring)."""

    @property
    def metrics(self) -> SiloMetrics:
        """The silo's recorders (no-op ones unless metrics are enabled)."""
        ...

    @property
    def activation_count(self) -> int:
        """Activations held right now (0 before start)."""
        ...

    def activations_by_type(self) -> dict[str, int] | None:
        """Activations held right now, by grain type; ``None`` before start."""
        ...

    @property
    def activations_collected(self) -> int | None:
        """Activations deactivated by idle collection; ``None`` before start."""
        ...

    @property
    def reminder_stats(self) -> ReminderServiceStats | None:
        """The reminder service's counters and gauges; ``None`` without one."""
        ...

    @property
    def owned_ranges(self) -> int:
        """Ring ranges the reminder service owns (0 without one)."""
        ...

    def membership(self) -> MembershipReading | None:
        """The membership reading; ``None`` for a silo with no membership."""
        ...

    @property
    def transport(self) -> Transport | None:
        """The transport, for its optional counters; ``None`` before start."""
        ...

    @property
    def hosted_types(self) -> frozenset[str]:
        """The grain types this silo hosts (other silos' orphan checks read them)."""
        ...

    @property
    def orphaned_rows(self) -> int | None:
        """Reminder rows of types no silo hosts, at the last orphan check
        (``None`` before one)."""
        ...
