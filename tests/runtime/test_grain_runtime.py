"""A grain reaches the silo only through ``GrainRuntime`` (docs/architecture.md, section 1).

A grain instance given a hand-written runtime works without any silo: every
``Grain`` helper goes through the protocol, and nothing else. The declared
reminder's action is the enum from the moment the class is decorated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from orleanspy import (
    Grain,
    MissedReminderAction,
    Remindable,
    ReminderEntry,
    ReminderError,
    TickStatus,
    register_reminder,
)
from orleanspy import grain as grain_module
from orleanspy.grain import GrainReminders, GrainRuntime, GrainTimer, definition_of
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders.spec import ReminderSpec
from orleanspy.testing.clock import ManualClock


class _Timer:
    ticks = 0
    disposed = False

    def dispose(self) -> None:
        self.disposed = True


class _Reminders:
    def __init__(self) -> None:
        self.calls: list[tuple[str, GrainId, str]] = []

    async def register(self, grain_id: GrainId, name: str, spec: ReminderSpec) -> ReminderEntry:
        self.calls.append(("register", grain_id, name))
        raise ReminderError("not stored by this fake")

    async def unregister(self, grain_id: GrainId, name: str) -> bool:
        self.calls.append(("unregister", grain_id, name))
        return True

    async def get(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        self.calls.append(("get", grain_id, name))
        return None

    async def list(self, grain_id: GrainId) -> list[ReminderEntry]:
        self.calls.append(("list", grain_id, ""))
        return []


class _Runtime:
    def __init__(self, grain_id: GrainId) -> None:
        self.grain_id = grain_id
        self.silo_address = SiloAddress("127.0.0.1", 1, 1)
        self.clock = ManualClock()
        self.reminders: GrainReminders = _Reminders()
        self.deactivation_requested = False
        self.timers: list[timedelta | float] = []

    def get_grain(self, grain: Any, key: Any) -> Any:
        return ("proxy", grain, key)

    def register_timer(
        self,
        callback: Callable[[], Awaitable[None]],
        due: timedelta | float,
        period: timedelta | float | None,
    ) -> GrainTimer:
        self.timers.append(due)
        return _Timer()

    def request_deactivation(self) -> None:
        self.deactivation_requested = True


class Probe(Grain, Remindable, type_name="test_grain_runtime.Probe"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        pass


def _probe(runtime: GrainRuntime) -> Probe:
    grain = Probe.__new__(Probe)
    grain._activation = runtime
    grain.__init__()  # type: ignore[misc]
    return grain


async def test_every_grain_helper_goes_through_the_runtime_protocol() -> None:
    gid = GrainId("test_grain_runtime.Probe", "k")
    runtime = _Runtime(gid)
    grain = _probe(runtime)
    assert grain.grain_id == gid and grain.grain_key == "k"
    assert grain.now() == runtime.clock.now()
    assert grain.get_grain("Other", 7) == ("proxy", "Other", 7)
    handle = grain.register_timer(_noop, due=3)
    assert runtime.timers == [3] and not handle.disposed
    grain.deactivate_on_idle()
    assert runtime.deactivation_requested
    with pytest.raises(ReminderError):
        await grain.register_or_update_reminder("r", period=60)
    assert await grain.unregister_reminder("r") is True
    assert await grain.get_reminder("r") is None
    assert await grain.get_reminders() == []
    reminders = runtime.reminders
    assert isinstance(reminders, _Reminders)
    assert [c[0] for c in reminders.calls] == ["register", "unregister", "get", "list"]
    assert all(c[1] == gid for c in reminders.calls)


async def _noop() -> None:
    pass


@pytest.fixture
def _forget_classes() -> Iterator[None]:
    """Other tests' silos host every registered class: a class with declared
    reminders left behind would get rows (and activations) there."""
    yield
    for name in ("test_grain_runtime.Declared", "test_grain_runtime.Refused"):
        grain_module._registry.pop(name, None)


@pytest.mark.usefixtures("_forget_classes")
def test_a_declared_reminder_holds_the_action_enum() -> None:
    @register_reminder("plain", period=60)
    @register_reminder("catch-up", period=60, action=MissedReminderAction.FIRE_IMMEDIATELY)
    @register_reminder("by-number", period=60, action=3)
    class Declared(Grain, Remindable, type_name="test_grain_runtime.Declared"):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            pass

    actions = {r.name: r.action for r in definition_of(Declared).reminders}
    assert actions == {
        "plain": MissedReminderAction.SKIP,
        "catch-up": MissedReminderAction.FIRE_IMMEDIATELY,
        "by-number": MissedReminderAction(3),
    }
    assert all(type(a) is MissedReminderAction for a in actions.values())


@pytest.mark.usefixtures("_forget_classes")
def test_an_action_that_is_no_missed_reminder_action_is_refused_at_declaration() -> None:
    with pytest.raises(ReminderError, match=r"'r'\) on .*Refused is invalid"):

        @register_reminder("r", period=60, action=99)
        class Refused(Grain, Remindable, type_name="test_grain_runtime.Refused"):
            async def receive_reminder(self, name: str, status: TickStatus) -> None:
                pass
