"""``orleanspy._frozen.maker``: what it builds is what the class builds."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy._frozen import maker
from orleanspy.identity import GrainId
from orleanspy.reminders._service.missed import TickPlan
from orleanspy.reminders.model import FireOutcome, FireRecord, ScheduleUpdate, TickStatus

_AT = datetime(2030, 1, 1, tzinfo=UTC)
_GID = GrainId("T", 7)


@pytest.mark.parametrize(
    ("cls", "args", "kwargs"),
    [
        (TickStatus, (_AT, timedelta(seconds=1), None, _AT, _AT), {"missed_ticks": 2}),
        (TickStatus, (_AT, None, "* * * * *", _AT, _AT, 0, 50, True, _AT, ("p", 1), 3, True), {}),
        (FireRecord, (_GID, "r", _AT, _AT, FireOutcome.OK, "silo"), {"attempt": 2, "final": True}),
        (ScheduleUpdate, (_GID, "r", "etag", _AT, None), {}),
        (ScheduleUpdate, (_GID, "r", "etag", _AT, _AT, True), {}),
        (TickPlan, (True, _AT), {}),
        (TickPlan, (False, _AT, True, 3, _AT), {}),
    ],
)
def test_made_instances_equal_constructed_ones(
    cls: type, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    made, built = maker(cls)(*args, **kwargs), cls(*args, **kwargs)
    assert type(made) is cls
    assert made == built
    assert repr(made) == repr(built)
    assert dataclasses.asdict(made) == dataclasses.asdict(built)
    if cls.__hash__ is not None:
        assert hash(made) == hash(built)
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, first, None)  # still frozen


def test_defaults_and_missing_arguments_follow_the_class() -> None:
    make = maker(TickStatus)
    assert make(_AT, None, None, _AT, _AT) == TickStatus(_AT, None, None, _AT, _AT)
    with pytest.raises(TypeError):
        make(_AT, None)  # as the class, the fields without defaults are required


def test_refuses_classes_it_cannot_build() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        x: list[int] = dataclasses.field(default_factory=list)

    for cls in (NoSlots, NotFrozen, Factory):
        with pytest.raises(TypeError):
            maker(cls)
