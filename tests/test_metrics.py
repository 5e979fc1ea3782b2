"""Recorders, the Prometheus exposition and the operations endpoint of an embedded silo."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orleanspy import ConfigurationError, Grain, Remindable, Silo, SiloOptions, TickStatus
from orleanspy.metrics import (
    LATENESS_BUCKETS,
    Histogram,
    RecordingReminderMetrics,
    ReminderMetrics,
    SiloMetrics,
    priority_label,
)
from orleanspy.testing import ManualClock, wait_for


class MeteredGrain(Grain, Remindable):
    async def on_activate(self) -> None:
        self.ticks = 0

    async def echo(self, x: int) -> int:
        if x < 0:
            raise ValueError("negative")
        return x

    async def remind(self) -> None:
        await self.register_or_update_reminder("r", due=timedelta(seconds=10), period=10)

    async def count(self) -> int:
        return self.ticks

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        self.ticks += 1


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def get(port: int, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(_get, port, path)


def series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_histogram_counts_into_le_buckets() -> None:
    h = Histogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 2.0, 7.0):
        h.observe(v)
    assert h.counts == [2, 2, 1]  # <=1, <=2, +Inf
    assert h.count == 5
    assert h.sum == 12.0


def test_reminder_recorder_keeps_ticks_by_priority_and_misses_by_action() -> None:
    rec = RecordingReminderMetrics()
    rec.tick(100, 0.002, False)
    rec.tick(100, 0.5, True)
    rec.tick(7, -0.1, False)  # a tick a hair early counts as on time
    rec.missed("SKIP")
    assert rec.ticks == {"critical": 2, "7": 1}
    assert rec.grain_errors == {"critical": 1}
    assert rec.lateness["critical"].count == 2
    assert rec.lateness["7"].counts[0] == 1
    assert rec.lateness["7"].bounds == LATENESS_BUCKETS
    assert rec.missed_by_action == {"SKIP": 1}
    assert priority_label(-100) == "background"


def test_the_default_recorders_record_nothing() -> None:
    metrics = SiloMetrics()
    assert not metrics.enabled
    assert type(metrics.reminders) is ReminderMetrics
    metrics.reminders.tick(0, 1.0, False)
    metrics.grains.call("G", 0.1, True)
    assert not hasattr(metrics.reminders, "__dict__")


async def test_an_embedded_silo_serves_metrics_health_and_readiness() -> None:
    clock = ManualClock()
    async with Silo.local(SiloOptions(metrics_port=0), clock=clock) as silo:
        assert silo.metrics.enabled
        port = silo.metrics_port
        assert port
        grain = silo.client.get_grain(MeteredGrain, "m")
        for i in range(5):
            assert await grain.echo(i) == i
        with pytest.raises(ValueError):
            await grain.echo(-1)
        await grain.remind()
        await silo.reminder_service.wait_persisted()
        await clock.advance(timedelta(seconds=10))
        await wait_for(lambda: _ticked(grain, 1), timeout=30)

        status, text = await get(port, "/metrics")
        assert status == 200
        s = series(text)
        assert s[("orleanspy_grain_calls_total", (("grain_type", "MeteredGrain"),))] >= 7
        assert s[("orleanspy_grain_call_errors_total", (("grain_type", "MeteredGrain"),))] == 1
        assert s[("orleanspy_activations", (("grain_type", "MeteredGrain"),))] == 1
        assert s[("orleanspy_reminder_ticks_total", (("priority", "normal"),))] == 1
        # The manual clock did not move between slot and delivery: lateness 0.
        assert s[("orleanspy_reminder_tick_lateness_seconds_sum", (("priority", "normal"),))] == 0
        assert s[("orleanspy_reminder_owned_ranges", ())] == 1

        status, text = await get(port, "/healthz")
        assert status == 200 and json.loads(text)["alive"] is True
        status, text = await get(port, "/readyz")
        assert status == 200
        assert json.loads(text)["checks"]["storage"] == {"ok": True, "detail": "in memory"}
        status, text = await get(port, "/nope")
        assert status == 404 and "/metrics" in text


async def _ticked(grain: MeteredGrain, n: int) -> bool:
    return await grain.count() >= n


async def test_hostile_requests_get_an_error_and_the_silo_keeps_serving() -> None:
    async with Silo.local(SiloOptions(metrics_port=0)) as silo:
        port = silo.metrics_port
        assert port is not None

        def raw(data: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                return sock.recv(4096)

        assert (await asyncio.to_thread(raw, b"\x00\xffgarbage\r\n\r\n")).startswith(
            b"HTTP/1.1 400"
        )
        assert (await asyncio.to_thread(raw, b"GET /" + b"a" * 20000)).startswith(b"HTTP/1.1 400")
        assert (
            await asyncio.to_thread(raw, b"POST /metrics HTTP/1.1\r\nHost: silo\r\n\r\n")
        ).startswith(b"HTTP/1.1 405")
        assert (await get(port, "/healthz"))[0] == 200


async def test_without_a_metrics_port_nothing_is_served_or_recorded() -> None:
    async with Silo.local() as silo:
        assert silo.metrics_port is None
        assert not silo.metrics.enabled


async def test_a_metrics_port_in_use_names_the_flag_and_the_port() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        silo = Silo.local(SiloOptions(metrics_port=port))
        with pytest.raises(ConfigurationError, match=rf"127\.0\.0\.1:{port} .*--metrics-port"):
            await silo.start()
