"""The ``orleanspy`` command, run for real in subprocesses: against a running
cluster (through a gateway), against Redis with no silo (straight to the
table), and on every error path a user meets first."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orleanspy import (
    ClusterClient,
    RetryPolicy,
    Silo,
    SiloOptions,
    SiloUnavailableError,
    __version__,
)
from orleanspy.cli import main
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.options import MembershipOptions, MessagingOptions, ReminderOptions
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.testing.redis_server import free_port
from tests.certs import issue

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _env(**extra: str) -> dict[str, str]:
    # Only the project on the path, and `python -P` keeps the cwd off it as a
    # console script does: --import must find cli_grains from the cwd itself.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORLEANSPY_")}
    return dict(env, PYTHONPATH=str(ROOT), **extra)


def _cli(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "orleanspy.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE, env=_env(**env),
    )  # fmt: skip


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "orleanspy.cli", *args],
        capture_output=True, text=True, timeout=120, cwd=HERE, env=_env(**env), check=False,
    )  # fmt: skip


async def acli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_cli, *args, **env)


def ok_json(proc: subprocess.CompletedProcess[str]) -> object:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


@pytest.mark.slow
async def test_silo_command_serves_imported_grains_and_stops_on_sigterm(redis_url: str) -> None:
    proc = _cli("--redis-url", redis_url, "--log-level", "WARNING", "silo", "--import",
                "cli_grains")  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("READY "), (line, proc.stderr.read() if proc.stderr else "")
        async with ClusterClient(redis_url=redis_url) as client:
            grain = client.get_grain("CliEchoGrain", "k")
            assert await grain.pid() == proc.pid
            await grain.remind_me()
            assert await client.reminders.count_all() == 1
        count = await acli("--redis-url", redis_url, "reminders", "count")
        assert count.returncode == 0, count.stderr
        assert count.stdout.strip() == "1"
        assert "via gateway" in count.stderr
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        _stop(proc)


@pytest.mark.slow
async def test_every_command_through_a_gateway_of_a_running_cluster(redis_url: str) -> None:
    # Clients may change reminders only when the cluster authenticates them.
    secret = ("--secret", "cli-test-secret")
    proc = _cli(
        "silo", "--import", "cli_grains", "--name", "cli-silo", "--redis-url", redis_url, *secret
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("READY "), (line, proc.stderr.read() if proc.stderr else "")
        address, gateway = line.split()[1:3]
        options = MessagingOptions(cluster_secret=secret[1])
        async with ClusterClient(redis_url=redis_url, options=options) as client:
            await client.get_grain("CliEchoGrain", "k").remind_me()

        url = ("--redis-url", redis_url, *secret)
        status_json, status_table, listed, got, upcoming, counted = await asyncio.gather(
            acli("cluster", "status", "--json", *url),  # global flags after the subcommand
            acli(*url, "cluster", "status"),
            acli("reminders", "list", "--json", *url),
            acli("reminders", "get", "CliEchoGrain/k", "hourly", "--json", *url),
            acli("reminders", *url, "upcoming", "--minutes", "61", "--json"),
            acli("reminders", "count", "--json", *url),
        )
        doc = ok_json(status_json)
        assert doc["cluster_id"] == "dev" and doc["service_id"] == "default"
        [silo] = doc["silos"]
        assert silo["name"] == "cli-silo" and silo["status"] == "active"
        assert silo["address"] == address
        assert silo["gateway"] == f"127.0.0.1:{gateway}"
        assert silo["ring_share_percent"] == 100.0
        assert isinstance(silo["activations"], int) and isinstance(silo["reminders_held"], int)
        assert status_table.returncode == 0, status_table.stderr
        header, row = status_table.stdout.splitlines()[1:3]
        assert header.split() == [
            "NAME", "STATUS", "ADDRESS", "GATEWAY", "VERSION", "PROTOCOLS", "UPTIME", "RING",
            "ACTIVATIONS", "REMINDERS", "CPU", "HEARTBEAT",
        ]  # fmt: skip
        assert row.split()[:6] == [
            "cli-silo", "active", address, f"127.0.0.1:{gateway}", __version__, "1-2",
        ]  # fmt: skip
        assert "feature level 2, balanced ring" in status_table.stdout
        assert "100.0%" in row

        for proc_ in (listed, got, upcoming, counted):
            assert f"via gateway 127.0.0.1:{gateway}" in proc_.stderr
        [r] = ok_json(listed)
        assert (r["grain"], r["name"], r["cron"]) == ("CliEchoGrain/k", "hourly", "0 0 * * * *")
        assert ok_json(got)["grain_id"] == "CliEchoGrain/s:k"
        assert [u["name"] for u in ok_json(upcoming)] == ["hourly"]
        assert ok_json(counted) == {"count": 1}

        await _change_and_delete(url, "gateway")
    finally:
        _stop(proc)


async def _change_and_delete(url: tuple[str, ...], via: str) -> None:
    row = ("CliEchoGrain/k", "hourly")
    prio = await acli(*url, "reminders", "set-priority", *row, "critical", "--json")
    assert ok_json(prio)["priority"] == 100
    assert f"via {via}" in prio.stderr
    action = await acli(*url, "reminders", "set-action", *row, "notify", "--json")
    assert ok_json(action)["action"] == "NOTIFY"
    graced = await acli(*url, "reminders", "set-grace", *row, "2.5", "--json")
    assert ok_json(graced)["grace_seconds"] == 2.5
    reset = await acli(*url, "reminders", "set-grace", *row, "default", "--json")
    assert ok_json(reset)["grace_seconds"] is None
    bad = await acli(*url, "reminders", "set-grace", *row, "-1")
    assert bad.returncode == 2 and "outside 0 .. 366 days" in bad.stderr
    paused = await acli(*url, "reminders", "pause", *row, "--json")
    assert ok_json(paused)["paused"] is True
    listed = await acli(*url, "reminders", "list", "--grain", row[0])
    assert listed.returncode == 0 and listed.stdout.split()[-1] == "paused"
    resumed = await acli(*url, "reminders", "resume", *row, "--json")
    assert ok_json(resumed)["paused"] is False
    triggered = await acli(*url, "reminders", "trigger", *row)
    if via == "gateway":
        assert triggered.returncode == 0, triggered.stderr
        assert triggered.stdout.startswith("triggered CliEchoGrain/k hourly at ")
        fired = ok_json(await acli(*url, "reminders", "get", *row, "--json"))["history"]
        assert fired[0]["triggered"] is True and fired[0]["outcome"] == "ok"
        human = await acli(*url, "reminders", "get", *row)
        assert "LAST FIRED SLOT" in human.stdout and "ok (triggered)" in human.stdout
    else:
        assert triggered.returncode == 1
        assert "no gateway of the cluster answered" in triggered.stderr
    repaired = await acli(*url, "reminders", "repair", *row, "--json")
    due = datetime.fromisoformat(ok_json(repaired)["next_due"])
    assert datetime.now(UTC) < due <= datetime.now(UTC) + timedelta(hours=1)
    shown = await acli(*url, "reminders", "get", *row)  # the human form
    assert shown.returncode == 0, shown.stderr
    assert "priority        100" in shown.stdout and "NOTIFY" in shown.stdout
    deleted = await acli(*url, "reminders", "delete", *row)
    assert deleted.returncode == 0 and "deleted" in deleted.stdout
    gone = await acli(*url, "reminders", "get", *row)
    assert gone.returncode == 1
    assert "CliEchoGrain/k has no reminder 'hourly'" in gone.stderr
    again = await acli(*url, "reminders", "delete", *row)
    assert again.returncode == 1
    empty = await acli(*url, "reminders", "list")
    assert empty.returncode == 0 and empty.stdout.split() == [
        "NEXT", "DUE", "GRAIN", "NAME", "SCHEDULE", "PRIORITY", "ACTION", "STATE"
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("store", ["redis_url", "redis_cluster_url"])
async def test_every_command_straight_on_the_redis_table_with_no_silo(
    store: str, request: pytest.FixtureRequest
) -> None:
    redis_url: str = request.getfixturevalue(store)
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="default")
        await table.start(stack)
        entry = new_entry(
            ReminderSpec(cron="0 0 * * * *"),
            service_id="default",
            grain_id=GrainId("CliEchoGrain", "k"),
            name="hourly",
            now=datetime.now(UTC),
            options=ReminderOptions(),
        )
        await table.upsert(entry)
    url = ("--redis-url", redis_url)
    listed, got, upcoming, counted, status = await asyncio.gather(
        acli(*url, "reminders", "list", "--grain", "CliEchoGrain/k", "--json"),
        acli(*url, "reminders", "get", "CliEchoGrain/k", "hourly", "--json"),
        acli(*url, "reminders", "upcoming", "--minutes", "61", "--json"),
        acli(*url, "reminders", "count"),
        acli(*url, "cluster", "status", "--json"),
    )
    for proc in (listed, got, upcoming, counted):
        assert f"via the Redis table at {redis_url} (no silo is up)" in proc.stderr
    assert [r["name"] for r in ok_json(listed)] == ["hourly"]
    assert ok_json(got)["cron"] == "0 0 * * * *"
    assert [r["grain"] for r in ok_json(upcoming)] == ["CliEchoGrain/k"]
    assert counted.stdout.strip() == "1"
    assert ok_json(status)["silos"] == []
    assert "no Active silo" in status.stderr and "holds no silo for them" in status.stderr
    await _change_and_delete(url, "the Redis table")


@pytest.mark.slow
@pytest.mark.parametrize("store", ["redis_url", "redis_cluster_url"])
async def test_no_gateway_error_names_the_ids_and_what_redis_holds(
    store: str, request: pytest.FixtureRequest
) -> None:
    redis_url: str = request.getfixturevalue(store)
    options = SiloOptions(redis_url=redis_url, gateway_port=None, cluster_id="blue")
    async with Silo(options):
        with pytest.raises(SiloUnavailableError) as wrong:
            async with ClusterClient(redis_url=redis_url, cluster_id="green"):
                pass
        message = str(wrong.value)
        assert "cluster id 'green', service id 'default'" in message
        assert "holds no silo for them" in message
        assert "cluster 'blue' service 'default' (1 silos)" in message
        with pytest.raises(SiloUnavailableError, match="none with a gateway port"):
            async with ClusterClient(redis_url=redis_url, cluster_id="blue"):
                pass


@pytest.mark.slow
async def test_ports_in_use_name_the_flag_and_the_port(redis_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        silo_port, gateway_port, metrics_port = await asyncio.gather(
            acli("silo", "--redis-url", redis_url, "--silo-port", str(port)),
            acli("silo", "--redis-url", redis_url, "--gateway-port", str(port)),
            acli("silo", "--redis-url", redis_url, "--metrics-port", str(port)),
        )
    for proc, flag in ((silo_port, "--silo-port"), (gateway_port, "--gateway-port"),
                       (metrics_port, "--metrics-port")):  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        assert f"127.0.0.1:{port}" in proc.stderr and flag in proc.stderr
        assert "Traceback" not in proc.stderr


async def test_usage_errors_exit_2_with_a_message() -> None:
    no_scheme, bad_level, bad_grain, bad_priority, unknown = await asyncio.gather(
        acli("reminders", "count", "--redis-url", "localhost:6379"),
        acli("--log-level", "LOUD", "reminders", "count", "--redis-url", "redis://x"),
        acli("reminders", "get", "no-slash", "r", "--redis-url", "redis://x"),
        acli("reminders", "set-priority", "G/k", "r", "500", "--redis-url", "redis://x"),
        acli("reminders", "frobnicate"),
    )
    assert no_scheme.returncode == 2
    assert "no Redis scheme; use redis://HOST:PORT/DB, rediss://" in no_scheme.stderr
    assert bad_level.returncode == 2
    assert "unknown log level 'LOUD' (--log-level)" in bad_level.stderr
    assert bad_grain.returncode == 2 and "write TYPE/KEY" in bad_grain.stderr
    assert bad_priority.returncode == 2 and "outside -128..127" in bad_priority.stderr
    assert unknown.returncode == 2 and "invalid choice: 'frobnicate'" in unknown.stderr
    for proc in (no_scheme, bad_level, bad_grain, bad_priority, unknown):
        assert "Traceback" not in proc.stderr


async def test_version_and_help_show_defaults_and_environment_variables() -> None:
    version, top, silo, env_flag = await asyncio.gather(
        acli("--version"),
        acli("--help"),
        acli("silo", "--help"),
        acli("reminders", "count", ORLEANSPY_LOG_LEVEL="LOUD", ORLEANSPY_REDIS_URL="redis://x"),
    )
    assert version.returncode == 0
    assert version.stdout.strip() == f"orleanspy {__version__} (wire protocols 1-2)"
    assert top.returncode == 0
    for text in ("env ORLEANSPY_REDIS_URL", "default: dev; env ORLEANSPY_CLUSTER_ID",
                 "cluster", "reminders", "demo"):  # fmt: skip
        assert text in " ".join(top.stdout.split()), text
    flat = " ".join(silo.stdout.split())
    for text in ("default: 30.0; env ORLEANSPY_STORAGE_TIMEOUT",
                 "default: none; env ORLEANSPY_METRICS_PORT",
                 "default: 127.0.0.1; env ORLEANSPY_HOST", "env ORLEANSPY_REDIS_URL",
                 "default: none; env ORLEANSPY_IMPORT"):  # fmt: skip
        assert text in flat, text
    # The environment stands in for a flag, and is checked like one.
    assert env_flag.returncode == 2 and "unknown log level 'LOUD'" in env_flag.stderr


@pytest.mark.slow
async def test_silo_logs_json_with_its_name_and_fails_clearly_without_redis() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    proc = await acli("--log-format", "json", "silo", "--name", "js", "--redis-url", dead,
                      "--storage-timeout", "0.5")  # fmt: skip
    assert proc.returncode == 1
    records = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    attempts = [r for r in records if r["msg"].startswith("redis not reachable yet")]
    assert attempts and all(r["silo"] == "js" and r["level"] == "WARNING" for r in attempts)
    assert f"could not reach Redis at {dead} within 0.5 s" in proc.stderr


@pytest.mark.slow
async def test_import_of_a_missing_module_is_a_usage_error() -> None:
    proc = await acli("silo", "--redis-url", "redis://127.0.0.1:1/0", "--import", "no_such_mod")
    assert proc.returncode == 2
    assert "cannot import 'no_such_mod' (--import)" in proc.stderr


@pytest.mark.slow
async def test_demo_command_runs_the_embedded_demo() -> None:
    proc = await acli("demo", "--seconds", "0.5")
    assert proc.returncode == 0, proc.stderr
    assert "silo stopped cleanly" in proc.stdout
    assert "lamps left" in proc.stdout


def test_missing_redis_url_is_a_clear_error(capsys, monkeypatch) -> None:
    monkeypatch.delenv("ORLEANSPY_REDIS_URL", raising=False)
    assert main(["silo"]) == 2
    assert "--redis-url" in capsys.readouterr().err


async def test_silo_command_keeps_grain_state_in_the_storage_url(
    redis_url: str, postgres_url: str
) -> None:
    import asyncpg

    proc = _cli(
        *("--redis-url", redis_url, "--log-level", "WARNING", "silo"),
        *("--import", "cli_grains", "--storage", postgres_url),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), (line, proc.stderr.read() if proc.stderr else "")
        async with ClusterClient(redis_url=redis_url) as client:
            await client.get_grain("CliStateGrain", "k").save("kept in postgres")
        conn = await asyncpg.connect(postgres_url)
        try:
            rows = await conn.fetch("SELECT grain_id, state_name FROM orleanspy_grain_state")
        finally:
            await conn.close()
        assert [tuple(r) for r in rows] == [("CliStateGrain/s:k", "note")]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_storage_flag_needs_a_redis_or_postgres_url(capsys) -> None:
    assert main(["--redis-url", "redis://127.0.0.1:1/0", "silo", "--storage", "mysql://x"]) == 1
    err = capsys.readouterr().err
    assert "storage.default (--storage): 'mysql' is not a shared store; give a redis://" in err


async def test_silo_help_lists_every_setting_with_its_variable() -> None:
    proc = await acli("silo", "--help")
    assert proc.returncode == 0
    flat = " ".join(proc.stdout.split())
    probe = MembershipOptions().probe_interval.total_seconds()
    for text in ("--config FILE", "env ORLEANSPY_CONFIG", "--set KEY=VALUE", "--advertise-host",
                 "env ORLEANSPY_ADVERTISE_HOST", "membership.probe_interval "
                 f"ORLEANSPY_MEMBERSHIP_PROBE_INTERVAL duration; default {probe:g}s",
                 "reminders.missed_tick_grace ORLEANSPY_REMINDERS_MISSED_TICK_GRACE",
                 "messaging.tls.cert_file ORLEANSPY_MESSAGING_TLS_CERT_FILE",
                 "messaging.cluster_secret_file ORLEANSPY_CLUSTER_SECRET_FILE",
                 "storage.default ORLEANSPY_GRAIN_STORAGE"):  # fmt: skip
        assert text in flat, text


@pytest.mark.slow
async def test_silo_from_a_config_file_listens_everywhere_and_advertises_its_host(
    redis_url: str, tmp_path: Path
) -> None:
    """Bound to 0.0.0.0, the silo advertises the host the file names (127.0.0.2,
    another loopback address): that is what membership holds, what clients dial,
    and it answers there. The name comes from the environment, one membership
    interval from --set, the rest from the file."""
    config = tmp_path / "silo.toml"
    config.write_text(
        f'redis_url = "{redis_url}"\nhost = "0.0.0.0"\nadvertised_host = "127.0.0.2"\n'
        'import = ["cli_grains"]\nlog_level = "WARNING"\nname = "from-file"\n'
        '[membership]\nprobe_interval = "1s"\nprobe_timeout = "1s"\n'
    )
    proc = _cli("silo", "--config", str(config), "--set", "membership.probe_timeout=0.5s",
                ORLEANSPY_SILO_NAME="from-env")  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("READY 127.0.0.2:"), (
            line,
            proc.stderr.read() if proc.stderr else "",
        )
        doc = ok_json(await acli("cluster", "status", "--json", "--redis-url", redis_url))
        [silo] = doc["silos"]  # type: ignore[index]
        assert silo["name"] == "from-env"
        assert silo["address"].startswith("127.0.0.2:")
        assert silo["gateway"].startswith("127.0.0.2:")
        async with ClusterClient(redis_url=redis_url) as client:
            assert await client.get_grain("CliEchoGrain", "k").pid() == proc.pid
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        _stop(proc)


async def test_reminder_commands_show_one_shots_jitter_bounds_payload_and_retry(
    redis_url: str,
) -> None:
    now = datetime.now(UTC)
    service = f"sched-{os.getpid()}"
    grain = GrainId("CliEchoGrain", "shaped")
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id=service)
        await table.start(stack)
        shaped = new_entry(
            ReminderSpec(
                period=timedelta(hours=1),
                jitter=timedelta(minutes=5),
                ends_at=now + timedelta(days=2),
                max_ticks=10,
                payload={"order": 42, "when": now},
                retry=RetryPolicy(3, timedelta(seconds=2)),
            ),
            service_id=service,
            grain_id=grain,
            name="bounded",
            now=now,
            options=ReminderOptions(),
        )
        once = new_entry(
            ReminderSpec(at=now + timedelta(hours=3)),
            service_id=service,
            grain_id=grain,
            name="once",
            now=now,
            options=ReminderOptions(),
        )
        await table.upsert(shaped)
        await table.upsert(once)
    url = ("--redis-url", redis_url, "--service-id", service)
    got, human, listed = await asyncio.gather(
        acli(*url, "reminders", "get", grain.canonical, "bounded", "--json"),
        acli(*url, "reminders", "get", grain.canonical, "once"),
        acli(*url, "reminders", "list", "--grain", grain.canonical),
    )
    doc = ok_json(got)
    assert isinstance(doc, dict)
    assert doc["jitter_seconds"] == 300.0 and doc["max_ticks"] == 10
    assert shaped.ends_at is not None and doc["ends_at"] == shaped.ends_at.isoformat()
    assert doc["final_due"] == (shaped.start_at + timedelta(hours=9)).isoformat()
    assert doc["payload"] == {"order": 42, "when": now.isoformat()}
    assert doc["retry"] == {"max_attempts": 3, "backoff_seconds": 2.0}
    assert doc["one_shot"] is False
    assert human.returncode == 0, human.stderr
    assert "one_shot" in human.stdout and "True" in human.stdout
    assert listed.returncode == 0, listed.stderr
    assert "once at" in listed.stdout
    assert "jitter 0:05:00" in listed.stdout and "10 ticks" in listed.stdout
    assert "retry 3x/0:00:02" in listed.stdout


@pytest.mark.slow
async def test_orphan_commands_export_and_import_straight_on_redis(
    redis_url: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="default")
        await table.start(stack)
        now = datetime.now(UTC)
        for key in ("", "tenant-1-a", "tenant-1-b", "tenant-2-a"):
            await table.upsert(
                new_entry(
                    ReminderSpec(period=3600),
                    service_id="default",
                    grain_id=GrainId("GoneGrain", key),
                    name="r",
                    now=now,
                    options=ReminderOptions(),
                )
            )
    url = ("--redis-url", redis_url)
    dump = tmp_path / "rows.jsonl"
    listed, counted, empty_key, exported = await asyncio.gather(
        acli(*url, "reminders", "list", "--type", "GoneGrain", "--json"),
        acli(*url, "reminders", "count", "--type", "GoneGrain", "--prefix", "tenant-1-"),
        # ``list`` prints the empty-key grain as ``GoneGrain/``; ``get`` takes it.
        acli(*url, "reminders", "get", "GoneGrain/", "r", "--json"),
        acli(*url, "reminders", "export", "--type", "GoneGrain", "--output", str(dump)),
    )
    assert sorted(r["grain"] for r in ok_json(listed)) == [
        "GoneGrain/", "GoneGrain/tenant-1-a", "GoneGrain/tenant-1-b", "GoneGrain/tenant-2-a",
    ]  # fmt: skip
    assert all(r["declared"] is False for r in ok_json(listed))
    assert counted.stdout.strip() == "2"
    assert ok_json(empty_key)["grain_id"] == "GoneGrain/s:"
    assert exported.returncode == 0 and len(dump.read_text().splitlines()) == 4
    dry = await acli(*url, "reminders", "delete-many", "--type", "GoneGrain", "--prefix",
                     "tenant-1-", "--dry-run")  # fmt: skip
    assert dry.stdout.strip() == "would delete 2 rows"
    gone = await acli(*url, "reminders", "delete-many", "--type", "GoneGrain")
    assert gone.stdout.strip() == "deleted 4 rows"
    assert (await acli(*url, "reminders", "count")).stdout.strip() == "0"
    would = await acli(*url, "reminders", "import", str(dump), "--dry-run", "--json")
    assert ok_json(would)["created"] == 4
    assert (await acli(*url, "reminders", "count")).stdout.strip() == "0", "a dry run wrote"
    done = await acli(*url, "reminders", "import", str(dump), "--json")
    assert ok_json(done)["created"] == 4
    again = await acli(*url, "reminders", "import", str(dump), "--json")
    assert (ok_json(again)["created"], ok_json(again)["exist"]) == (0, 4)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{broken\n")
    refused = await acli(*url, "reminders", "import", str(bad))
    assert refused.returncode == 1 and f"{bad}: line 1" in refused.stderr


def test_list_help_states_the_real_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reminders", "list", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "priority first (higher first), then next due time" in text
    assert "due order," not in text.replace("in the due order:", "")


async def _dead_row_written(redis_url: str, address: str) -> None:
    """Write the silo at ``address`` Dead, as its peers' votes would."""
    from orleanspy.membership.model import SiloStatus
    from orleanspy.membership.redis import RedisMembershipTable

    async with AsyncExitStack() as stack:
        table = RedisMembershipTable(redis_url, cluster_id="dev", service_id="default")
        await table.start(stack)
        snap = await table.read_all()
        silo = SiloAddress.parse(address)
        row, etag = snap.get(silo), snap.etag(silo)
        assert row is not None and etag is not None
        assert await table.update_row(row.with_status(SiloStatus.DEAD), etag, snap.version.next())


