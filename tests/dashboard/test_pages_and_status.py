"""The reminders page's reads on real Redis and PostgreSQL (every row once over
the pages, a bounded look per request, filters in the store), the cluster's
status on both stores, and ``orleanspy cluster status`` on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orleanspy import Silo, SiloOptions
from orleanspy.dashboard._reminder_reads import SCAN_BUDGET, Query, ReminderPages
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.tables import TableConnections
from orleanspy.testing.cluster import FAST_MEMBERSHIP

ROOT = Path(__file__).resolve().parents[2]
ROWS = 3000


async def _seed(table: object) -> list[ReminderEntry]:
    """ROWS rows over seven periods from one instant: about 430 share each due
    millisecond (ties, split over the shards and five priorities); one in ten
    paused."""
    now = datetime.now(UTC)
    entries = []
    for i in range(ROWS):
        grain = GrainId("Alpha" if i % 3 else "Beta", f"k{i:05d}")
        entry = new_entry(
            ReminderSpec(period=60 + i % 7, priority=i % 5),
            service_id="default",
            grain_id=grain,
            name=f"r{i % 2}",
            now=now,
            options=ReminderOptions(),
        )
        entries.append(replace(entry, paused=i % 10 == 0))
    upsert_many = getattr(table, "upsert_many", None)
    if upsert_many is not None:
        await upsert_many(entries)
    else:
        for entry in entries:
            await table.upsert(entry)  # type: ignore[attr-defined]
    return entries


def _order(rows: list[ReminderEntry]) -> list[tuple[str, str]]:
    """The search order: scheduled rows by next due, grain, name; then paused rows
    by grain and name (Redis: by the key's text, which is the same for these keys)."""
    scheduled = sorted(
        (r for r in rows if not r.paused),
        key=lambda r: (r.next_due, r.grain_id.canonical, r.name),
    )
    paused = sorted((r for r in rows if r.paused), key=lambda r: (r.grain_id.canonical, r.name))
    return [(r.grain_id.canonical, r.name) for r in scheduled + paused]


async def _all_pages(
    pages: ReminderPages, query: Query, limit: int, budget: int = SCAN_BUDGET
) -> list[tuple[str, str]]:
    seen, cursor = [], None
    for _ in range(10 * ROWS):
        page = await pages.search(query, cursor, limit, None)
        assert len(page.rows) <= limit and page.scanned <= budget
        seen.extend((r.grain_id.canonical, r.name) for r in page.rows)
        cursor = page.cursor
        if cursor is None:
            return seen
    raise AssertionError("the pages never ended")


async def _check_pages(table: object, limits: tuple[int, ...] = (100, 7)) -> None:
    entries = await _seed(table)
    pages = ReminderPages(table)
    order = _order(entries)
    # Every row exactly once, in the order, whatever the page size.
    for limit in limits:
        assert await _all_pages(pages, Query(), limit) == order, limit
    beta = await _all_pages(pages, Query(grain_type="Beta"), 50)
    assert beta == [r for r in order if r[0].startswith("Beta/")]
    prefixed = await _all_pages(pages, Query(grain_type="Alpha", key_prefix="k001"), 50)
    assert prefixed == [r for r in order if r[0].startswith("Alpha/s:k001")]
    paused = await _all_pages(pages, Query(state="paused", priority=0, name="r0"), 100)
    # Rows i % 10 == 0 are paused, have priority 0 and are named r0.
    assert paused == sorted(
        (f"{'Alpha' if i % 3 else 'Beta'}/s:k{i:05d}", "r0") for i in range(0, ROWS, 10)
    )
    by_key = {(e.grain_id.canonical, e.name): e for e in entries}
    active = await _all_pages(pages, Query(state="active", priority=3), 40)
    assert active == [r for r in order if not by_key[r].paused and by_key[r].priority == 3]
    # Orphaned: types no Active silo hosts (here every Beta row).
    orphans = await pages.search(Query(state="orphaned"), None, 100, {"Alpha"})
    assert orphans.rows and all(r.grain_id.type_name == "Beta" for r in orphans.rows)
    # A search that matches nothing looks at a bounded part per request.
    page = await pages.search(Query(name="zzz"), None, 25, None)
    assert page.rows == [] and page.scanned <= SCAN_BUDGET
    # Stable paging: a row written between two pages is shown where it belongs,
    # the rows after the cursor are neither skipped nor shown twice.
    first = await pages.search(Query(), None, 50, None)
    assert [(r.grain_id.canonical, r.name) for r in first.rows] == order[:50]
    early = replace(entries[1], grain_id=GrainId("Alpha", "early"), next_due=entries[1].next_due)
    await table.upsert(early)  # type: ignore[attr-defined]
    rest = await _all_pages_from(pages, first.cursor)
    now_order = _order([*entries, early])
    assert rest == now_order[now_order.index(order[49]) + 1 :]
    assert ("Alpha/s:early", "r1") in now_order


async def _all_pages_from(pages: ReminderPages, cursor: str | None) -> list[tuple[str, str]]:
    seen = []
    while cursor is not None:
        page = await pages.search(Query(), cursor, 100, None)
        seen.extend((r.grain_id.canonical, r.name) for r in page.rows)
        cursor = page.cursor
    return seen


async def _on(url: str, shards: int = 256) -> AsyncIterator[object]:
    async with AsyncExitStack() as stack:
        table = await TableConnections(stack).reminder_table(url, service_id="default",
                                                             shards=shards)  # fmt: skip
        await table.start(stack)
        yield table


async def _check_small_budget(table: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a tiny budget and ask every request stops inside a run of ties, a
    shard or a part, and the cursor still visits every row exactly once, in order."""
    from orleanspy.dashboard import _reminder_reads, _reminder_stores

    monkeypatch.setattr(_reminder_reads, "SCAN_BUDGET", 23)
    monkeypatch.setattr(_reminder_stores, "_MIN_ASK", 2)
    entries = await _seed(table)
    pages = ReminderPages(table)
    assert await _all_pages(pages, Query(), 7, budget=23) == _order(entries)
    named = await _all_pages(pages, Query(name="r1", grain_type="Beta"), 9, budget=23)
    assert named == [r for r in _order(entries) if r[0].startswith("Beta/") and r[1] == "r1"]


async def test_reminder_pages_in_memory() -> None:
    # Each page sorts the table (an embedded silo's): a few page sizes only.
    await _check_pages(InMemoryReminderTable(), limits=(100, 41))


@pytest.mark.slow
async def test_reminder_pages_on_redis(redis_url: str) -> None:
    # Small pages are walked by the tiny-budget test (four shards, every request
    # cut short); here the 256 shards of the default layout.
    async for table in _on(redis_url):
        await _check_pages(table, limits=(100,))


@pytest.mark.slow
async def test_reminder_pages_on_postgres(postgres_url: str) -> None:
    async for table in _on(postgres_url):
        await _check_pages(table, limits=(100, 23))


@pytest.mark.slow
async def test_reminder_pages_on_postgres_with_a_tiny_budget(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async for table in _on(postgres_url, shards=4):
        await _check_small_budget(table, monkeypatch)


@pytest.mark.slow
async def test_reminder_pages_on_redis_with_a_tiny_budget(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async for table in _on(redis_url, shards=4):
        await _check_small_budget(table, monkeypatch)


async def _status_on(url: str) -> None:
    options = SiloOptions(storage_url=url, name="st", gateway_port=0, membership=FAST_MEMBERSHIP)
    async with Silo(options) as silo:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, "-m", "orleanspy.cli", "cluster", "status", "--storage-url", url]
        done = await asyncio.to_thread(
            subprocess.run, [*cmd, "--json"], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        [row] = doc["silos"]
        assert row["name"] == "st" and row["status"] == "active"
        assert row["address"] == str(silo.address) and row["version"]
        assert row["ring_share_percent"] == 100.0 and row["activations"] is not None
        assert [e["kind"] for e in doc["events"]] == ["joined"]
        # --watch prints again until interrupted.
        watch = subprocess.Popen([*cmd, "--json", "--watch", "0.2"], stdout=subprocess.PIPE,
                                 text=True, env=env)  # fmt: skip
        try:
            assert watch.stdout is not None
            lines = [await asyncio.to_thread(watch.stdout.readline) for _ in range(2)]
            assert all(json.loads(line)["silos"][0]["name"] == "st" for line in lines)
        finally:
            watch.kill()
            watch.wait()
            watch.stdout.close()  # type: ignore[union-attr]
        text = await asyncio.to_thread(
            subprocess.run, cmd, capture_output=True, text=True, env=env, timeout=60
        )
        assert text.returncode == 0 and "st " in text.stdout and "active" in text.stdout


@pytest.mark.slow
async def test_cluster_status_on_postgres(postgres_url: str) -> None:
    await _status_on(postgres_url)


@pytest.mark.slow
async def test_the_dashboard_command_serves_the_store_and_acts_through_a_gateway(
    redis_url: str,
) -> None:
    import httpx

    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'cluster'}")
    cli = [sys.executable, "-m", "orleanspy.cli"]
    secret = ["--secret", "dashboard-test-secret"]
    refused = await asyncio.to_thread(
        subprocess.run, [*cli, "dashboard", "--storage-url", redis_url, "--host", "0.0.0.0"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "no authentication" in refused.stderr
    silo = subprocess.Popen([*cli, "silo", "--redis-url", redis_url, "--import", "cli_grains",
                             "--name", "dash-cmd", "--gateway-port", "0", *secret],
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    dash = None
    try:
        assert silo.stdout is not None
        assert (await asyncio.to_thread(silo.stdout.readline)).startswith("READY ")
        from orleanspy import ClusterClient, MessagingOptions

        options = MessagingOptions(cluster_secret=secret[1])
        async with ClusterClient(redis_url=redis_url, options=options) as client:
            await client.get_grain("CliEchoGrain", "d").remind_me()
        dash = subprocess.Popen([*cli, "dashboard", "--storage-url", redis_url, "--port", "0",
                                 *secret], stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        assert dash.stdout is not None
        line = await asyncio.to_thread(dash.stdout.readline)
        assert line.startswith("READY http://127.0.0.1:"), line
        base = line.split()[1].rstrip("/")
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            cluster = (await http.get("/api/cluster")).json()
            assert [s["name"] for s in cluster["silos"]] == ["dash-cmd"]
            found = (await http.get("/api/reminders", params={"type": "CliEchoGrain"})).json()
            assert [r["name"] for r in found["rows"]] == ["hourly"]
            assert found["rows"][0]["schedule"] == "every hour at minute 0"
            await http.get("/reminders")
            done = await http.post("/api/action", headers={
                "x-csrf-token": http.cookies["orleanspy_csrf"]}, json={
                "grain": "CliEchoGrain/s:d", "name": "hourly", "action": "set_priority",
                "value": 100})  # fmt: skip
            assert done.status_code == 200, done.text
            detail = (await http.get("/api/reminder", params={
                "grain": "CliEchoGrain/s:d", "name": "hourly"})).json()  # fmt: skip
            assert detail["priority"] == 100
    finally:
        for proc in (dash, silo):
            if proc is not None:
                proc.terminate()
                proc.wait(30)
                if proc.stdout is not None:
                    proc.stdout.close()
