"""``orleanspy audit``: its filters, and bad ones refused before anything is read."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy import AuditOutcome, AuditRecord, GrainId
from orleanspy._cli_audit import audit_table, parse_when, query_of
from orleanspy.cli import main

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def _args(**given: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "grain": None, "name": None, "principal": None, "action": None, "since": None,
        "until": None, "limit": 100,
    }  # fmt: skip
    return argparse.Namespace(**{**base, **given})


def test_times_are_iso_8601_or_an_age() -> None:
    assert parse_when("2h", NOW) == NOW - timedelta(hours=2)
    assert parse_when("90s", NOW) == NOW - timedelta(seconds=90)
    assert parse_when("1.5d", NOW) == NOW - timedelta(days=1.5)
    assert parse_when("2026-12-01T09:00:00+01:00", NOW) == datetime(2026, 12, 1, 8, tzinfo=UTC)
    assert parse_when("2026-12-01T09:00:00", NOW) == datetime(2026, 12, 1, 9, tzinfo=UTC)
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_when("yesterday", NOW)


def test_the_flags_make_the_query() -> None:
    query = query_of(
        _args(grain="Shop/a", name="nightly", principal="dashboard:ops", action="pause",
              since="1h", limit=5),
        NOW,
    )  # fmt: skip
    assert (query.grain_id, query.name, query.principal, query.action, query.limit) == (
        GrainId("Shop", "a"), "nightly", "dashboard:ops", "pause", 5,
    )  # fmt: skip
    assert query.since == NOW - timedelta(hours=1)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--name", "nightly"], "needs its grain"),
        (["--limit", "0"], "1..10000"),
        (["--since", "last week"], "not a time"),
        (["--grain", "no-slash"], "not a grain id"),
    ],
)
def test_bad_filters_are_usage_errors_before_anything_is_read(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The store URL leads nowhere: a filter refused first never gets there.
    code = main(["--storage-url", "redis://127.0.0.1:1/0", "audit", *argv])
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_table_shows_the_newest_first_with_who_and_what() -> None:
    record = AuditRecord(
        id="r1", at=NOW, principal="tls:CN=ops", action="set_priority",
        outcome=AuditOutcome.OK, grain_id=GrainId("Shop", "a"), name="nightly",
        detail='{"priority": 100}',
    )  # fmt: skip
    lines = audit_table([record]).splitlines()
    assert lines[0].split() == ["WHEN", "PRINCIPAL", "ACTION", "GRAIN", "REMINDER", "OUTCOME",
                                "DETAIL"]  # fmt: skip
    assert lines[1].split()[1:6] == ["tls:CN=ops", "set_priority", "Shop/a", "nightly", "ok"]
