"""Every sample that talks to a cluster, run against a cluster whose silos require a
cluster secret (``ORLEANSPY_CLUSTER_SECRET``): ``orleanspy silo`` processes serving
the samples' grains. Each sample takes the secret as the CLI does
(``ClusterClient.from_env``), and without it is refused. The FastAPI dashboard
sample is driven in a headless Chromium, as the dashboard's own browser tests are.
(``samples/operations.py`` is run on a secured cluster by
``test_readme_commands``; ``samples/demo.py`` is one embedded process.)"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import pytest

from orleanspy import AuthenticationError, ClusterClient
from orleanspy.identity import GrainId
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.testing import wait_for
from orleanspy.testing.redis_server import free_port
from tests.cluster.cli_silos import Silos, silos
from tests.dashboard.browser import browser_page, shot
from tests.ready import stop_processes

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SECRET = "samples-secret"
GRAINS = "samples.fastapi_app,samples.two_silos.app,tests.dashboard.dash_silo"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORLEANSPY_")}
    return {**env, "PYTHONPATH": str(ROOT), "GRPC_ENABLE_FORK_SUPPORT": "0", **extra}


@pytest.fixture
def secured(redis_url: str, tmp_path: Path) -> Iterator[Silos]:
    """Two silos that require the secret, serving the samples' grains."""
    env = _env(ORLEANSPY_CLUSTER_SECRET=SECRET)
    with silos(redis_url, GRAINS, env, tmp_path / "logs") as group:
        group.start("sample-a", Path(sys.executable))
        group.start("sample-b", Path(sys.executable))
        yield group
        assert group.tracebacks() == {}


def _client_env(redis_url: str, secret: bool = True) -> dict[str, str]:
    extra = {"ORLEANSPY_REDIS_URL": redis_url}
    if secret:
        extra["ORLEANSPY_CLUSTER_SECRET"] = SECRET
    return _env(**extra)


async def test_the_fastapi_sample_is_a_client_of_a_secured_cluster(
    secured: Silos, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from samples import fastapi_app

    for name in [k for k in os.environ if k.startswith("ORLEANSPY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ORLEANSPY_REDIS_URL", redis_url)
    app = fastapi_app.app
    with pytest.raises(AuthenticationError, match="wrong or missing cluster secret"):
        async with app.router.lifespan_context(app):
            pass
    monkeypatch.setenv("ORLEANSPY_CLUSTER_SECRET", SECRET)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        assert isinstance(app.state.grains, ClusterClient)
        async with httpx.AsyncClient(transport=transport, base_url="http://sample") as client:
            assert (await client.post("/counters/secured/add/2")).json() == {"total": 2}
            assert (await client.post("/counters/secured/add/3")).json() == {"total": 5}


async def test_the_two_silo_client_sample_calls_both_silos_of_a_secured_cluster(
    secured: Silos, redis_url: str
) -> None:
    def client(secret: bool) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "samples.two_silos.app"], check=False, cwd=ROOT,
            env=_client_env(redis_url, secret), capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    ok, refused = await asyncio.gather(asyncio.to_thread(client, True),
                                       asyncio.to_thread(client, False))  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    landed = re.findall(r"(\d+) grains on (\S+)", ok.stdout)
    assert {silo for _, silo in landed} == {str(a) for a in secured.addresses.values()}
    assert sum(int(n) for n, _ in landed) == 20
    assert refused.returncode != 0
    assert "wrong or missing cluster secret" in refused.stderr


async def test_the_cluster_demo_secures_its_own_cluster_with_the_secret() -> None:
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "samples.cluster_demo"], cwd=ROOT,
        env=_env(ORLEANSPY_CLUSTER_SECRET=SECRET), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the silos require the cluster secret: a client without it was refused" in done.stdout
    assert re.search(r"round 3: per-silo", done.stdout), done.stdout


@asynccontextmanager
async def _uvicorn(env: dict[str, str]) -> AsyncIterator[str]:
    """``uvicorn samples.fastapi_dashboard:app`` as a user runs it; its base URL
    once it answers."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "samples.fastapi_dashboard:app", "--host",
         "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base) as http:

            async def answers() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"uvicorn exited: {proc.communicate()[1][-3000:]}")
                try:
                    return (await http.get("/hello")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(answers, timeout=60, what="the sample app answers")
        yield base
    finally:
        stop_processes([proc], timeout=20)
        if proc.stderr is not None:
            proc.stderr.close()


async def test_the_fastapi_dashboard_sample_on_a_secured_cluster_in_a_browser(
    secured: Silos, redis_url: str
) -> None:
    async with AsyncExitStack() as stack:
        client = ClusterClient.from_env(_client_env(redis_url))
        await stack.enter_async_context(client)
        await client.get_grain("DashTickGrain", "secured").start(3600.0)
        base = await stack.enter_async_context(_uvicorn(_client_env(redis_url)))
        async with httpx.AsyncClient(base_url=base) as http:
            hello = (await http.get("/hello")).json()
        assert len(hello["gateways"]) == 2, hello

        page = await stack.enter_async_context(browser_page())
        await page.goto(base + "/orleans/cluster")
        for name in secured.addresses:
            await page.wait_for_selector(f'#silos tr[data-silo="{name}"][data-status="active"]')
        await shot(page, "sample-secured-cluster")
        await page.goto(base + "/orleans/reminders?type=DashTickGrain")
        row = page.locator('#rows tr[data-name="beat"][data-grain="DashTickGrain/s:secured"]')
        await row.wait_for()
        await row.click()
        await page.wait_for_selector("#detail dl")
        # An action goes through the sample's client, past the gateways' secret check.
        await page.click("#act-pause")
        await page.wait_for_selector("#action-result.okmsg")
        table = RedisReminderTable(redis_url, service_id="default")
        await table.start(stack)

        async def paused() -> bool:
            entry = await table.read(GrainId("DashTickGrain", "secured"), "beat")
            return entry is not None and entry.paused

        await wait_for(paused, timeout=10, what="the row is paused")
        await shot(page, "sample-secured-reminder")
        assert page.dialogs == ["Pause beat?"] and page.errors == []

    # The same app without the secret does not get in: its client cannot start.
    refused = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", "import asyncio, samples.fastapi_dashboard as s\n"
         "async def main():\n    async with s.app.router.lifespan_context(s.app): pass\n"
         "asyncio.run(main())"],
        cwd=ROOT, env=_client_env(redis_url, secret=False), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert refused.returncode != 0 and "wrong or missing cluster secret" in refused.stderr
