"""Test support shipped for users and provider authors."""
