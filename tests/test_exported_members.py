"""The public surface is a tested fact: ``orleanspy.__all__`` lists exactly these."""

from __future__ import annotations

import orleanspy

EXPECTED = {
    "ActivationError", "AuthenticationError", "CallInvoker", "Clock", "ClosedError",
    "ClusterClient", "ConfigurationError", "Grain", "GrainCallError", "GrainCallTimeoutError",
    "GrainId", "GrainMethodNotFoundError", "GrainReference", "MembershipError",
    "MembershipOptions", "MessageRejectedError", "MessagingOptions", "MissedReminder",
    "MissedReminderAction", "OrleansPyError", "ReminderEntry", "ReminderError",
    "ReminderOptions", "ReminderPriority", "Remindable", "RemoteGrainError",
    "RetryPolicy", "SerializationError", "Silo", "SiloAddress", "SiloDeclaredDeadError",
    "SiloOptions",
    "SiloUnavailableError", "StorageError", "StorageUnavailableError", "SystemClock",
    "TickStatus", "TimerHandle", "TlsOptions", "UnknownGrainTypeError", "__version__",
    "always_interleave", "one_way", "read_only", "reentrant", "register_reminder",
    "register_type", "run", "uniform_hash",
}  # fmt: skip
# Grain persistent state.
EXPECTED |= {"InconsistentStateError", "PersistentState", "persistent_state"}
# The transactional outbox (a module: outbox.call, outbox.publish, outbox.message_id).
EXPECTED |= {"outbox"}
# The operator audit log (``client.reminders.audit(AuditQuery(...))``).
EXPECTED |= {"AuditOutcome", "AuditQuery", "AuditRecord"}
# Scheduling depth (0.2): overlap policies, tick deadlines, dead letters, counters.
EXPECTED |= {"DeadLetter", "OverlapPolicy", "ReminderCounters", "TickDeadlineError"}
# Calendars for reminders, and the error of a feature the cluster has not switched on.
EXPECTED |= {"Calendar", "Excluded", "FeatureUnavailableError"}
# describe (``client.reminders.describe``).
EXPECTED |= {"FireTime", "ReminderDescription"}


def test_all_is_exactly_the_public_surface() -> None:
    assert set(orleanspy.__all__) == EXPECTED
    assert len(orleanspy.__all__) == len(set(orleanspy.__all__))


def test_every_exported_name_exists() -> None:
    for name in orleanspy.__all__:
        assert hasattr(orleanspy, name), name
