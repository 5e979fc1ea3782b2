"""Test support shipped for users and provider authors.

Every provider kit (``check_grain_storage``, ``check_membership_table``,
``check_grain_directory``, ``check_reminder_table``, ...) takes a
``ProviderFactory``: a callable returning an async context manager that yields a
started provider over an empty store; ``started(provider)`` is the usual one.
"""

from orleanspy.testing._kit import ProviderFactory, started
from orleanspy.testing.grain_storage import GRAIN_STORAGE_CHECKS, check_grain_storage

__all__ = ["GRAIN_STORAGE_CHECKS", "ProviderFactory", "check_grain_storage", "started"]
