"""``orleanspy silo`` settings: every option as a key of a TOML file, an
environment variable and a flag, merged flags > environment > file > defaults,
and every bad key or value refused with an error that names it."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest

from orleanspy._cli_config import SETTINGS, client_messaging, connection_values, load
from orleanspy.errors import ConfigurationError
from orleanspy.options import (
    MembershipOptions,
    MessagingOptions,
    RedisOptions,
    ReminderOptions,
    SiloOptions,
    TlsOptions,
)

URL = "redis://127.0.0.1:6379/0"


def write(tmp_path: Path, text: str, name: str = "silo.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_option_of_every_options_class_is_a_key() -> None:
    sections = [
        (
            "",
            SiloOptions,
            {"membership", "reminders", "messaging", "redis", "grain_types", "storage"},
        ),
        ("membership.", MembershipOptions, set()),
        ("reminders.", ReminderOptions, set()),
        ("messaging.", MessagingOptions, {"tls"}),
        ("messaging.tls.", TlsOptions, set()),
        ("redis.", RedisOptions, set()),
    ]
    for prefix, cls, not_scalar in sections:
        for f in dataclasses.fields(cls):
            if f.name not in not_scalar:
                assert prefix + f.name in SETTINGS, prefix + f.name
    assert SETTINGS["membership.probe_interval"].env == "ORLEANSPY_MEMBERSHIP_PROBE_INTERVAL"
    assert SETTINGS["messaging.tls.ca_file"].env == "ORLEANSPY_MESSAGING_TLS_CA_FILE"
    assert SETTINGS["redis.wait_replicas"].env == "ORLEANSPY_REDIS_WAIT_REPLICAS"
    # Variables that predate the file keep their names.
    assert SETTINGS["messaging.cluster_secret"].env == "ORLEANSPY_CLUSTER_SECRET"
    assert SETTINGS["advertised_host"].env == "ORLEANSPY_ADVERTISE_HOST"
    assert SETTINGS["storage.default"].env == "ORLEANSPY_GRAIN_STORAGE"


def test_a_file_carries_every_section(tmp_path: Path) -> None:
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text("-")
    secret = write(tmp_path, "s3cret\n", "secret")
    path = write(
        tmp_path,
        f"""
cluster_id = "prod"
service_id = "billing"
name = "silo-a"
host = "0.0.0.0"
advertised_host = "10.0.0.5"
silo_port = 11111
gateway_port = 30000
metrics_port = 9100
storage_url = "{URL}"
reminder_table_url = "postgresql://app@db/app"
collection_age = "2h"
storage_start_timeout = 5
tune_gc = false
allow_client_management = true
import = ["myapp.grains", "myapp.more"]
log_level = "debug"
log_format = "json"

[membership]
probe_interval = "500ms"
num_missed_probes_limit = 4
death_vote_expiration = "1.5m"

[reminders]
poll_interval = "2s"
look_ahead = "10s"
missed_tick_grace = 0.25
permits = 16
adaptive = false

[messaging]
response_timeout = "10s"
max_batch = 64
cluster_secret_file = "{secret}"

[messaging.tls]
cert_file = "{tmp_path / "cert.pem"}"
key_file = "{tmp_path / "key.pem"}"
ca_file = "{tmp_path / "ca.pem"}"
server_name = "orleanspy"

