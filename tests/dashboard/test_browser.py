"""The dashboard in a real browser, served by a two-silo cluster of processes over
a private Redis, and over PostgreSQL: the cluster page lists both silos and
shows one Dead after kill -9; a reminder found by search shows its history;
pause from the page stops its ticks, resume restarts them; trigger now delivers
one tick; the audit page lists those actions with the dashboard's principal; the
lateness chart draws."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orleanspy import ClusterClient
from orleanspy.testing import wait_for
from orleanspy.versions import PROTOCOL, ProtocolWindow, __version__
from tests.dashboard.browser import browser_page, shot

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

pytestmark = pytest.mark.slow


def _spawn(url: str, name: str, expect: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{HERE}")
    return subprocess.Popen(
        [sys.executable, str(HERE / "dash_silo.py"), "--storage-url", url, "--name", name,
         "--expect", str(expect)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip


async def _ready(proc: subprocess.Popen[str]) -> list[str]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
    if not line.startswith("READY "):
        proc.kill()
        raise AssertionError(
            f"silo did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        )
    return line.split()[1:]


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


async def _run_cluster_checks(url: str, tag: str) -> None:
    a = _spawn(url, f"{tag}-a", 1)
    b = None
    try:
        await _ready(a)
        b = _spawn(url, f"{tag}-b", 2)
        _, _, dash_b = await _ready(b)
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(ClusterClient(membership_url=url))
            grain = client.get_grain("DashTickGrain", "g1")
            await grain.start(1.0)
            await client.get_grain("DashTickGrain", "crit").start(1.0, True)
            await client.get_grain("DashTickGrain", "w").weekday()
            page = await stack.enter_async_context(browser_page())
            base = f"http://127.0.0.1:{dash_b}/"

            # Cluster: both silos, Active.
            await page.goto(base + "cluster")
            for name in (f"{tag}-a", f"{tag}-b"):
                row = f'#silos tr[data-silo="{name}"][data-status="active"]'
                await page.wait_for_selector(row)
                # Each silo's release and protocol window, the cluster's level and ring.
                cells = await page.locator(row + " td").all_inner_texts()
                assert cells[3:5] == [__version__, ProtocolWindow.mine().text()], cells
            head = await page.locator("#cluster-id").inner_text()
            assert f"feature level {PROTOCOL} · balanced ring" in head, head
            await page.wait_for_selector("#live.on")
            await shot(page, f"{tag}-cluster")

            # Reminders: search by type and key prefix, open the row, see its history.
            await page.goto(base + "reminders")
            await page.fill('input[name="type"]', "DashTickGrain")
            await page.fill('input[name="key"]', "g")
            await page.click('#search button[type="submit"]')
            row = page.locator('#rows tr[data-name="beat"][data-grain="DashTickGrain/s:g1"]')
            await row.wait_for()
            await row.click()
            await page.wait_for_selector("#detail dl")
            for _ in range(60):  # the first ticks reach the history within a second or two
                if await page.locator("#history tbody tr").count():
                    break
                await page.click("#refresh-detail")
                await page.wait_for_timeout(250)
            assert await page.locator("#history tbody tr").count() > 0
            assert "every second" in await page.locator("#detail").inner_text()
            await shot(page, f"{tag}-reminder")

            # Pause from the page: ticks stop.
            await page.click("#act-pause")
            await page.wait_for_selector("#action-result.okmsg")
            assert any("Pause beat" in d for d in page.dialogs)
            await asyncio.sleep(1.2)  # a tick already running may still land
            paused_at, _ = await grain.ticks()
            # Nothing to await for "no tick": watch three periods go by.
            await asyncio.sleep(3.0)
            assert (await grain.ticks())[0] == paused_at
            # Trigger now while paused: exactly one tick, marked triggered.
            await page.wait_for_selector("#act-resume")
            await page.click("#act-trigger")
            await page.wait_for_selector("#action-result.okmsg")
            await wait_for(lambda: _ticks_at_least(grain, paused_at + 1), timeout=10)
            await asyncio.sleep(2.0)
            assert tuple(await grain.ticks()) == (paused_at + 1, 1)
            # Resume: ticks come again.
            await page.click("#act-resume")
            await page.wait_for_selector("#act-pause")
            await wait_for(lambda: _ticks_at_least(grain, paused_at + 3), timeout=15)
            await page.click("#refresh-detail")
            await page.wait_for_selector("#history >> text=(triggered)")
            await shot(page, f"{tag}-reminder-actions")

            # Backfill the last five seconds from the page: five backfill ticks.
            now = datetime.now(UTC).replace(microsecond=0)
            await page.fill("#backfill-from", (now - timedelta(seconds=5)).isoformat())
            await page.fill("#backfill-to", now.isoformat())
            await page.click("#act-backfill")
            await page.wait_for_selector("#action-result.okmsg")
            await wait_for(lambda: _backfilled(grain, 5), timeout=15)
            for _ in range(40):  # history is written a moment after the ticks
                await page.click("#refresh-detail")
                if await page.locator("#history >> text=(backfill)").count():
                    break
                await page.wait_for_timeout(250)
            assert await page.locator("#history >> text=(backfill)").count() > 0
            await shot(page, f"{tag}-reminder-backfill")

            # Audit: the page's actions are listed with the dashboard's principal
            # (loopback, no token: dashboard:local), newest first.
            await page.goto(base + "audit")
            await page.wait_for_selector("#audit tbody tr")
            done = await page.locator("#audit tbody tr").evaluate_all(
                "rows => rows.map(r => [r.dataset.action, r.dataset.principal])"
            )
            assert done[:4] == [
                ["backfill", "dashboard:local"], ["resume", "dashboard:local"],
                ["trigger", "dashboard:local"], ["pause", "dashboard:local"],
            ], done  # fmt: skip
            await page.fill('input[name="action"]', "trigger")
            await page.click('#audit-search button[type="submit"]')
            await page.wait_for_function(
                "() => [...document.querySelectorAll('#audit tbody tr')]"
                ".every(r => r.dataset.action === 'trigger')"
            )
            await shot(page, f"{tag}-audit")

            # Timeliness: the lateness chart draws lines.
            await page.goto(base + "timeliness")
            await page.wait_for_function(
                "() => { const s = document.getElementById('chart-lateness');"
                " return s && Number(s.dataset.points) > 1 && s.querySelector('path'); }",
                timeout=30_000,
            )
            await shot(page, f"{tag}-timeliness")
            await page.goto(base + "grains")
            await page.wait_for_selector("#activations >> text=DashTickGrain")
            await shot(page, f"{tag}-grains")

            # kill -9 silo a: the page shows it Dead within the detection time.
            await page.goto(base + "cluster")
            await page.wait_for_selector(f'#silos tr[data-silo="{tag}-a"][data-status="active"]')
            killed = time.monotonic()
            a.kill()
            await page.wait_for_selector(
                f'#silos tr[data-silo="{tag}-a"][data-status="dead"]', timeout=20_000
            )
            took = time.monotonic() - killed
            await page.wait_for_selector("#events >> text=dead")
            await shot(page, f"{tag}-cluster-dead")
            assert took < 20, took
            assert page.errors == []
    finally:
        for proc in (a, b):
            if proc is not None:
                _stop(proc)


async def _backfilled(grain: object, n: int) -> bool:
    return int(await grain.backfilled()) >= n  # type: ignore[attr-defined]


async def _ticks_at_least(grain: object, n: int) -> bool:
    return (await grain.ticks())[0] >= n  # type: ignore[attr-defined]


async def test_dashboard_in_a_browser_over_redis(own_redis) -> None:
    await _run_cluster_checks(own_redis.url, "redis")


async def test_dashboard_in_a_browser_over_postgres(postgres_url) -> None:
    await _run_cluster_checks(postgres_url, "pg")
