"""Headless Chromium for the dashboard tests: Debian's ``chromium`` driven by
playwright's Python package (no browser download), and screenshots under
``build/screenshots/``."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.needs import missing

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "screenshots"
CHROMIUM = os.environ.get("ORLEANSPY_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def need_browser() -> None:
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        missing(
            "browser", f"no chromium at {CHROMIUM}: run .ci/services (apt-get install chromium)"
        )


@asynccontextmanager
async def browser_page() -> AsyncIterator[Any]:
    """A page of a fresh headless Chromium that accepts every confirmation."""
    from playwright.async_api import async_playwright

    need_browser()
    SHOTS.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            page.dialogs = []

            async def accept(dialog: Any) -> None:
                page.dialogs.append(dialog.message)
                await dialog.accept()

            page.on("dialog", accept)
            page.errors = []
            page.on("pageerror", lambda exc: page.errors.append(str(exc)))
            yield page
        finally:
            await browser.close()


async def shot(page: Any, name: str) -> None:
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
