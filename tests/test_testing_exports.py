"""What ``orleanspy.testing`` offers at its top level is a tested fact, like
``orleanspy.__all__``: every kit, its checks, and the helpers."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import orleanspy.testing as testing

EXPECTED = {
    "InProcessCluster", "ManualClock", "PostgresDatabase", "ProviderFactory",
    "RecordingSink", "RedisServer", "duplicate_activations", "simulate_tick", "started",
    "wait_for",
    # one kit per provider kind, each with its checks
    "check_grain_directory", "GRAIN_DIRECTORY_CHECKS",
    "check_grain_storage", "GRAIN_STORAGE_CHECKS",
    "check_membership_table", "MEMBERSHIP_TABLE_CHECKS",
    "check_reminder_table", "REMINDER_TABLE_CHECKS",
    "check_stream_provider", "STREAM_PROVIDER_CHECKS",
    "check_transport", "TRANSPORT_CHECKS",
}  # fmt: skip


def test_all_is_exactly_the_testing_surface() -> None:
    assert set(testing.__all__) == EXPECTED
    assert len(testing.__all__) == len(set(testing.__all__))
    for name in testing.__all__:
        assert hasattr(testing, name), name


def test_every_kit_module_is_exported_with_its_checks() -> None:
    """A kit added under orleanspy/testing/ must reach __all__ too."""
    for info in pkgutil.iter_modules(testing.__path__):
        module = importlib.import_module(f"orleanspy.testing.{info.name}")
        kit = getattr(module, f"check_{info.name}", None)
        if inspect.iscoroutinefunction(kit):
            assert f"check_{info.name}" in testing.__all__, info.name
            assert f"{info.name.upper()}_CHECKS" in testing.__all__, info.name


def test_every_kit_is_documented_in_the_package_docstring() -> None:
    assert testing.__doc__ is not None
    for name in testing.__all__:
        if name.startswith("check_"):
            assert f"``{name}(factory)``" in testing.__doc__, name
