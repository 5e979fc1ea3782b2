"""The dashboard over real HTTP from a real silo: pages and their JSON, hostile
inputs (each answered 4xx, the silo serving on), the token, CSRF, the stream
bound, and the refusal to listen off loopback unauthenticated."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from orleanspy import Grain, Remindable, Silo, SiloOptions, TickStatus
from orleanspy.dashboard import MAX_STREAMS
from orleanspy.errors import ConfigurationError
from orleanspy.testing import wait_for
from orleanspy.versions import PROTOCOL, ProtocolWindow

TOKEN = "a-dashboard-token-of-some-length"


class HostileGrain(Grain, Remindable):
    async def start(self) -> None:
        await self.register_or_update_reminder("tick", due=timedelta(hours=1), period=60)
        await self.register_or_update_reminder("standup", cron="0 0 9 * * 1-5",
                                               tz="Europe/Berlin")  # fmt: skip

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        return None


def _options(**kw: object) -> SiloOptions:
    return SiloOptions(dashboard_port=0, grain_types=(HostileGrain,), **kw)  # type: ignore[arg-type]


async def _csrf(client: httpx.AsyncClient) -> str:
    page = await client.get("/reminders")
    assert page.status_code == 200
    return client.cookies["orleanspy_csrf"]


async def test_pages_and_reminder_search_and_detail() -> None:
    async with Silo.local(_options()) as silo:
        await silo.client.get_grain(HostileGrain, "<script>alert(1)</script>").start()
        await silo.client.get_grain(HostileGrain, "plain").start()
        base = f"http://127.0.0.1:{silo.dashboard_port}"
        async with httpx.AsyncClient(base_url=base) as client:
            for page in ("/", "/cluster", "/grains", "/reminders", "/timeliness"):
                r = await client.get(page)
                assert (
                    r.status_code == 200
                    and "script-src 'self'" in r.headers["content-security-policy"]
                )
            assert (await client.get("/static/chart.js")).status_code == 200
            cluster = (await client.get("/api/cluster")).json()
            assert cluster["silos"][0]["status"] == "active"
            # An embedded silo is a cluster of one: its window, and its level is its own.
            assert cluster["silos"][0]["protocols"] == ProtocolWindow.mine().text()
            assert cluster["feature_level"] == PROTOCOL
            grains = (await client.get("/api/grains")).json()
            calls = {(c["grain_type"], c["method"]): c["calls"] for c in grains["calls"]}
            assert calls[("HostileGrain", "start")] == 2  # inline and queued calls alike
            [act] = [a for a in grains["activations"] if a["grain_type"] == "HostileGrain"]
            assert act["total"] == 2
            rows = (await client.get("/api/reminders", params={"type": "HostileGrain"})).json()
            assert {(r["grain_text"], r["name"]) for r in rows["rows"]} == {
                ("HostileGrain/<script>alert(1)</script>", "tick"),
                ("HostileGrain/<script>alert(1)</script>", "standup"),
                ("HostileGrain/plain", "tick"),
                ("HostileGrain/plain", "standup"),
            }
            # Paging: three at a time, the cursor carries on where the page stopped.
            first = (await client.get("/api/reminders", params={"limit": "3"})).json()
            params = {"limit": "3", "cursor": first["cursor"]}
            rest = (await client.get("/api/reminders", params=params)).json()
            assert len(first["rows"]) == 3 and len(rest["rows"]) == 1 and rest["cursor"] is None
            named = (await client.get("/api/reminders", params={"name": "stand"})).json()
            assert {r["name"] for r in named["rows"]} == {"standup"}
            detail = (await client.get("/api/reminder", params={
                "grain": "HostileGrain/s:plain", "name": "standup"})).json()  # fmt: skip
            assert detail["schedule"] == "every weekday at 09:00 Europe/Berlin"
            assert len(detail["next_slots"]) == 5 and detail["history"] == []
            # describe's counters (nothing delivered yet) beside the next fire times.
            assert detail["counters"]["delivered"] == 0 and detail["counters"]["skipped"] == 0


async def test_hostile_inputs_get_4xx_and_the_silo_keeps_serving() -> None:
    async with Silo.local(_options(allow_client_management=True)) as silo:
        await silo.client.get_grain(HostileGrain, "k").start()
        base = f"http://127.0.0.1:{silo.dashboard_port}"
        async with httpx.AsyncClient(base_url=base) as client:
            bad_queries = [
                {"type": "x" * 201},
                {"name": "a\x00b"},
                {"priority": "1000"},
                {"priority": "ten"},
                {"state": "<b>"},
                {"limit": "0"},
                {"limit": "100000"},
                {"key": "only-a-key"},
                {"cursor": "r:99999:00"},
                {"cursor": "p:zz"},
                {"cursor": "p:" + "41" * 3000},
                {"cursor": "p:" + b"not|a|grain".hex()},
            ]
            for params in bad_queries:
                r = await client.get("/api/reminders", params=params)
                assert r.status_code == 400, (params, r.text)
                assert "error" in r.json()
            for params in ({"grain": "nope", "name": "tick"}, {"grain": "A/s:" + "k" * 2000}):
                assert (await client.get("/api/reminder", params=params)).status_code == 400
            missing = await client.get("/api/reminder", params={"grain": "X/s:y", "name": "z"})
            assert missing.status_code == 404
            assert (await client.get("/api/nosuch")).status_code == 404
            assert (await client.get("/api/events", params={"page": "x"})).status_code == 400

            # Actions: CSRF first, then every field checked.
            action = {"grain": "HostileGrain/s:k", "name": "tick", "action": "pause"}
            assert (await client.post("/api/action", json=action)).status_code == 403
            csrf = await _csrf(client)
            wrong = await client.post(
                "/api/action", json=action, headers={"x-csrf-token": "x" * 32}
            )
            assert wrong.status_code == 403
            foreign = await client.post("/api/action", json=action, headers={
                "x-csrf-token": csrf, "origin": "http://evil.example"})  # fmt: skip
            assert foreign.status_code == 403
            ok = {"x-csrf-token": csrf}
            for body in (
                {**action, "action": "drop_table"},
                {**action, "grain": "../../etc"},
                {**action, "name": ""},
                {**action, "name": "n" * 500},
                {**action, "action": "set_priority", "value": 999},
                {**action, "action": "set_action", "value": "explode"},
            ):
                assert (await client.post("/api/action", json=body, headers=ok)).status_code == 400
            raw = await client.post("/api/action", content=b"{not json", headers={
                **ok, "content-type": "application/json"})  # fmt: skip
            assert raw.status_code == 400
            big = await client.post("/api/action", content=b"[" * 20000, headers={
                **ok, "content-type": "application/json"})  # fmt: skip
            assert big.status_code == 400
            form = await client.post("/api/action", data={"a": "b"}, headers=ok)
            assert form.status_code == 400
            gone = {**action, "name": "nosuch"}
            assert (await client.post("/api/action", json=gone, headers=ok)).status_code == 409

            done = await client.post("/api/action", json=action, headers=ok)
            assert done.status_code == 200, done.text
            row = await silo.reminder_table.read(*_row_id(silo))
            assert row is not None and row.paused
            # The ops endpoints and the pages still answer.
            assert (await client.get("/api/cluster")).status_code == 200


def _row_id(silo: Silo) -> tuple[object, str]:
    from orleanspy.identity import GrainId

    return GrainId("HostileGrain", "k"), "tick"


async def test_actions_need_the_authority_of_management_changes() -> None:
    async with Silo.local(_options()) as silo:  # no secret, no TLS: clients may not change
        await silo.client.get_grain(HostileGrain, "k").start()
        base = f"http://127.0.0.1:{silo.dashboard_port}"
        async with httpx.AsyncClient(base_url=base) as client:
            csrf = await _csrf(client)
            r = await client.post("/api/action", headers={"x-csrf-token": csrf}, json={
                "grain": "HostileGrain/s:k", "name": "tick", "action": "delete"})  # fmt: skip
            assert r.status_code == 403 and "allow_client_management" in r.json()["error"]
            assert await silo.reminder_table.read(*_row_id(silo)) is not None


async def test_a_token_is_required_when_set() -> None:
    async with Silo.local(_options(dashboard_token=TOKEN)) as silo:
        base = f"http://127.0.0.1:{silo.dashboard_port}"
        async with httpx.AsyncClient(base_url=base) as client:
            assert (await client.get("/api/cluster")).status_code == 401
            assert (await client.get("/")).status_code == 401
            assert (await client.get("/static/app.js")).status_code == 401
            wrong = await client.get("/api/cluster", headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401
            assert (await client.get("/?token=wrong")).status_code == 401
            bearer = await client.get("/api/cluster", headers={"authorization": f"Bearer {TOKEN}"})
            assert bearer.status_code == 200
            visit = await client.get(f"/reminders?token={TOKEN}")
            assert visit.status_code == 303 and visit.headers["location"] == "/reminders"
            assert (await client.get("/api/cluster")).status_code == 200  # the cookie


async def test_event_streams_are_bounded() -> None:
    async with Silo.local(_options()) as silo:
        base = f"http://127.0.0.1:{silo.dashboard_port}"
        limits = httpx.Limits(max_connections=MAX_STREAMS + 4)
        async with httpx.AsyncClient(base_url=base, limits=limits, timeout=10) as client:
            streams, lines = [], []
            try:
                for _ in range(MAX_STREAMS):
                    cm = client.stream("GET", "/api/events", params={"page": "cluster"})
                    response = await cm.__aenter__()
                    streams.append(cm)
                    assert response.status_code == 200
                    # Held: a line iterator collected would close its stream.
                    lines.append(response.aiter_lines())
                    first = await anext(lines[-1])
                    assert json.loads(first.removeprefix("data: "))["silos"]
                over = await client.get("/api/events", params={"page": "cluster"})
                assert over.status_code == 503
            finally:
                for cm in streams:
                    await cm.__aexit__(None, None, None)
        # Closed streams free their places (the server sees the disconnects).
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:

            async def one_more() -> bool:
                async with client.stream("GET", "/api/events", params={"page": "grains"}) as r:
                    return r.status_code == 200

            await wait_for(one_more, timeout=10)


async def test_the_dashboard_refuses_to_listen_off_loopback_without_a_token() -> None:
    with pytest.raises(ConfigurationError, match="dashboard_token"):
        SiloOptions(dashboard_port=0, dashboard_host="0.0.0.0")
    with pytest.raises(ConfigurationError, match="16 characters"):
        SiloOptions(dashboard_port=0, dashboard_host="0.0.0.0", dashboard_token="short")
    SiloOptions(dashboard_port=0, dashboard_host="0.0.0.0", dashboard_token=TOKEN)


async def test_no_stream_no_reads() -> None:
    """Nobody watching: the dashboard reads nothing (it has no task of its own)."""
    from orleanspy.dashboard import Dashboard, SiloSource

    async with Silo.local() as silo:
        dash = Dashboard(SiloSource(silo), interval=0.05)
        await asyncio.sleep(0.3)
        assert dash.hub.reads == 0
        await dash.hub.status()
        await dash.hub.status()  # within the interval: the same read
        assert dash.hub.reads == 1


class FailingGrain(Grain, Remindable):
    """Fails its ticks until ``FIXED`` is set."""

    async def start(self) -> None:
        await self.register_or_update_reminder("once", due=timedelta(milliseconds=1))

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        if not FIXED:
            raise ValueError("<b>not yet</b>")
        DELIVERED.append(status.occurrence_id)


FIXED: list[bool] = []
DELIVERED: list[str] = []


async def test_dead_letters_page_lists_and_replays_and_discards_with_csrf() -> None:
    FIXED.clear()
    DELIVERED.clear()
    options = SiloOptions(
        dashboard_port=0, grain_types=(FailingGrain,), allow_client_management=True
    )
    async with Silo.local(options) as silo:
        for key in ("a", "b"):
            await silo.client.get_grain(FailingGrain, key).start()

        async def two() -> bool:
            return int(await silo.client.reminders.count_dead_letters()) == 2

        await wait_for(two, 10)
        base = f"http://127.0.0.1:{silo.dashboard_port}"
        async with httpx.AsyncClient(base_url=base) as client:
            page = await client.get("/dead-letters")
            assert page.status_code == 200 and "Dead letters" in page.text
            doc = (await client.get("/api/dead-letters")).json()
            assert len(doc["letters"]) == 2 and doc["cursor"] is None
            assert doc["letters"][0]["message"] == "<b>not yet</b>"  # data, never markup
            only = (await client.get("/api/dead-letters", params={
                "grain": "FailingGrain/s:a", "limit": "1"})).json()  # fmt: skip
            [a] = only["letters"]
            assert a["grain_text"] == "FailingGrain/a" and "ValueError" in a["traceback"]
            for bad in ({"limit": "0"}, {"grain": "nope"}, {"cursor": "x"}, {"name": "a\x00"}):
                assert (await client.get("/api/dead-letters", params=bad)).status_code == 400
            # Actions: CSRF first, then the id checked; unknown ids are a 409, nothing changes.
            replay = {"action": "replay", "id": a["id"]}
            assert (await client.post("/api/action", json=replay)).status_code == 403
            ok = {"x-csrf-token": await _csrf(client)}
            for body in ({**replay, "id": "../x"}, {**replay, "id": ""}, {**replay, "id": 7}):
                assert (await client.post("/api/action", json=body, headers=ok)).status_code == 400
            unknown = await client.post("/api/action", json={**replay, "id": "f" * 32}, headers=ok)
            assert unknown.status_code == 409 and "no dead letter" in unknown.json()["error"]
            failed = await client.post("/api/action", json=replay, headers=ok)
            assert failed.status_code == 409 and "not yet" in failed.json()["error"]
            assert int(await silo.client.reminders.count_dead_letters()) == 2
            FIXED.append(True)
            done = await client.post("/api/action", json=replay, headers=ok)
            assert done.status_code == 200, done.text
            assert [a["id"]] == DELIVERED
            [b] = (await client.get("/api/dead-letters")).json()["letters"]
            discard = {"action": "discard", "id": b["id"]}
            assert (await client.post("/api/action", json=discard, headers=ok)).status_code == 200
            assert (await client.get("/api/dead-letters")).json()["letters"] == []
            assert [a["id"]] == DELIVERED, "discard delivered the tick"


async def test_backfill_from_the_dashboard_shows_progress_and_cancels() -> None:
    """The reminder page's backfill action asks for one (bad ranges are 400, or
    409 with the management grain's refusal, nothing written), the detail shows
    its progress and labels, and the cancel action stops it."""
    options = _options(allow_client_management=True)
    options = dataclasses.replace(
        options, reminders=dataclasses.replace(options.reminders, backfill_rate=0.5)
    )
    async with Silo.local(options) as silo:
        await silo.client.get_grain(HostileGrain, "k").start()
        base = f"http://127.0.0.1:{silo.dashboard_port}"
        async with httpx.AsyncClient(base_url=base) as client:
            ok = {"x-csrf-token": await _csrf(client)}
            action = {"grain": "HostileGrain/s:k", "name": "tick", "action": "backfill"}
            now = datetime.now(UTC)
            span = {"from": (now - timedelta(minutes=10)).isoformat(), "to": now.isoformat()}
            for value in (None, "x", {"from": "yesterday", "to": span["to"]},
                          {"from": "2026-01-01T00:00:00", "to": span["to"]},
                          {**span, "overlap": 7}):  # fmt: skip
                r = await client.post("/api/action", json={**action, "value": value}, headers=ok)
                assert r.status_code == 400, (value, r.text)
            backwards = {"from": span["to"], "to": span["from"]}
            r = await client.post("/api/action", json={**action, "value": backwards}, headers=ok)
            assert r.status_code == 409 and "is not before end" in r.json()["error"]
            assert await silo.client.reminders.backfills() == []
            r = await client.post("/api/action", json={**action, "value": span}, headers=ok)
            assert r.status_code == 200, r.text
            params = {"grain": "HostileGrain/s:k", "name": "tick"}

            async def progressing() -> bool:
                doc = (await client.get("/api/reminder", params=params)).json()
                return bool(doc["backfill"]) and doc["backfill"]["delivered"] >= 1

            await wait_for(progressing, 10)
            doc = (await client.get("/api/reminder", params=params)).json()
            assert doc["backfill"]["total"] == 10 and doc["labels"] == {}
            cancel = {**action, "action": "cancel_backfill"}
            r = await client.post("/api/action", json=cancel, headers=ok)
            assert r.status_code == 200, r.text
            doc = (await client.get("/api/reminder", params=params)).json()
            assert doc["backfill"] is None
