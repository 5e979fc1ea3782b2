"""The stumbles of a first hour with the package, each mended: the client reads its
settings like the CLI, errors say what to do, sets stay sets, days pass quickly."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from orleanspy import (
    ClosedError,
    ClusterClient,
    ConfigurationError,
    Grain,
    MessagingOptions,
    Remindable,
    Silo,
    SiloOptions,
    TickStatus,
    UnknownGrainTypeError,
)
from orleanspy.serialization import Codec, pack, unpack
from orleanspy.testing import ManualClock

# -- ClusterClient settings ---------------------------------------------------------


def test_secret_is_the_cluster_secret_of_the_clients_options() -> None:
    client = ClusterClient(gateways=["127.0.0.1:1"], secret="s3cret")
    assert client._options.cluster_secret == "s3cret"
    with pytest.raises(ConfigurationError, match="differ"):
        ClusterClient(gateways=["h:1"], secret="a", options=MessagingOptions(cluster_secret="b"))


def test_from_env_reads_what_the_cli_reads_and_arguments_win() -> None:
    env = {
        "ORLEANSPY_STORAGE_URL": "postgresql://app@db/app",
        "ORLEANSPY_REDIS_URL": "redis://ignored:6379/0",
        "ORLEANSPY_CLUSTER_ID": "prod",
        "ORLEANSPY_SERVICE_ID": "shop",
        "ORLEANSPY_CLUSTER_SECRET": "s3cret",
    }
    client = ClusterClient.from_env(env)
    assert (client._redis_url, client._cluster_id, client._service_id) == (
        "postgresql://app@db/app",
        "prod",
        "shop",
    )
    assert client._options.cluster_secret == "s3cret"
    env["ORLEANSPY_MEMBERSHIP_URL"] = "redis://members:6379/0"
    client = ClusterClient.from_env(env, cluster_id="staging")
    assert (client._redis_url, client._cluster_id) == ("redis://members:6379/0", "staging")
    with pytest.raises(ValueError, match="membership_url"):
        ClusterClient.from_env({})


def test_from_env_takes_the_secret_file_tls_and_the_silos_config_file(tmp_path: Path) -> None:
    """The secret from its file, TLS from its variables, and what the environment
    leaves out from the silos' TOML file (``ORLEANSPY_CONFIG``), as the CLI does."""
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("-")
    (tmp_path / "secret").write_text("from-file\n")
    tls = {
        f"ORLEANSPY_MESSAGING_TLS_{part}_FILE": str(tmp_path / f"{file}.pem")
        for part, file in (("CERT", "c"), ("KEY", "k"), ("CA", "ca"))
    }
    env = {
        "ORLEANSPY_REDIS_URL": "redis://r:6379/0",
        "ORLEANSPY_CLUSTER_SECRET_FILE": str(tmp_path / "secret"),
        **tls,
    }
    client = ClusterClient.from_env(env)
    assert client._options.cluster_secret == "from-file"
    assert client._options.tls is not None
    assert client._options.tls.ca_file == str(tmp_path / "ca.pem")
    assert ClusterClient.messaging_from_env(env) == client._options
    config = tmp_path / "silo.toml"
    config.write_text(
        'storage_url = "redis://from-file:6379/0"\ncluster_id = "prod"\nservice_id = "shop"\n'
        '[messaging]\ncluster_secret = "in-toml"\n'
    )
    from_file = ClusterClient.from_env({"ORLEANSPY_CONFIG": str(config)})
    assert (from_file._redis_url, from_file._cluster_id, from_file._service_id) == (
        "redis://from-file:6379/0",
        "prod",
        "shop",
    )
    assert from_file._options.cluster_secret == "in-toml"
    over = ClusterClient.from_env(
        {"ORLEANSPY_CONFIG": str(config), "ORLEANSPY_CLUSTER_ID": "env-wins"}
    )
    assert over._cluster_id == "env-wins"
    with pytest.raises(ConfigurationError, match="ORLEANSPY_MESSAGING_RESPONSE_TIMEOUT"):
        ClusterClient.from_env({**env, "ORLEANSPY_MESSAGING_RESPONSE_TIMEOUT": "soon"})


# -- errors that say what to do -----------------------------------------------------


class KnownGrain(Grain, type_name="test_first_steps.Known"):
    async def ping(self) -> str:
        return "pong"


async def test_an_unknown_grain_type_lists_the_known_ones_and_hints_at_import() -> None:
    async with Silo.local(SiloOptions(grain_types=(KnownGrain,))) as silo:
        with pytest.raises(UnknownGrainTypeError) as info:
            await silo.client.get_grain("test_first_steps.Nope", "k").ping()
    text = str(info.value)
    assert "'test_first_steps.Nope'" in text
    assert "known grain types: test_first_steps.Known" in text
    assert "--import MODULE" in text
    assert "orleanspy." not in text.partition("known grain types")[2].split(";")[0]


async def test_a_client_used_outside_async_with_says_so() -> None:
    client = ClusterClient(gateways=["127.0.0.1:1"])
    with pytest.raises(ClosedError, match="async with ClusterClient"):
        client.get_grain(KnownGrain, "k")
    silo = Silo.local()
    with pytest.raises(ClosedError, match=r"async with Silo\.local"):
        silo.client.get_grain(KnownGrain, "k")


# -- sets travel as sets --------------------------------------------------------------


class SetGrain(Grain, type_name="test_first_steps.Set"):
    async def kinds(self, tags: set[str], frozen: frozenset[int]) -> list[str]:
        return [type(tags).__name__, type(frozen).__name__]

    async def echo(self, value: object) -> object:
        return value


def test_sets_round_trip_as_sets_and_unhashable_items_are_refused() -> None:
    assert unpack(pack({"a", "b"})) == {"a", "b"}
    assert type(unpack(pack(frozenset({1, 2})))) is frozenset
    assert unpack(pack({"nested": [{1, 2}]})) == {"nested": [{1, 2}]}
    codec = Codec()
    assert codec.decode(codec.encode(set())) == set()


async def test_a_set_argument_arrives_as_a_set() -> None:
    async with Silo.local(SiloOptions(grain_types=(SetGrain,))) as silo:
        grain = silo.client.get_grain(SetGrain, "k")
        assert await grain.kinds({"x"}, frozenset({1})) == ["set", "frozenset"]
        assert await grain.echo({1, 2, 3}) == {1, 2, 3}


# -- days pass quickly ----------------------------------------------------------------

TICKS: list[TickStatus] = []


class DailyGrain(Grain, Remindable, type_name="test_first_steps.Daily"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append(status)

    async def start(self) -> None:
        await self.register_or_update_reminder("nine", cron="0 9 * * *")


async def test_advance_takes_days_and_delivers_every_daily_tick() -> None:
    TICKS.clear()
    clock = ManualClock()
    async with Silo.local(SiloOptions(grain_types=(DailyGrain,)), clock=clock) as silo:
        await silo.client.get_grain(DailyGrain, "k").start()
        start = clock.now()
        await clock.advance(days=4)
        assert clock.now() - start == timedelta(days=4)
        await clock.advance(timedelta(hours=1), minutes=30)
        assert clock.now() - start == timedelta(days=4, hours=1, minutes=30)
    assert [t.current_tick_time.hour for t in TICKS] == [9, 9, 9, 9]
