"""The dead letters page in a real browser, on an embedded silo: the letters list,
one opens with its traceback, Replay delivers it again (same occurrence id) and
it goes, Discard removes the other without delivering it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orleanspy import Grain, Remindable, Silo, SiloOptions, TickStatus
from orleanspy.testing import wait_for
from tests.dashboard.browser import browser_page, shot

pytestmark = pytest.mark.slow

#: Occurrence ids of ticks that reached the grain and returned.
DELIVERED: list[str] = []
FIXED: list[bool] = []


class LetterGrain(Grain, Remindable):
    async def start(self) -> None:
        await self.register_or_update_reminder("invoice", due=timedelta(milliseconds=1))

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        if not FIXED:
            raise RuntimeError(f"payment provider down for {self.grain_key}")
        DELIVERED.append(status.occurrence_id)


async def test_dead_letters_page_replays_and_discards_in_a_browser() -> None:
    DELIVERED.clear()
    FIXED.clear()
    options = SiloOptions(
        dashboard_port=0, grain_types=(LetterGrain,), allow_client_management=True
    )
    async with Silo.local(options) as silo, browser_page() as page:
        for key in ("acme", "globex"):
            await silo.client.get_grain(LetterGrain, key).start()

        async def two() -> bool:
            return int(await silo.client.reminders.count_dead_letters()) == 2

        await wait_for(two, 10)
        await page.goto(f"http://127.0.0.1:{silo.dashboard_port}/dead-letters")
        await page.wait_for_selector("#letter-rows tbody tr >> nth=1")
        text = await page.locator("#letter-rows").inner_text()
        assert "payment provider down for acme" in text and "LetterGrain/globex" in text
        await shot(page, "dead-letters")

        page_letters = (await silo.client.reminders.dead_letters()).letters
        acme = next(d for d in page_letters if d.grain_id.key == "acme")
        globex = next(d for d in page_letters if d.grain_id.key == "globex")
        await page.click(f'#letter-rows tr[data-id="{acme.id}"]')
        await page.wait_for_selector("#traceback")
        assert "RuntimeError" in await page.locator("#traceback").inner_text()
        FIXED.append(True)
        await page.click("#act-replay")
        await page.wait_for_selector("#letter-result.okmsg")
        assert [acme.id] == DELIVERED
        await page.wait_for_selector(f'#letter-rows tr[data-id="{acme.id}"]', state="detached")

        await page.click(f'#letter-rows tr[data-id="{globex.id}"]')
        await page.click("#act-discard")
        await page.wait_for_selector("#no-letters")
        assert [acme.id] == DELIVERED, "discard delivered the tick"
        assert any("Discard invoice" in d for d in page.dialogs)
        await shot(page, "dead-letters-empty")
        assert page.errors == []
