"""The orleanspy exception tree.

::

    OrleansPyError
    ├── ConfigurationError (ValueError)        bad options, bad grain class definitions
    ├── SerializationError (TypeError)         a value that cannot travel as msgpack
    ├── GrainCallError                         a grain call did not produce a result
    │   ├── GrainCallTimeoutError (TimeoutError)   no response within the response timeout
    │   ├── RemoteGrainError                   the grain raised a type we do not rebuild
    │   ├── UnknownGrainTypeError              no grain class registered under that name
    │   ├── GrainMethodNotFoundError (AttributeError)  not a public ``async def`` of the class
    │   ├── ActivationError                    ``on_activate`` raised; nothing was activated
    │   ├── SiloUnavailableError               the target silo cannot be reached
    │   │   └── SiloRestartedError             addressed to an earlier incarnation of a silo
    │   ├── MessageRejectedError               the receiver refused the message (malformed,
    │   │                                      oversized, too many forwards, shutting down)
    │   └── AuthenticationError                a connection without the right cluster secret
    ├── StorageError                           a store misbehaved (bad data, script error)
    │   ├── StorageUnavailableError            the store cannot be reached right now
    │   └── InconsistentStateError             a grain state write lost to a newer etag
    ├── MembershipError                        the membership protocol could not proceed
    │   └── SiloDeclaredDeadError              this silo read itself Dead in the table
    ├── ReminderError (ValueError)             an invalid reminder registration
    ├── TickDeadlineError (TimeoutError)       a reminder tick ran past its deadline and
    │                                          was cancelled where it ran
    └── ClosedError (RuntimeError)             a silo or client used after it was stopped

Expected outcomes are values, not exceptions: a lost compare-and-swap returns
``False`` or ``None``. ``asyncio.CancelledError`` is never wrapped.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "ActivationError",
    "AuthenticationError",
    "ClosedError",
    "ConfigurationError",
    "GrainCallError",
    "GrainCallTimeoutError",
    "GrainMethodNotFoundError",
    "InconsistentStateError",
    "MembershipError",
    "MessageRejectedError",
    "OrleansPyError",
    "ReminderError",
    "RemoteGrainError",
    "SerializationError",
    "SiloDeclaredDeadError",
    "SiloRestartedError",
    "SiloUnavailableError",
    "StorageError",
    "StorageUnavailableError",
    "TickDeadlineError",
    "UnknownGrainTypeError",
]


class OrleansPyError(Exception):
    """Base class of every exception orleanspy raises on its own account."""


class ConfigurationError(OrleansPyError, ValueError):
    """An option or a grain class definition is invalid; the message says how to fix it."""


class SerializationError(OrleansPyError, TypeError):
    """A value cannot be encoded for the wire, or bytes cannot be decoded."""


class GrainCallError(OrleansPyError):
    """A grain call failed for a reason other than the grain's own exception."""


class GrainCallTimeoutError(GrainCallError, TimeoutError):
    """No response arrived within the call's response timeout."""


class RemoteGrainError(GrainCallError):
    """The grain raised an exception whose type is not rebuilt on the caller's side.

    ``remote_type`` is the fully qualified type name, ``remote_message`` its
    ``str()`` and ``remote_traceback`` the formatted traceback, as text.
    """

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{remote_type}: {remote_message}")
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback


class UnknownGrainTypeError(GrainCallError):
    """No grain class is registered under the requested type name.

    ``known(message, types)`` makes one whose message lists the type names known
    where the call failed and says how to make a type known (kept in
    ``known_types``; a copy rebuilt from the wire has the message only).
    """

    known_types: tuple[str, ...] = ()

    @classmethod
    def known(cls, message: str, types: Iterable[str]) -> UnknownGrainTypeError:
        # Internal types (the reminder management grain) are not the user's.
        shown = sorted(t for t in types if not t.startswith("orleanspy."))
        listed = ", ".join(shown[:20]) + (f" and {len(shown) - 20} more" if len(shown) > 20 else "")
        hint = (
            "import the module that defines the grain class before the silo starts "
            "(orleanspy silo --import MODULE)"
        )
        known = f"known grain types: {listed}" if shown else "no grain types are known"
        error = cls(f"{message}; {known}; {hint}")
        error.known_types = tuple(shown)
        return error


class GrainMethodNotFoundError(GrainCallError, AttributeError):
    """The method is not a public ``async def`` of the grain class.

    Also an ``AttributeError``, so ``hasattr(proxy, name)`` works on proxies."""


class ActivationError(GrainCallError):
    """The grain's ``on_activate`` raised; the activation was discarded."""


class SiloUnavailableError(GrainCallError):
    """The silo that should receive a message cannot be reached."""


class SiloRestartedError(SiloUnavailableError):
    """The message named an earlier incarnation (generation) of a silo that has since
    restarted on the same host and port. It was not run; the sender re-resolves the
    grain and routes the call again."""


class MessageRejectedError(GrainCallError):
    """The receiving silo refused the message; the reason is in the message text."""


class AuthenticationError(GrainCallError):
    """A connection was refused because it did not present the cluster secret."""


class StorageError(OrleansPyError):
    """A storage provider returned something it should not have."""


class StorageUnavailableError(StorageError):
    """A storage provider cannot be reached right now; the operation may be retried."""


class InconsistentStateError(StorageError):
    """A grain state write or clear carried an etag the store no longer holds.

    Another activation (or a writer outside the grain) changed the stored state
    since this activation read it. The activation is deactivated when this
    escapes a grain call, so the next call reloads the state (as in Orleans).
    """


class MembershipError(OrleansPyError):
    """The membership protocol could not make progress."""


class SiloDeclaredDeadError(MembershipError):
    """This silo found itself declared Dead in the membership table and stopped."""


class ReminderError(OrleansPyError, ValueError):
    """A reminder registration is invalid (schedule, name, zone, priority)."""


class TickDeadlineError(OrleansPyError, TimeoutError):
    """A reminder tick's ``receive_reminder`` ran longer than its deadline (the
    reminder's ``deadline=``, ``ReminderOptions.tick_deadline``, or the next
    slot under ``OverlapPolicy.CANCEL_OTHER``) and was cancelled where it ran.

    The reminder service takes it for a failure of the grain, not of the call
    path: it is counted, and the row's ``RetryPolicy`` (if any) decides whether
    the slot is delivered again; a slot with no attempt left becomes a dead
    letter. It is not a ``GrainCallTimeoutError`` (those are retried as the
    same tick)."""


class ClosedError(OrleansPyError, RuntimeError):
    """The silo or client was used before it was started or after it was stopped
    (it cannot be reopened). The message says which, and suggests ``async with``."""
