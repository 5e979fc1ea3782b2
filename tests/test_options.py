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
        (lambda: SiloOptions(collection_age="5m"), "collection_age.*number of seconds"),  # type: ignore[arg-type]
        (lambda: SiloOptions(collection_age=-5), "collection_age"),
        (lambda: ReminderOptions(poll_interval=float("nan")), "poll_interval.*finite"),
        (lambda: ReminderOptions(handover_delay=-1), "handover_delay must be >= 0"),
        (lambda: ReminderOptions(handover_delay="1s"), "handover_delay.*number of seconds"),  # type: ignore[arg-type]
        (lambda: SiloOptions(gateway_port="30000"), "gateway_port must be int or None, got str"),  # type: ignore[arg-type]
        (lambda: SiloOptions(silo_port=True), "silo_port must be int"),
        (lambda: SiloOptions(use_uvloop="yes"), "use_uvloop must be bool"),  # type: ignore[arg-type]
        (lambda: SiloOptions(messaging={}), "messaging must be MessagingOptions"),  # type: ignore[arg-type]
        (lambda: ReminderOptions(permits="8"), "permits must be int"),  # type: ignore[arg-type]
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
    assert r.grace == timedelta(seconds=10)  # DEFAULT_MISSED_TICK_GRACE, not poll_interval
    assert r.tick_timeout <= o.messaging.response_timeout / 2


def test_options_are_frozen() -> None:
    with pytest.raises(AttributeError):
        SiloOptions().cluster_id = "x"  # type: ignore[misc]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "0:0::0", "224.0.0.1", "ff02::1",
                                  "255.255.255.255", "", "a b", "h@x", "::zz"])  # fmt: skip
def test_an_advertised_host_no_peer_could_dial_is_refused(host: str) -> None:
    with pytest.raises(ConfigurationError, match="advertised_host"):
        SiloOptions(advertised_host=host)


def test_advertised_hosts_peers_can_dial_are_kept() -> None:
    for host in ("10.0.0.5", "::1", "fd00::5", "silo-a.orleans.svc.cluster.local"):
        assert SiloOptions(host="0.0.0.0", advertised_host=host).advertised_host == host
    with pytest.raises(ConfigurationError, match=r"SiloOptions\.host"):
        SiloOptions(host="10.0.0.1/24")


def test_a_minimum_tick_timeout_above_the_tick_timeout_is_refused() -> None:
    from orleanspy.options import ReminderOptions

    with pytest.raises(ConfigurationError, match="minimum_tick_timeout must not exceed"):
        ReminderOptions(minimum_tick_timeout=timedelta(seconds=11))


def test_durations_take_numbers_of_seconds_as_the_reminder_api_does() -> None:
    r = ReminderOptions(poll_interval=10, look_ahead=60.5, missed_tick_grace=2)
    assert (r.poll_interval, r.look_ahead, r.grace) == (
        timedelta(seconds=10),
        timedelta(seconds=60.5),
        timedelta(seconds=2),
    )
    assert SiloOptions(collection_age=90).collection_age == timedelta(seconds=90)
    m = MembershipOptions(probe_timeout=1, probe_interval=2)
    assert (m.probe_timeout, m.probe_interval) == (timedelta(seconds=1), timedelta(seconds=2))
    assert MessagingOptions(response_timeout=5).response_timeout == timedelta(seconds=5)
    # Zero where zero means something: read taken-over reminder rows at once.
    assert ReminderOptions(handover_delay=0).handover_delay == timedelta(0)
    assert ReminderOptions(handover_delay=0.25).handover_delay == timedelta(milliseconds=250)


def test_a_wrong_type_names_the_field_but_never_shows_a_secret() -> None:
    with pytest.raises(ConfigurationError) as info:
        MessagingOptions(cluster_secret=12345678)  # type: ignore[arg-type]
    assert "MessagingOptions.cluster_secret must be str or None, got int" in str(info.value)
    assert "12345678" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_the_typed_init_of_each_option_class_matches_its_fields() -> None:
    """Each class's ``if TYPE_CHECKING: def __init__`` (what mypy sees) names exactly
    the dataclass's fields, with durations widened to take seconds."""
    import ast
    import dataclasses
    import typing
    from pathlib import Path

    import orleanspy.options as module

    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    checked = 0
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        stubs = [
            f
            for block in node.body
            if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
            for f in block.body
            if isinstance(f, ast.FunctionDef) and f.name == "__init__"
        ]
        cls = getattr(module, node.name)
        hints = typing.get_type_hints(cls)
        durations = {n for n, h in hints.items() if timedelta in (h, *typing.get_args(h))}
        if not durations:
            assert not stubs, node.name
            continue
        (stub,) = stubs
        params = {a.arg: ast.unparse(a.annotation) for a in stub.args.kwonlyargs}
        assert set(params) == {f.name for f in dataclasses.fields(cls)}, node.name
        for name in durations:
            assert "timedelta | float" in params[name], (node.name, name)
        checked += 1
    assert checked == 5