@pytest.mark.slow
async def test_a_silo_declared_dead_exits_3_within_5s_with_default_options(
    redis_url: str,
) -> None:
    """Death is final and prompt: default options, no peer to gossip the
    verdict; the silo's own table read finds it, it stops and the command
    returns status 3 (a restart policy restarts it)."""
    proc = _cli("--redis-url", redis_url, "--log-level", "WARNING", "silo", "--import",
                "cli_grains")  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("READY "), line
        await _dead_row_written(redis_url, line.split()[1])
        written = time.monotonic()
        status = await asyncio.to_thread(proc.wait, 30)
        took = time.monotonic() - written
        err = proc.stderr.read()
        print(f"\ndeclared dead: the silo exited {took:.2f}s after the Dead write, status {status}")
        assert status == 3, err
        assert took < 5
        assert "declared Dead" in err
    finally:
        _stop(proc)


async def test_bad_settings_exit_1_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('redis_url = "redis://127.0.0.1:1/0"\n[reminders]\npoll_interval = "soon"\n')
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[membership]\nprobe_intervall = 1\n")
    wildcard, bad_value, unknown_key, bad_env, env_file = await asyncio.gather(
        acli("silo", "--redis-url", "redis://127.0.0.1:1/0", "--advertise-host", "0.0.0.0"),
        acli("silo", "--config", str(bad)),
        acli("silo", "--config", str(unknown)),
        acli("silo", "--redis-url", "redis://127.0.0.1:1/0",
             ORLEANSPY_MEMBERSHIP_NUM_MISSED_PROBES_LIMIT="three"),
        acli("silo", ORLEANSPY_CONFIG=str(unknown)),  # the file named by the environment
    )  # fmt: skip
    assert wildcard.returncode == 1
    assert "advertised_host (--advertise-host)" in wildcard.stderr
    assert "'0.0.0.0' is not an address peers can dial" in wildcard.stderr
    assert bad_value.returncode == 1
    assert "reminders.poll_interval" in bad_value.stderr and "'soon'" in bad_value.stderr
    assert unknown_key.returncode == 1
    assert "did you mean 'membership.probe_interval'" in unknown_key.stderr
    assert bad_env.returncode == 1
    assert "env ORLEANSPY_MEMBERSHIP_NUM_MISSED_PROBES_LIMIT" in bad_env.stderr
    assert env_file.returncode == 1 and f"{unknown}: unknown key" in env_file.stderr
    for proc in (wildcard, bad_value, unknown_key, bad_env, env_file):
        assert "Traceback" not in proc.stderr