[storage]
default = "postgresql://app@db/app"
archive = "redis://10.0.0.9:6379/1"
""",
    )
    config = load(path, {}, {})
    o = config.options
    assert (o.cluster_id, o.service_id, o.name) == ("prod", "billing", "silo-a")
    assert (o.host, o.advertised_host) == ("0.0.0.0", "10.0.0.5")
    assert (o.silo_port, o.gateway_port, o.metrics_port) == (11111, 30000, 9100)
    assert (o.storage_url, o.reminder_table_url) == (URL, "postgresql://app@db/app")
    assert o.collection_age == timedelta(hours=2)
    assert o.storage_start_timeout == timedelta(seconds=5)
    assert (o.tune_gc, o.allow_client_management) == (False, True)
    assert o.membership == MembershipOptions(
        probe_interval=timedelta(milliseconds=500),
        num_missed_probes_limit=4,
        death_vote_expiration=timedelta(seconds=90),
    )
    assert o.reminders.poll_interval == timedelta(seconds=2)
    assert o.reminders.look_ahead == timedelta(seconds=10)
    assert o.reminders.missed_tick_grace == timedelta(seconds=0.25)
    assert (o.reminders.permits, o.reminders.adaptive) == (16, False)
    assert o.messaging.response_timeout == timedelta(seconds=10)
    assert o.messaging.max_batch == 64
    assert o.messaging.cluster_secret == "s3cret"
    assert o.messaging.tls == TlsOptions(
        cert_file=str(tmp_path / "cert.pem"),
        key_file=str(tmp_path / "key.pem"),
        ca_file=str(tmp_path / "ca.pem"),
        server_name="orleanspy",
    )
    assert o.storage == {"default": "postgresql://app@db/app", "archive": "redis://10.0.0.9:6379/1"}
    assert config.imports == ("myapp.grains", "myapp.more")
    assert (config.log_level, config.log_format) == ("DEBUG", "json")


def test_flags_win_over_the_environment_over_the_file_over_the_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, f'redis_url = "{URL}"\nhost = "10.0.0.1"\nsilo_port = 1\n'
                 "[membership]\nprobe_interval = 1\nprobe_timeout = 1\n")  # fmt: skip
    env = {
        "ORLEANSPY_HOST": "10.0.0.2",
        "ORLEANSPY_SILO_PORT": "2",
        "ORLEANSPY_MEMBERSHIP_PROBE_INTERVAL": "2s",
        "ORLEANSPY_REMINDERS_PERMITS": "3",
    }
    flags = {"host": ("10.0.0.3", "--host")}
    config = load(path, env, flags, ["membership.probe_interval=3s"])
    o = config.options
    assert o.host == "10.0.0.3"  # flag over env over file
    assert o.silo_port == 2  # env over file
    assert o.membership.probe_interval == timedelta(seconds=3)  # --set over env over file
    assert o.membership.probe_timeout == timedelta(seconds=1)  # file over default
    assert o.reminders.permits == 3  # env over default
    assert o.membership.num_missed_probes_limit == 3  # the options' default
    assert o.gateway_port == 0  # the command's default: a silo run from it has a gateway
    assert (config.log_level, config.log_format) == ("INFO", "text")
    # "none" clears an optional value set by a weaker source.
    cleared = load(path, {"ORLEANSPY_GATEWAY_PORT": "none"}, {})
    assert cleared.options.gateway_port is None


def test_an_unknown_key_in_the_file_is_named_with_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "[membership]\nprobe_intervall = 1\n")
    with pytest.raises(ConfigurationError, match=r"unknown key 'membership.probe_intervall'; "
                       r"did you mean 'membership.probe_interval'\?") as info:  # fmt: skip
        load(path, {}, {})
    assert str(path) in str(info.value)
    for text, key in (("[clustr]\nid = 1\n", "clustr"), ("colour = 1\n", "colour"),
                      ("[messaging.tls]\ncert = 'x'\n", "messaging.tls.cert")):  # fmt: skip
        with pytest.raises(ConfigurationError, match=f"unknown key '{key}'"):
            load(write(tmp_path, text), {}, {})


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ({"file": "silo_port = 'eleven'"}, r"silo_port \(.*silo.toml\): give a whole number"),
        ({"file": "tune_gc = 'maybe'"}, r"tune_gc \(.*silo.toml\): give true or false"),
        ({"file": "[membership]\nprobe_interval = 'fast'"},
         r"membership.probe_interval \(.*silo.toml\): not a duration: 'fast'"),
        ({"env": ("ORLEANSPY_REMINDERS_POLL_INTERVAL", "1 week")},
         r"reminders.poll_interval \(env ORLEANSPY_REMINDERS_POLL_INTERVAL\): not a duration"),
        ({"env": ("ORLEANSPY_MESSAGING_MAX_BATCH", "lots")},
         r"messaging.max_batch \(env ORLEANSPY_MESSAGING_MAX_BATCH\): give a whole number"),
        ({"set": "reminders.adaptive=sometimes"}, r"reminders.adaptive \(--set\): give true"),
        ({"set": "membership.probe_timeout"}, r"write KEY=VALUE"),
        ({"set": "membership.probe_timout=1"}, r"--set: unknown key 'membership.probe_timout'"),
        # Values the options themselves refuse: the key and its source are named.
        ({"file": "[membership]\nprobe_interval = 0"},
         r"membership.probe_interval \(.*silo.toml\): MembershipOptions.probe_interval must"),
        ({"env": ("ORLEANSPY_REMINDERS_SHARDS", "100")},
         r"reminders.shards \(env ORLEANSPY_REMINDERS_SHARDS\): .*power of two"),
        ({"file": "advertised_host = '0.0.0.0'"},
         r"advertised_host \(.*silo.toml\): .*not an address peers can dial"),
        ({"env": ("ORLEANSPY_ADVERTISE_HOST", "::")}, r"advertised_host \(env ORLEANSPY_ADVERT"),
        ({"file": "[storage]\ndefault = 'mysql://x'"},
         r"storage.default \(.*silo.toml\): 'mysql' is not a shared store; give a redis://"),
        ({"set": "storage.cache=memory://"}, r"storage.cache \(--set\): 'memory' is not a shared"),
        ({"file": "log_level = 'LOUD'"}, r"log_level \(.*silo.toml\): unknown log level 'LOUD'"),
        ({"env": ("ORLEANSPY_LOG_FORMAT", "xml")}, r"log_format \(env ORLEANSPY_LOG_FORMAT\)"),
        ({"file": "[messaging.tls]\ncert_file = 'a'"}, r"messaging.tls: key_file, ca_file missing"),
        ({"file": "[messaging.tls]\ncert_file='/no/a'\nkey_file='/no/b'\nca_file='/no/c'"},
         r"messaging.tls.cert_file \(.*silo.toml\): TlsOptions.cert_file: no such file"),
        ({"file": "[messaging]\ncluster_secret_file = '/no/such/secret'"},
         r"messaging.cluster_secret_file \(.*silo.toml\): cannot read '/no/such/secret'"),
        ({"file": "[messaging]\ncluster_secret = 'a'\ncluster_secret_file = '/x'"},
         r"cluster_secret and cluster_secret_file are both set"),
        ({"file": "host = "}, r"silo.toml is not valid TOML"),
        ({"file": "silo_port = 1.5"}, r"silo_port \(.*silo.toml\): give a whole number, got 1.5"),
        ({"file": "host = 7"}, r"host \(.*silo.toml\): give a string, got 7"),
    ],
)  # fmt: skip
def test_bad_values_name_their_key_and_source(
    tmp_path: Path, source: dict[str, object], match: str
) -> None:
    text = source.get("file")
    path = write(tmp_path, f'redis_url = "{URL}"\n{text}\n') if isinstance(text, str) else None
    env = dict([source["env"]]) if "env" in source else {}  # type: ignore[list-item]
    sets = [source["set"]] if "set" in source else []
    with pytest.raises(ConfigurationError, match=match):
        load(path, env, {"redis_url": (URL, "--redis-url")}, sets)  # type: ignore[arg-type]


def test_a_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot read config file .*nope.toml"):
        load(tmp_path / "nope.toml", {}, {})


def test_the_secret_comes_from_the_strongest_source(tmp_path: Path) -> None:
    secret = write(tmp_path, "from-file\n", "secret")
    path = write(tmp_path, f'redis_url = "{URL}"\n[messaging]\ncluster_secret = "in-toml"\n')
    env_file = {"ORLEANSPY_CLUSTER_SECRET_FILE": str(secret)}
    assert load(path, env_file, {}).options.messaging.cluster_secret == "from-file"
    flag = {"messaging.cluster_secret": ("on-flag", "--secret")}
    assert load(path, env_file, flag).options.messaging.cluster_secret == "on-flag"
    assert load(path, {}, {}).options.messaging.cluster_secret == "in-toml"
    write(tmp_path, "\n", "secret")
    with pytest.raises(ConfigurationError, match="is empty"):
        load(path, env_file, {})


def test_a_command_takes_the_connection_and_messaging_from_the_silos_file(
    tmp_path: Path,
) -> None:
    """What ``cluster status``, ``reminders``, ``migrate`` and ``dashboard`` read from
    ``--config``: the connection keys (the silo-only ones stay with the silos) and
    every ``messaging.*`` key, a secret flag over its variable over the file."""
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("-")
    secret = write(tmp_path, "from-file\n", "secret")
    path = write(
        tmp_path,
        f'storage_url = "{URL}"\ncluster_id = "prod"\nhost = "0.0.0.0"\n'
        f'[membership]\nprobe_interval = "2s"\n'
        f'[messaging]\ncluster_secret_file = "{secret}"\nresponse_timeout = "7s"\n'
        f'[messaging.tls]\ncert_file = "{tmp_path}/c.pem"\nkey_file = "{tmp_path}/k.pem"\n'
        f'ca_file = "{tmp_path}/ca.pem"\n',
    )
    values = connection_values(path)
    assert {k: v for k, (v, _) in values.items()} == {"storage_url": URL, "cluster_id": "prod"}
    assert values["cluster_id"][1] == str(path)
    messaging = client_messaging(path, {})
    assert messaging.cluster_secret == "from-file"
    assert messaging.response_timeout == timedelta(seconds=7)
    assert messaging.tls is not None and messaging.tls.ca_file == str(tmp_path / "ca.pem")
    env = {"ORLEANSPY_CLUSTER_SECRET": "from-env"}
    assert client_messaging(path, env).cluster_secret == "from-env"
    assert client_messaging(path, env, "on-flag").cluster_secret == "on-flag"
    # Without a file: the environment alone, as before.
    assert client_messaging(None, env).cluster_secret == "from-env"
    assert client_messaging(None, {}).cluster_secret is None
    # A variable of a silo-only key is not looked at; a bad messaging one is named.
    assert client_messaging(None, {"ORLEANSPY_MEMBERSHIP_PROBE_INTERVAL": "fast"}).tls is None
    with pytest.raises(ConfigurationError, match="ORLEANSPY_MESSAGING_RESPONSE_TIMEOUT"):
        client_messaging(None, {"ORLEANSPY_MESSAGING_RESPONSE_TIMEOUT": "soon"})
    assert connection_values(None) == {}
    with pytest.raises(ConfigurationError, match=r"did you mean 'membership\.probe_interval'"):
        connection_values(write(tmp_path, "[membership]\nprobe_intervall = 1\n", "typo.toml"))


def test_the_documented_config_file_loads_as_written(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    text = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    for name in ("silo.pem", "silo.key", "ca.pem"):
        (tmp_path / name).write_text("-")
    (tmp_path / "secret").write_text("from-the-secret-file\n")
    text = text.replace("/etc/orleanspy/", f"{tmp_path}/").replace(
        "/run/secrets/orleanspy", str(tmp_path / "secret")
    )
    config = load(write(tmp_path, text), {}, {})
    assert config.options.cluster_id == "prod"
    assert config.options.membership.probe_interval == timedelta(seconds=2)
    assert config.options.messaging.cluster_secret == "from-the-secret-file"
    assert config.options.messaging.tls is not None
    assert config.imports == ("myapp.grains",)
