"""Parts of the machine a test needs beyond Python: skip where one is missing and
say why, unless the run requires it.

A plain ``make test`` on a laptop without Chromium or root skips the browser and
network-namespace tests with the reason. CI must not: ``.ci/run`` sets
``ORLEANSPY_TEST_REQUIRE=browser,netns``, which turns each such skip into a
failure, so a machine that lost Chromium cannot pass by skipping.
"""

from __future__ import annotations

import os

import pytest

#: The names ``ORLEANSPY_TEST_REQUIRE`` takes (comma-separated).
KNOWN = frozenset({"browser", "netns"})


def required() -> frozenset[str]:
    """The parts this run must have (``ORLEANSPY_TEST_REQUIRE``)."""
    names = {n.strip() for n in os.environ.get("ORLEANSPY_TEST_REQUIRE", "").split(",")}
    names.discard("")
    unknown = names - KNOWN
    if unknown:
        raise RuntimeError(
            f"ORLEANSPY_TEST_REQUIRE names {sorted(unknown)}; known: {sorted(KNOWN)}"
        )
    return frozenset(names)


def missing(part: str, reason: str) -> None:
    """Skip the test because ``part`` is missing (``reason`` says how to get it),
    or fail it if this run requires ``part``."""
    assert part in KNOWN, part
    if part in required():
        pytest.fail(f"{reason} (ORLEANSPY_TEST_REQUIRE names {part!r})")
    pytest.skip(reason)