@pytest.mark.slow
async def test_a_silo_whose_redis_restarted_empty_says_so_and_exits_3(own_redis: Any) -> None:
    """Redis without persistence restarted (here: FLUSHALL): the silo's row is
    gone. It logs a WARNING that says so, stops and returns status 3; a
    restart joins it again as a new incarnation."""
    import redis.asyncio as aioredis

    url = own_redis.url
    proc = _cli("--redis-url", url, "--log-level", "WARNING", "silo", "--import",
                "cli_grains")  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("READY "), line
        client = aioredis.Redis.from_url(url)
        await client.flushall()
        await client.aclose()
        flushed = time.monotonic()
        status = await asyncio.to_thread(proc.wait, 30)
        took = time.monotonic() - flushed
        err = proc.stderr.read()
        print(f"\nredis flushed: the silo exited {took:.2f}s later, status {status}")
        assert status == 3, err
        assert "store lost its data" in err
        assert "version went back from 2 to 0" in err or "row is gone" in err
        # Restarted, it joins again (a new incarnation) and serves.
        again = _cli("--redis-url", url, "--log-level", "WARNING", "silo", "--import",
                     "cli_grains")  # fmt: skip
        try:
            assert again.stdout is not None
            ready = await asyncio.to_thread(again.stdout.readline)
            assert ready.startswith("READY ") and ready.split()[1] != line.split()[1]
        finally:
            _stop(again)
    finally:
        _stop(proc)


