"""``tests.needs``: a missing part skips a test, unless the run requires it."""

from __future__ import annotations

import pytest

from tests import needs


def test_a_missing_part_skips_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORLEANSPY_TEST_REQUIRE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no chromium"):
        needs.missing("browser", "no chromium at /x")


def test_a_required_part_fails_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORLEANSPY_TEST_REQUIRE", "browser, netns")
    with pytest.raises(pytest.fail.Exception, match="ORLEANSPY_TEST_REQUIRE names 'netns'"):
        needs.missing("netns", "network namespaces need root")


def test_an_unknown_requirement_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORLEANSPY_TEST_REQUIRE", "browsr")
    with pytest.raises(RuntimeError, match="browsr"):
        needs.required()
