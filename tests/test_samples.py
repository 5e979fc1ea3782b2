"""The samples a team copies from run: the FastAPI service hosts a silo in its
lifespan, and the two-silo compose file names what the docs say it does."""

from __future__ import annotations

from pathlib import Path

import httpx

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