@pytest.mark.slow
async def test_a_silo_with_the_wrong_secret_refuses_to_start_and_exits_1(redis_url: str) -> None:
    """A mis-deployed silo: the cluster runs with a secret, this one has none. It
    says why and exits before it writes a row, votes or takes ranges."""
    from orleanspy.membership.redis import RedisMembershipTable

    good = _cli("--redis-url", redis_url, "--secret", "s3cret", "--log-level", "WARNING",
                "silo", "--import", "cli_grains")  # fmt: skip
    try:
        assert good.stdout is not None
        line = await asyncio.to_thread(good.stdout.readline)
        assert line.startswith("READY "), line
        rogue = await acli("--redis-url", redis_url, "--log-level", "WARNING", "silo",
                           "--import", "cli_grains")  # fmt: skip
        assert rogue.returncode == 1, rogue.stderr
        assert "refusing to join: this silo has no cluster secret" in rogue.stderr
        async with AsyncExitStack() as stack:
            table = RedisMembershipTable(redis_url, cluster_id="dev", service_id="default")
            await table.start(stack)
            snap = await table.read_all()
        assert [str(s) for s in snap.entries] == [line.split()[1]]
        assert snap.version.version == 2  # its Joining and Active writes, nothing more
    finally:
        _stop(good)


