"""The dashboard mounted in a small FastAPI app (``samples/fastapi_dashboard.py``),
in a real browser: the app's own route answers, the dashboard's pages work under
the mount path, a hostile grain key shows as text, and an action goes through
the client's gateway."""

from __future__ import annotations

import subprocess
import sys
from contextlib import AsyncExitStack

import httpx
import pytest

from orleanspy import ClusterClient, Silo, SiloOptions
from orleanspy.identity import GrainId
from orleanspy.runtime.ops_http import HttpServer
from orleanspy.testing import wait_for
from samples.fastapi_dashboard import make_app
from tests.dashboard.browser import browser_page, shot
from tests.dashboard.dash_silo import DashTickGrain

pytestmark = pytest.mark.slow

HOSTILE = "<img src=x onerror=alert(1)>"


async def test_dashboard_mounted_in_a_fastapi_app(redis_url: str) -> None:
    options = SiloOptions(redis_url=redis_url, name="mounted", gateway_port=0,
                          allow_client_management=True, grain_types=(DashTickGrain,))  # fmt: skip
    async with AsyncExitStack() as stack:
        silo = await stack.enter_async_context(Silo(options))
        await silo.client.get_grain(DashTickGrain, HOSTILE).start(3600.0)
        app = make_app(ClusterClient(membership_url=redis_url))
        server = HttpServer(app, "127.0.0.1", 0, lifespan=True)
        await server.start(stack, what="test")
        base = f"http://127.0.0.1:{server.port}"
        async with httpx.AsyncClient(base_url=base) as http:
            hello = (await http.get("/hello")).json()
            assert hello["hello"] == "world" and hello["gateways"]
        page = await stack.enter_async_context(browser_page())
        await page.goto(base + "/orleans/cluster")
        await page.wait_for_selector('#silos tr[data-silo="mounted"][data-status="active"]')
        await shot(page, "fastapi-cluster")
        await page.goto(base + "/orleans/reminders?type=DashTickGrain")
        row = page.locator('#rows tr[data-name="beat"]')
        await row.wait_for()
        assert HOSTILE in await row.inner_text()  # shown as text, never as markup
        await row.click()
        await page.wait_for_selector("#detail dl")
        await page.click("#act-pause")
        await page.wait_for_selector("#action-result.okmsg")
        grain = GrainId("DashTickGrain", HOSTILE)

        async def paused() -> bool:
            entry = await silo.reminder_table.read(grain, "beat")  # type: ignore[union-attr]
            return entry is not None and entry.paused

        await wait_for(paused, timeout=10)
        await shot(page, "fastapi-reminder")
        assert page.dialogs == ["Pause beat?"]  # the confirmation, and no alert(1)
        assert page.errors == []


def test_import_orleanspy_imports_no_dashboard_dependency() -> None:
    code = (
        "import sys, orleanspy, orleanspy.cli\n"
        "assert not {'starlette', 'uvicorn', 'fastapi'} & set(sys.modules), sys.modules.keys()\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'starlette': raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "try:\n"
        "    import orleanspy.dashboard\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "orleanspy.dashboard needs starlette and uvicorn: pip install 'orleanspy[dashboard]'"
    )
