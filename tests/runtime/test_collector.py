"""A cluster silo tunes the garbage collector once started and puts it back when it
stops; an embedded silo only when asked."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from orleanspy import Silo, SiloOptions
from orleanspy.directory.memory import InMemoryGrainDirectory
from orleanspy.membership.memory import InMemoryMembershipTable
from orleanspy.messaging.memory import InMemoryNetwork, InMemoryTransport
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.runtime.collector import YOUNG_THRESHOLD
from orleanspy.streams.memory import InMemoryStreamProvider


@pytest.fixture
def collector() -> Iterator[None]:
    """Start each test from the default collector and put it back afterwards."""
    saved = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def _cluster_silo(port: int, **options: object) -> Silo:
    """A cluster silo without a store: the in-memory transport and providers."""
    return Silo(
        SiloOptions(**options),  # type: ignore[arg-type]
        transport=InMemoryTransport(InMemoryNetwork(), port=port),
        membership_table=InMemoryMembershipTable(),
        directory=InMemoryGrainDirectory(),
        reminder_table=InMemoryReminderTable(),
        streams=InMemoryStreamProvider(),
    )


@pytest.mark.usefixtures("collector")
async def test_a_cluster_silo_tunes_the_collector_and_puts_it_back_on_stop() -> None:
    assert gc.get_freeze_count() == 0
    async with _cluster_silo(1):
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector")
async def test_an_embedded_silo_tunes_the_collector_too_unless_told_not_to() -> None:
    async with Silo.local(SiloOptions(tune_gc=False)):
        assert gc.get_threshold() == (700, 10, 10)
        assert gc.get_freeze_count() == 0
    async with Silo.local():  # the default, since 0.2
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector")
async def test_the_collector_is_restored_when_the_last_tuning_silo_stops() -> None:
    first = Silo.local(SiloOptions(tune_gc=True))
    second = Silo.local(SiloOptions(tune_gc=True))
    await first.start()
    await second.start()
    await first.stop()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)  # the second still runs
    await second.stop()
    assert gc.get_threshold() == (700, 10, 10)
    await second.stop()  # stopping twice releases nothing twice
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.usefixtures("collector")
async def test_tune_gc_false_leaves_the_collector_alone() -> None:
    async with _cluster_silo(2, tune_gc=False):
        assert gc.get_threshold() == (700, 10, 10)
        assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector")
async def test_a_higher_threshold_is_never_lowered() -> None:
    gc.set_threshold(50_000, 20, 10)
    async with Silo.local(SiloOptions(tune_gc=True)):
        assert gc.get_threshold() == (50_000, 20, 10)
    assert gc.get_threshold() == (50_000, 20, 10)