@pytest.mark.slow
async def test_a_silo_on_another_ring_refuses_to_start_and_exits_1(redis_url: str) -> None:
    """Two silo processes run the hashed ring (one by ``--set``, one by its
    variable); a third that insists on the balanced ring says why and exits 1
    before it writes anything: the table, the processes and the ring shares that
    ``cluster status`` reports are as they were. A fourth with the default
    follows the cluster: it joins, on the hashed ring, and records it."""
    from orleanspy.membership.redis import RedisMembershipTable
    from orleanspy.ring import HASH_SPACE, ConsistentRing, ranges_size

    hashed = [
        _cli("--redis-url", redis_url, "--log-level", "WARNING", "silo", "--import",
             "cli_grains", "--set", "membership.balanced_ring=false"),
        _cli("--redis-url", redis_url, "--log-level", "WARNING", "silo", "--import",
             "cli_grains", ORLEANSPY_MEMBERSHIP_BALANCED_RING="false"),
    ]  # fmt: skip
    try:
        addresses = []
        for proc in hashed:
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            assert line.startswith("READY "), line
            addresses.append(line.split()[1])
        async with AsyncExitStack() as stack:
            table = RedisMembershipTable(redis_url, cluster_id="dev", service_id="default")
            await table.start(stack)
            before = await table.read_all()
            assert sorted(str(s) for s in before.active_silos()) == sorted(addresses)
            assert {e.ring_mode for e, _ in before.entries.values()} == {"hashed"}

            rogue = await acli("--redis-url", redis_url, "--log-level", "WARNING", "silo",
                               "--import", "cli_grains", "--set",
                               "membership.balanced_ring=true")  # fmt: skip
            assert rogue.returncode == 1, rogue.stderr
            assert "refusing to join: this silo builds the balanced ring" in rogue.stderr
            assert "balanced_ring=False" in rogue.stderr
            assert "--set membership.balanced_ring=false" in rogue.stderr
            assert "Traceback" not in rogue.stderr

            after = await table.read_all()
        assert after.version == before.version and after.version.version == 4  # 2 joins
        assert set(after.entries) == set(before.entries)
        for silo, (entry, _etag) in after.entries.items():
            assert entry.status.name == "ACTIVE" and not entry.suspect_times, silo
        assert all(proc.poll() is None for proc in hashed)
        # The status reader builds the ring the silos record: the hashed one.
        doc = ok_json(await acli("--redis-url", redis_url, "cluster", "status", "--json"))
        ring = ConsistentRing.build(after.active_silos(), balanced=False)
        want = {
            str(s): round(100 * ranges_size(ring.ranges_of(s)) / HASH_SPACE, 2) for s in ring.silos
        }
        assert isinstance(doc, dict)
        assert {s["address"]: s["ring_share_percent"] for s in doc["silos"]} == want

        follower = _cli("--redis-url", redis_url, "--log-level", "WARNING", "silo", "--import",
                        "cli_grains")  # fmt: skip
        hashed.append(follower)
        assert follower.stdout is not None
        line = await asyncio.to_thread(follower.stdout.readline)
        assert line.startswith("READY "), line
        async with AsyncExitStack() as stack:
            table = RedisMembershipTable(redis_url, cluster_id="dev", service_id="default")
            await table.start(stack)
            joined = await table.read_all()
        entry = joined.get(SiloAddress.parse(line.split()[1]))
        assert entry is not None and entry.status.name == "ACTIVE"
        assert (entry.ring_mode, entry.ring_follows) == ("hashed", True)
        doc = ok_json(await acli("--redis-url", redis_url, "cluster", "status", "--json"))
        ring = ConsistentRing.build(joined.active_silos(), balanced=False)
        want = {
            str(s): round(100 * ranges_size(ring.ranges_of(s)) / HASH_SPACE, 2) for s in ring.silos
        }
        assert {s["address"]: s["ring_share_percent"] for s in doc["silos"]} == want
    finally:
        for proc in hashed:
            _stop(proc)


