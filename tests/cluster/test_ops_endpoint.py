"""The operations endpoint of a real silo process: /readyz before and after the
silo is Active (Redis comes up late), /healthz, and /metrics after grain calls
and reminder ticks, scraped over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orleanspy import ClusterClient, Grain, GrainId, Silo, SiloOptions
from orleanspy.options import ReminderOptions
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.testing import RedisServer, wait_for
from orleanspy.testing.cluster import FAST_MEMBERSHIP
from orleanspy.testing.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


async def get(port: int, path: str) -> tuple[int, bytes]:
    return await asyncio.to_thread(_get, port, path)


async def answer(port: int, path: str) -> tuple[int, bytes] | None:
    try:
        return await get(port, path)
    except (urllib.error.URLError, ConnectionError, OSError):
        return None  # not listening yet


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(series: dict, name: str, **labels: str) -> float:
    return series.get((name, tuple(sorted(labels.items()))), 0.0)


def _silo(redis_url: str, metrics_port: int, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'cluster'}")
    return subprocess.Popen(
        [sys.executable, "-m", "orleanspy.cli", "silo", "--redis-url", redis_url,
         "--name", "opsilo", "--import", "cli_grains", "--metrics-port", str(metrics_port),
         *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip


async def _feed_event_counted(url: str, port: int) -> bool:
    """Write a row from outside the silo, then wait for its change-feed counter."""
    table = RedisReminderTable(url, service_id="default")
    async with AsyncExitStack() as stack:
        await table.start(stack)
        entry = new_entry(
            ReminderSpec(due=3600, period=3600),
            service_id="default",
            grain_id=GrainId("CliTickGrain", "outside"),
            name="outside",
            now=datetime.now(UTC),
            options=ReminderOptions(),
        )
        await table.upsert(entry)

    async def counted() -> bool:
        _, body = await get(port, "/metrics")
        return value(samples(body.decode()), "orleanspy_reminder_feed_events_total") >= 1

    await wait_for(counted, timeout=20, what="a change-feed event counted")
    return True


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    err = proc.stderr.read() if proc.stderr else ""
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return err


async def test_readyz_waits_for_active_and_metrics_count_calls_and_ticks(
    own_redis: RedisServer,
) -> None:
    url = own_redis.url
    own_redis.stop()  # the silo starts before Redis, as in a compose start-up
    port = free_port()
    proc = _silo(url, port, "--storage-timeout", "120")
    try:
        seen: list[tuple[int, bytes]] = []

        async def answered() -> bool:
            got = await answer(port, "/readyz")
            seen.extend([got] if got else [])
            return got is not None

        await wait_for(answered, timeout=60, what="the operations endpoint answers")
        status, body = seen[0]
        assert status == 503
        doc = json.loads(body)
        assert doc["ready"] is False
        assert doc["checks"]["membership"]["ok"] is False
        assert doc["checks"]["storage"]["ok"] is False
        status, body = await get(port, "/healthz")
        assert status == 200
        assert json.loads(body)["alive"] is True

        own_redis.start()
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("READY "), line
        assert line.split()[3] == str(port)
        status, body = await get(port, "/readyz")
        assert status == 200, body
        checks = json.loads(body)["checks"]
        assert checks["membership"] == {"ok": True, "detail": "active"}
        assert checks["storage"]["ok"] and checks["ranges"]["ok"]

        async with ClusterClient(redis_url=url) as client:
            echo = client.get_grain("CliEchoGrain", "e")
            for _ in range(7):
                await echo.pid()
            ticker = client.get_grain("CliTickGrain", "t")
            await ticker.start_ticking()
            await wait_for(lambda: _at_least(ticker, 3), timeout=60)
            before = await ticker.ticks()
            status, body = await get(port, "/metrics")
            after = await ticker.ticks()
            await ticker.stop_ticking()
        assert status == 200
        series = samples(body.decode())
        ticks = value(series, "orleanspy_reminder_ticks_total", priority="normal")
        assert before <= ticks <= after, (before, ticks, after)
        assert value(series, "orleanspy_reminder_ticks_failed_total", priority="normal") == 0
        count = value(series, "orleanspy_reminder_tick_lateness_seconds_count", priority="normal")
        assert count == ticks
        inf = value(
            series, "orleanspy_reminder_tick_lateness_seconds_bucket", priority="normal", le="+Inf"
        )
        assert inf == ticks
        # A healthy silo delivers within the grace, so the sum is a few ms per tick.
        assert (
            0
            <= value(series, "orleanspy_reminder_tick_lateness_seconds_sum", priority="normal")
            < ticks * 5
        )
        assert value(series, "orleanspy_grain_calls_total", grain_type="CliEchoGrain") == 7
        assert value(series, "orleanspy_grain_call_errors_total", grain_type="CliEchoGrain") == 0
        assert value(series, "orleanspy_activations", grain_type="CliEchoGrain") == 1
        assert value(series, "orleanspy_membership_silos", status="ACTIVE") == 1
        assert value(series, "orleanspy_reminder_owned_ranges") == 1
        assert value(series, "orleanspy_reminder_bucket_size") > 0
        assert value(series, "orleanspy_reminder_persisted_total") >= 1
        assert value(series, "orleanspy_reminder_table_reads_total") >= 1
        # The silo skips its own writes on the change feed: a row written by
        # another writer (this test, through its own table) is what it counts.
        assert await _feed_event_counted(url, port)
        assert value(series, "orleanspy_messaging_messages_received_total") >= 7
    finally:
        err = _stop(proc)
    # Each start-up attempt was logged, with the silo's name on the record.
    assert "redis not reachable yet" in err
    assert " opsilo orleanspy." in err


async def _at_least(grain, n: int) -> bool:
    return await grain.ticks() >= n


async def test_silo_gives_up_on_unreachable_redis_after_the_storage_timeout() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "orleanspy.cli", "silo", "--redis-url", url,
         "--storage-timeout", "1"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert f"could not reach Redis at {url} within 1 s" in proc.stderr
    assert "--storage-timeout" in proc.stderr
    assert "Traceback" not in proc.stderr


class PeerEchoGrain(Grain):
    async def ping(self) -> int:
        return 1


async def test_two_silos_count_messages_per_peer_and_membership(redis_url: str) -> None:
    def options(name: str) -> SiloOptions:
        return SiloOptions(
            redis_url=redis_url,
            name=name,
            metrics_port=0,
            membership=FAST_MEMBERSHIP,
            grain_types=(PeerEchoGrain,),
        )

    async with Silo(options("a")) as a, Silo(options("b")) as b:
        assert a.membership is not None
        await wait_for(lambda: _both_active(a), timeout=30)
        for i in range(40):  # random placement puts some on each silo
            await a.client.get_grain(PeerEchoGrain, f"k{i}").ping()
        await wait_for(lambda: b.activation_count > 0, timeout=30)
        assert a.metrics_port is not None
        status, body = await get(a.metrics_port, "/metrics")
    assert status == 200
    series = samples(body.decode())
    to_b = value(series, "orleanspy_messaging_peer_messages_sent_total", peer=str(b.address))
    assert to_b >= b.activation_count  # at least one call per grain b activated
    assert value(series, "orleanspy_messaging_peer_frames_sent_total", peer=str(b.address)) >= 1
    assert to_b <= value(series, "orleanspy_messaging_messages_sent_total")
    # b answers each call on its own stream to a, which names b: counted per peer.
    from_b = value(series, "orleanspy_messaging_peer_messages_received_total", peer=str(b.address))
    assert from_b >= b.activation_count
    assert value(series, "orleanspy_messaging_peer_frames_received_total", peer=str(b.address)) >= 1
    assert from_b <= value(series, "orleanspy_messaging_messages_received_total")
    assert value(series, "orleanspy_membership_silos", status="ACTIVE") == 2
    assert value(series, "orleanspy_membership_probes_sent_total") >= 0


def _both_active(silo) -> bool:
    return len(silo.membership.active_silos()) == 2
