"""A silo tunes the garbage collector once started, unless told not to."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from orleanspy import Silo, SiloOptions
from orleanspy.runtime.collector import YOUNG_THRESHOLD


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


@pytest.mark.usefixtures("collector")
async def test_a_started_silo_freezes_and_raises_the_young_threshold() -> None:
    assert gc.get_freeze_count() == 0
    async with Silo.local(SiloOptions()):
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0


@pytest.mark.usefixtures("collector")
async def test_tune_gc_false_leaves_the_collector_alone() -> None:
    async with Silo.local(SiloOptions(tune_gc=False)):
        assert gc.get_threshold() == (700, 10, 10)
        assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector")
async def test_a_higher_threshold_is_never_lowered() -> None:
    gc.set_threshold(50_000, 20, 10)
    async with Silo.local(SiloOptions()):
        assert gc.get_threshold() == (50_000, 20, 10)
