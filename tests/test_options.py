"""Options fail at construction with messages that say how to fix them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orleanspy import (
    ConfigurationError,
    MembershipOptions,
    MessagingOptions,
    ReminderOptions,
    SiloOptions,
)


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: SiloOptions(cluster_id=""), "cluster_id"),
        (lambda: SiloOptions(service_id="a:b"), "service_id"),
        (lambda: SiloOptions(silo_port=70000), "silo_port"),
        (lambda: SiloOptions(redis_url="http://x"), "redis_url"),
        (lambda: SiloOptions(collection_age=timedelta(0)), "collection_age"),
        (lambda: SiloOptions(collection_age=5), "timedelta"),  # type: ignore[arg-type]
        (lambda: MessagingOptions(response_timeout=timedelta(seconds=-1)), "response_timeout"),
        (lambda: MessagingOptions(cluster_secret=""), "cluster_secret"),
        (lambda: MembershipOptions(num_missed_probes_limit=0), "num_missed_probes_limit"),
        (lambda: ReminderOptions(look_ahead=timedelta(seconds=30)), "look_ahead"),
        (lambda: ReminderOptions(shards=100), "power of two"),
        (lambda: ReminderOptions(permits=0), "permits"),
    ],
)
def test_bad_options_fail_at_construction(factory, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        factory()


def test_defaults_follow_orleans() -> None:
    o = SiloOptions()
    assert o.collection_age == timedelta(minutes=15)
    assert o.messaging.response_timeout == timedelta(seconds=30)
    m = o.membership
    assert (m.num_missed_probes_limit, m.num_votes_for_death_declaration) == (3, 2)
    # Faster than Orleans' 5 s / 5 s / 60 s (docs/decisions.md, "Failure detection
    # defaults"): a killed process is found in about a second, a verdict read in 2 s.
    assert (m.probe_interval, m.probe_timeout, m.table_refresh_interval) == (
        timedelta(seconds=1),
        timedelta(seconds=2),
        timedelta(seconds=2),
    )
    assert m.death_vote_expiration == timedelta(minutes=2)
    assert m.i_am_alive_interval == timedelta(seconds=30)
    r = o.reminders
    assert r.look_ahead == timedelta(minutes=5) and r.poll_interval == timedelta(seconds=30)
    assert r.grace == r.poll_interval


def test_options_are_frozen() -> None:
    with pytest.raises(AttributeError):
        SiloOptions().cluster_id = "x"  # type: ignore[misc]