async def test_data_errors_exit_1_with_the_message_alone_and_write_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    """The command line was sound but what it named was not: status 1, the file and
    line named, no usage text (that is for usage errors, status 2), nothing written."""
    url = ("--redis-url", redis_url, "--service-id", "data-errors")
    good = json.dumps({"v": 1, "row": {}})  # the right format tag, a row lacking fields
    malformed = tmp_path / "malformed.jsonl"
    malformed.write_text("\n{not json\n")
    half = tmp_path / "half.jsonl"
    half.write_text(good + "\n")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00 not text\n")
    missing = tmp_path / "missing.jsonl"
    outside = tmp_path / "no-such-dir" / "out.jsonl"
    results = await asyncio.gather(
        acli(*url, "reminders", "import", str(malformed)),
        acli(*url, "reminders", "import", str(half)),
        acli(*url, "reminders", "import", str(binary)),
        acli(*url, "reminders", "import", str(missing)),
        acli(*url, "reminders", "export", "--output", str(outside)),
    )
    wanted = (
        f"orleanspy: {malformed}: line 2 is not a reminder export line",
        f"orleanspy: {half}: line 1 is not a reminder export line",
        f"orleanspy: {binary}: not UTF-8 text",
        f"orleanspy: cannot open {str(missing)!r}: No such file or directory",
        f"orleanspy: cannot open {str(outside)!r}: No such file or directory",
    )
    for proc, text in zip(results, wanted, strict=True):
        assert proc.returncode == 1, (text, proc.stderr)
        assert text in proc.stderr, proc.stderr
        assert "usage:" not in proc.stderr and "Traceback" not in proc.stderr
    assert (await acli(*url, "reminders", "count")).stdout.strip() == "0", "a bad file wrote"
    # A usage error still shows the usage line, and exits 2.
    usage = await acli(*url, "reminders", "import")
    assert usage.returncode == 2 and usage.stderr.startswith("usage: ")


