"""What a silo serves over HTTP besides its own routes: its guests, by name.

A guest (the dashboard) registers a factory here under a name; a silo asked
to serve one (``SiloOptions.dashboard_port`` serves the guest ``"dashboard"``)
calls the factory with itself seen as a ``SiloView``, the narrow view a guest
reads a silo through, and serves the ASGI app it returns on the guest's port.
The silo never imports a guest, so the dependency runs one way: guest to
runtime. The ``orleanspy`` package registers the dashboard (its factory
imports ``orleanspy.dashboard`` when first called, so ``import orleanspy``
imports no web framework).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from orleanspy.errors import ConfigurationError
from orleanspy.identity import SiloAddress
from orleanspy.membership.table import MembershipTable
from orleanspy.options import SiloOptions
from orleanspy.remindable.management import ReminderManagementGrain
from orleanspy.reminders.table import ReminderTable
from orleanspy.runtime.readings import SiloReadings

__all__ = ["Guest", "GuestFactory", "SiloView", "guest", "register_guest"]


class ManagementClient(Protocol):
    @property
    def reminders(self) -> ReminderManagementGrain: ...


class SiloView(Protocol):
    """What a guest may read of the silo that serves it (``Silo`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def address(self) -> SiloAddress: ...

    @property
    def options(self) -> SiloOptions: ...

    @property
    def membership(self) -> object | None:
        """The membership service of a cluster silo, once joined (else ``None``)."""
        ...

    @property
    def membership_table(self) -> MembershipTable | None:
        """The membership table of a cluster silo, once started."""
        ...

    @property
    def status_store(self) -> Any:
        """Where the silos' status records are (a cluster silo), once started."""
        ...

    @property
    def reminder_table(self) -> ReminderTable | None: ...

    @property
    def activation_count(self) -> int: ...

    @property
    def client(self) -> ManagementClient:
        """Calls into the cluster from the silo's process (its reminder management)."""
        ...

    def readings(self) -> SiloReadings: ...


@dataclass(frozen=True, slots=True)
class Guest:
    """An ASGI ``app`` to serve, and what closes what it opened."""

    app: Any
    aclose: Callable[[], Awaitable[None]]


GuestFactory = Callable[[SiloView], Guest]

_GUESTS: dict[str, GuestFactory] = {}


def register_guest(name: str, factory: GuestFactory) -> None:
    """Serve ``factory``'s app as the guest ``name`` (registering again replaces it)."""
    _GUESTS[name] = factory


def guest(name: str) -> GuestFactory:
    """The factory registered as ``name``; ``ConfigurationError`` when none is."""
    factory = _GUESTS.get(name)
    if factory is None:
        raise ConfigurationError(f"no {name} is registered with the silo's HTTP guests")
    return factory
