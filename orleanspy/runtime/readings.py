"""What a silo shows to the code that reports on it, and nothing more.

``SiloReadings`` is the narrow, read-only source that the Prometheus exporter
(``orleanspy._prometheus``) and the status record (``runtime.status``) read; a
silo hands one out with ``Silo.readings()``. The readers never touch the
silo's private parts, and they import no ``Silo``: ``ReadingsOf`` takes the
readings from the parts a silo shows (``SiloParts``). Every reading is taken
when it is asked for (scrape time), so a reading held across calls stays
current; ``None`` means the part is absent (the silo was never started, runs
no reminder service or no membership).

The transport's optional counters are found with the named protocols of
``orleanspy.messaging.transport`` (``WireCounters``, ``PeerCounters``,
``QueueDepths``) and ``isinstance``, never with ``getattr``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from orleanspy.membership.service import MembershipService
from orleanspy.messaging.transport import Transport
from orleanspy.metrics import SiloMetrics
from orleanspy.reminders.service import ReminderService, ReminderServiceStats
from orleanspy.runtime.catalog import Catalog

__all__ = ["MembershipReading", "ReadingsOf", "SiloParts", "SiloReadings"]


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


class SiloParts(Protocol):
    """The parts of a silo its readings are taken from (``Silo`` has them)."""

    @property
    def metrics(self) -> SiloMetrics: ...

    @property
    def catalog(self) -> Catalog | None: ...

    @property
    def reminder_service(self) -> ReminderService | None: ...

    @property
    def membership(self) -> MembershipService | None: ...

    @property
    def transport(self) -> Transport | None: ...

    @property
    def hosted_types(self) -> frozenset[str]: ...

    @property
    def orphaned_rows(self) -> int | None: ...


class ReadingsOf:
    """``SiloReadings`` over one silo's parts: every reading is taken when asked for."""

    __slots__ = ("_silo",)

    def __init__(self, silo: SiloParts) -> None:
        self._silo = silo

    @property
    def metrics(self) -> SiloMetrics:
        return self._silo.metrics

    @property
    def activation_count(self) -> int:
        catalog = self._silo.catalog
        return 0 if catalog is None else len(catalog)

    def activations_by_type(self) -> dict[str, int] | None:
        catalog = self._silo.catalog
        if catalog is None:
            return None
        counts: dict[str, int] = {}
        for act in catalog.activations():
            name = act.definition.type_name
            counts[name] = counts.get(name, 0) + 1
        return counts

    @property
    def activations_collected(self) -> int | None:
        catalog = self._silo.catalog
        return None if catalog is None else catalog.collected

    @property
    def reminder_stats(self) -> ReminderServiceStats | None:
        service = self._silo.reminder_service
        return None if service is None else service.stats

    @property
    def owned_ranges(self) -> int:
        service = self._silo.reminder_service
        return 0 if service is None else len(service.ranges)

    def membership(self) -> MembershipReading | None:
        membership = self._silo.membership
        if membership is None:
            return None
        by_status: dict[str, int] = {}
        for entry, _etag in membership.snapshot.entries.values():
            by_status[entry.status.name] = by_status.get(entry.status.name, 0) + 1
        health = membership.health
        return MembershipReading(
            by_status=by_status,
            probes_sent=health.probes_sent,
            probes_failed=health.probes_failed,
            suspicions=health.suspicions,
            declared_dead=health.declared_dead,
        )

    @property
    def transport(self) -> Transport | None:
        return self._silo.transport

    @property
    def hosted_types(self) -> frozenset[str]:
        return self._silo.hosted_types

    @property
    def orphaned_rows(self) -> int | None:
        return self._silo.orphaned_rows