@pytest.mark.slow
async def test_every_command_that_talks_to_a_cluster_takes_it_from_the_config_file(
    redis_url: str, tmp_path: Path
) -> None:
    """One file for the silo and the operator: ``--config`` (or ``ORLEANSPY_CONFIG``)
    gives ``cluster status``, ``reminders``, ``migrate`` and ``dashboard`` the store,
    the ids, the cluster secret (from its file) and TLS. Without the file's secret
    and TLS, the same command is refused at the gateway."""
    cert, key, ca = issue(tmp_path, dns_name="localhost")
    secret = tmp_path / "secret"
    secret.write_text("config-file-secret\n")
    config = tmp_path / "cluster.toml"
    config.write_text(
        f'storage_url = "{redis_url}"\ncluster_id = "cfg"\nservice_id = "cfg-svc"\n'
        'import = ["cli_grains"]\nlog_level = "WARNING"\nname = "cfg-silo"\n'
        f'[messaging]\ncluster_secret_file = "{secret}"\n'
        f'[messaging.tls]\ncert_file = "{cert}"\nkey_file = "{key}"\nca_file = "{ca}"\n'
    )
    proc = _cli("silo", "--config", str(config))
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("READY "), (line, proc.stderr.read() if proc.stderr else "")
        gateway = line.split()[2]
        row = tmp_path / "row.jsonl"
        async with AsyncExitStack() as stack:
            table = RedisReminderTable(redis_url, service_id="other")
            await table.start(stack)
            await table.upsert(
                new_entry(ReminderSpec(cron="0 0 * * * *"), service_id="cfg-svc",
                          grain_id=GrainId("CliEchoGrain", "k"), name="hourly",
                          now=datetime.now(UTC), options=ReminderOptions())
            )  # fmt: skip
            exported = await acli("--redis-url", redis_url, "--service-id", "other",
                                  "reminders", "export", "--output", str(row))  # fmt: skip
            assert exported.returncode == 0, exported.stderr
        cfg = ("--config", str(config))
        # The import first: the reads after it must see its row.
        imported = await acli(*cfg, "reminders", "import", str(row), "--json")
        status, counted, from_env, migrated = await asyncio.gather(
            acli("cluster", "status", "--json", *cfg),
            acli("reminders", "count", *cfg),
            acli("reminders", "list", "--json", ORLEANSPY_CONFIG=str(config)),
            acli("migrate", *cfg),
        )
        doc = ok_json(status)
        assert (doc["cluster_id"], doc["service_id"]) == ("cfg", "cfg-svc")
        assert [s["name"] for s in doc["silos"]] == ["cfg-silo"]
        assert ok_json(imported)["created"] == 1
        for through in (imported, counted, from_env):
            assert f"via gateway 127.0.0.1:{gateway}" in through.stderr, through.stderr
        assert counted.stdout.strip() == "1"
        assert [r["name"] for r in ok_json(from_env)] == ["hourly"]
        assert migrated.returncode == 0 and redis_url.split("//")[1] in migrated.stdout

        # The flags name the same cluster but lack the file's secret and TLS: the
        # gateway does not take the connection, so the command reads the table.
        bare = ("--redis-url", redis_url, "--cluster-id", "cfg", "--service-id", "cfg-svc")
        refused = await acli(*bare, "reminders", "count")
        assert "via gateway" not in refused.stderr and "via the Redis table" in refused.stderr

        port = free_port()
        dash = _cli("dashboard", *cfg, "--port", str(port))
        try:
            assert dash.stdout is not None
            ready = await asyncio.to_thread(dash.stdout.readline)
            assert ready.startswith("READY http://127.0.0.1:"), ready
            page = await asyncio.to_thread(_get_json, f"http://127.0.0.1:{port}/api/cluster")
            assert "cfg-silo" in json.dumps(page)
        finally:
            _stop(dash)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        _stop(proc)


def _get_json(url: str) -> object:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())


def test_a_bad_value_in_the_config_file_names_the_file_for_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('storage_url = "redis://127.0.0.1:1/0"\nlog_level = "LOUD"\n')
    assert main(["cluster", "status", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert f"log_level ({config}): unknown log level 'LOUD'" in err and "usage:" not in err
    typo = tmp_path / "typo.toml"
    typo.write_text("[membership]\nprobe_intervall = 1\n")
    assert main(["reminders", "count", "--config", str(typo)]) == 1
    assert "did you mean 'membership.probe_interval'" in capsys.readouterr().err
