"""Test support shipped for users and provider authors."""

from orleanspy.testing.grain_storage import GRAIN_STORAGE_CHECKS, check_grain_storage

__all__ = ["GRAIN_STORAGE_CHECKS", "check_grain_storage"]
