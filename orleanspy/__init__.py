"""orleanspy: virtual actors for Python with an adaptive reminder service.

Write grains by subclassing ``Grain`` (and ``Remindable`` for reminders), declare
durable state with ``persistent_state``, host them in a ``Silo`` (``Silo.local()``
for one process), call them through proxies from ``silo.client`` or a
``ClusterClient``.
"""

from __future__ import annotations

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
from orleanspy.reminders.model import (
    MissedReminder,
    MissedReminderAction,
    ReminderEntry,
    ReminderPriority,
    RetryPolicy,
    TickStatus,
)
from orleanspy.runtime.silo import Silo
from orleanspy.runtime.timers import TimerHandle
from orleanspy.serialization import register_type
from orleanspy.state import PersistentState, persistent_state

__version__ = "0.1.0"

__all__ = [
    "ActivationError",
    "AuthenticationError",
    "CallInvoker",
    "Clock",
    "ClosedError",
    "ClusterClient",
    "ConfigurationError",
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
    "PersistentState",
    "Remindable",
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
    "TickStatus",
    "TimerHandle",
    "TlsOptions",
    "UnknownGrainTypeError",
    "__version__",
    "always_interleave",
    "one_way",
    "persistent_state",
    "read_only",
    "reentrant",
    "register_reminder",
    "register_type",
    "run",
    "uniform_hash",
]
