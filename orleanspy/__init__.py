"""orleanspy: virtual actors for Python with an adaptive reminder service.

Write grains by subclassing ``Grain`` (and ``Remindable`` for reminders), declare
durable state with ``persistent_state``, host them in a ``Silo`` (``Silo.local()``
for one process), call them through proxies from ``silo.client`` or a
``ClusterClient``.
"""

from __future__ import annotations

from orleanspy import outbox
from orleanspy._loop import run
from orleanspy.client import ClusterClient
from orleanspy.clock import Clock, SystemClock
from orleanspy.errors import (
    ActivationError,
    AuthenticationError,
    ClosedError,
    ConfigurationError,
    GrainCallError,
    GrainCallTimeoutError,
    GrainMethodNotFoundError,
    InconsistentStateError,
    MembershipError,
    MessageRejectedError,
    OrleansPyError,
    ReminderError,
    RemoteGrainError,
    SerializationError,
    SiloDeclaredDeadError,
    SiloUnavailableError,
    StorageError,
    StorageUnavailableError,
    TickDeadlineError,
    UnknownGrainTypeError,
)
from orleanspy.grain import (
    Grain,
    Remindable,
    always_interleave,
    one_way,
    read_only,
    reentrant,
    register_reminder,
)
from orleanspy.identity import GrainId, SiloAddress, uniform_hash
from orleanspy.options import (
    MembershipOptions,
    MessagingOptions,
    ReminderOptions,
    SiloOptions,
    TlsOptions,
)
from orleanspy.reference import CallInvoker, GrainReference
from orleanspy.reminders.audit import AuditOutcome, AuditQuery, AuditRecord
from orleanspy.reminders.calendars import Calendar, Excluded
from orleanspy.reminders.counters import ReminderCounters
from orleanspy.reminders.describe import FireTime, ReminderDescription
from orleanspy.reminders.letters import DeadLetter
from orleanspy.reminders.model import (
    MissedReminder,
    MissedReminderAction,
    OverlapPolicy,
    ReminderEntry,
    ReminderPriority,
    RetryPolicy,
    TickStatus,
)
from orleanspy.runtime.guests import Guest, SiloView, register_guest
from orleanspy.runtime.silo import Silo
from orleanspy.runtime.timers import TimerHandle
from orleanspy.serialization import register_type
from orleanspy.state import PersistentState, persistent_state
from orleanspy.versions import FeatureUnavailableError, __version__

__all__ = [
    "ActivationError",
    "AuditOutcome",
    "AuditQuery",
    "AuditRecord",
    "AuthenticationError",
    "Calendar",
    "CallInvoker",
    "Clock",
    "ClosedError",
    "ClusterClient",
    "ConfigurationError",
    "DeadLetter",
    "Excluded",
    "FeatureUnavailableError",
    "FireTime",
    "Grain",
    "GrainCallError",
    "GrainCallTimeoutError",
    "GrainId",
    "GrainMethodNotFoundError",
    "GrainReference",
    "InconsistentStateError",
    "MembershipError",
    "MembershipOptions",
    "MessageRejectedError",
    "MessagingOptions",
    "MissedReminder",
    "MissedReminderAction",
    "OrleansPyError",
    "OverlapPolicy",
    "PersistentState",
    "Remindable",
    "ReminderCounters",
    "ReminderDescription",
    "ReminderEntry",
    "ReminderError",
    "ReminderOptions",
    "ReminderPriority",
    "RemoteGrainError",
    "RetryPolicy",
    "SerializationError",
    "Silo",
    "SiloAddress",
    "SiloDeclaredDeadError",
    "SiloOptions",
    "SiloUnavailableError",
    "StorageError",
    "StorageUnavailableError",
    "SystemClock",
    "TickDeadlineError",
    "TickStatus",
    "TimerHandle",
    "TlsOptions",
    "UnknownGrainTypeError",
    "__version__",
    "always_interleave",
    "one_way",
    "outbox",
    "persistent_state",
    "read_only",
    "reentrant",
    "register_reminder",
    "register_type",
    "run",
    "uniform_hash",
]


def _dashboard_guest(silo: SiloView) -> Guest:
    # Imported when a silo first serves a dashboard (SiloOptions.dashboard_port):
    # ``import orleanspy`` imports no web framework, and the silo no dashboard.
    from orleanspy.dashboard import silo_guest

    return silo_guest(silo)


register_guest("dashboard", _dashboard_guest)
