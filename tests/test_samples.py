"""The samples a team copies from run: the FastAPI service hosts a silo in its
lifespan, the two-silo compose file names what the docs say it does, and the
scheduling tour passes every step embedded and on two silos over Redis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from samples import fastapi_app

ROOT = Path(__file__).resolve().parent.parent


async def test_the_fastapi_sample_hosts_an_embedded_silo_in_its_lifespan(monkeypatch) -> None:
    for name in ("ORLEANSPY_REDIS_URL", "ORLEANSPY_STORAGE_URL", "ORLEANSPY_MEMBERSHIP_URL"):
        monkeypatch.delenv(name, raising=False)
    app = fastapi_app.app
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url="http://sample") as client:
            assert (await client.post("/counters/a/add/2")).json() == {"total": 2}
            assert (await client.post("/counters/a/add/3")).json() == {"total": 5}
            assert (await client.get("/counters/b")).json() == {"total": 0}
        silo = app.state.grains._silo
        assert silo.state.name == "RUNNING"
    # The lifespan stopped the silo with the application.
    assert silo.state.name == "STOPPED"


def test_the_two_silo_compose_file_runs_two_silos_and_a_client_on_one_redis() -> None:
    compose = (ROOT / "samples" / "two_silos" / "docker-compose.yml").read_text()
    for service in ("redis:", "silo-a:", "silo-b:", "client:"):
        assert f"  {service}" in compose, service
    assert compose.count("orleanspy silo") == 2
    assert "/readyz" in compose


@pytest.mark.slow
@pytest.mark.parametrize("where", ["embedded", "two silos over redis"])
def test_the_scheduling_tour_checks_every_step(where: str, redis_url: str) -> None:
    """samples/scheduling.py, as a user runs it: overlap, catch-up window,
    backfill, calendars (the payday dates), dead letters and replay, describe,
    labels and tick deadlines, each checked by the sample itself."""
    args = [] if where == "embedded" else ["--redis", redis_url]
    done = subprocess.run(
        [sys.executable, "-m", "samples.scheduling", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "done: every step checked" in done.stdout
    assert "fires Thu 2026-12-24 09:00 CET" in done.stdout
    assert "fires Fri 2027-04-23 09:00 CEST" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
