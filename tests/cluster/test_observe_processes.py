"""Tracing and the audit log on real silo processes (``orleanspy silo``), as an
operator runs them: a hostile trace context sent to a silo's gateway is dropped and
the silo keeps serving; a pause done from a silo's dashboard is listed by
``orleanspy audit --json`` with the dashboard's principal, through a gateway and,
with no silo up, from the store directly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from orleanspy import ClusterClient
from orleanspy.identity import GrainId
from orleanspy.messaging.message import Message, ResponseStatus
from orleanspy.options import MessagingOptions
from orleanspy.serialization import unpack
from orleanspy.testing.cluster import wait_for
from tests.cluster.cli_silos import HERE, silos
from tests.cluster.test_faults import RawGateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PYTHON = Path(sys.executable)
GOOD = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"


def _request(key: str, headers: dict[str, str]) -> Message:
    body: bytes = msgpack.packb([[key], {}])
    msg = Message.request(
        GrainId("traced.Echo", key), "echo", body, one_way=False,
        expires_at_ms=int(time.time() * 1000) + 30_000,
    )  # fmt: skip
    msg.headers.update(headers)
    return msg


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


async def test_a_hostile_trace_context_is_dropped_and_the_silo_keeps_serving(
    redis_url: str, tmp_path: Path
) -> None:
    spans = tmp_path / "spans.jsonl"
    cases = {
        "malformed": {"traceparent": "00-this-is-not-a-trace-context"},
        "zero-ids": {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"},
        "oversized": {"traceparent": "cc" + GOOD[2:] + "-" + "x" * 200_000},
        "hostile-state": {"traceparent": GOOD, "tracestate": "k=" + "v" * 100_000},
        "many-members": {"traceparent": GOOD, "tracestate": ",".join(f"k{i}=v" for i in range(40))},
        "good": {"traceparent": GOOD, "tracestate": "vendor=1"},
    }
    env = {"ORLEANSPY_TEST_SPANS": str(spans)}
    with silos(redis_url, "traced_grains", env, tmp_path / "logs") as group:
        group.start("traced-0", PYTHON)
        proc = group.procs["traced-0"]
        async with RawGateway(group.gateway("traced-0")) as raw:
            for key, headers in cases.items():
                answer = await raw.call(_request(key, headers))
                assert answer.status is ResponseStatus.OK, (key, unpack(answer.body))
                assert unpack(answer.body) == key
        assert proc.poll() is None, "the silo process died"
        async with ClusterClient(redis_url) as client:
            assert await client.get_grain("traced.Echo", "after").echo("still") == "still"

        def served() -> dict[str, dict[str, Any]]:
            return {
                s["attributes"]["orleanspy.grain"].split("s:", 1)[1]: s
                for s in _spans(spans)
                if s["name"] == "traced.Echo/echo" and s["kind"] == "SERVER"
            }

        await wait_for(lambda: set(cases) <= set(served()), timeout=10, what="the turns' spans")
        turns = served()
        assert group.tracebacks() == {}
    for key in ("malformed", "zero-ids", "oversized"):
        assert turns[key]["parent"] is None, f"{key}: a dropped traceparent must start a new trace"
        assert turns[key]["trace_id"] != "ab" * 16
    for key in ("hostile-state", "many-members", "good"):
        assert (turns[key]["trace_id"], turns[key]["parent"]) == ("ab" * 16, "cd" * 8), key
    assert turns["good"]["trace_state"] == "vendor=1"
    assert turns["hostile-state"]["trace_state"] == "", "an oversized tracestate is dropped whole"
    assert turns["many-members"]["trace_state"] == ""


def _audit(redis_url: str, env: dict[str, str], *args: str) -> tuple[list[dict[str, Any]], str]:
    result = subprocess.run(
        [str(PYTHON), "-P", "-m", "orleanspy", "--storage-url", redis_url, "audit", "--json",
         *args],
        capture_output=True, text=True, cwd=HERE, env={**os.environ, **env}, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records: list[dict[str, Any]] = json.loads(result.stdout)
    return records, result.stderr


async def test_orleanspy_audit_lists_a_pause_done_from_the_dashboard_with_its_principal(
    redis_url: str, tmp_path: Path
) -> None:
    token = "dashboard-token-of-the-ops-team"
    secret = "audit-test-cluster-secret"
    env = {"ORLEANSPY_CLUSTER_SECRET": secret}
    with silos(redis_url, "traced_grains", env, tmp_path / "logs") as group:
        group.start(
            "audited-0", PYTHON, "dashboard_port=0", f"dashboard_token={token}",
            "dashboard_token_name=ops",
        )  # fmt: skip
        options = MessagingOptions(cluster_secret=secret)
        async with ClusterClient(redis_url, options=options) as client:
            await client.get_grain("traced.Ticker", "t").start()
        base = group.dashboard("audited-0")
        auth = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=base, headers=auth, timeout=30) as http:
            assert (await http.get("/reminders")).status_code == 200
            csrf = http.cookies["orleanspy_csrf"]
            done = await http.post(
                "/api/action",
                json={"action": "pause", "grain": "traced.Ticker/s:t", "name": "beat"},
                headers={"x-csrf-token": csrf},
            )
            assert done.status_code == 200, done.text
            page = (await http.get("/api/audit", params={"principal": "dashboard:ops"})).json()
        records, how = _audit(redis_url, env, "--principal", "dashboard:ops")
        assert "via gateway" in how
        (pause,) = records
        assert (pause["action"], pause["principal"], pause["outcome"]) == (
            "pause", "dashboard:ops", "ok",
        )  # fmt: skip
        assert (pause["grain"], pause["reminder"], pause["via"]) == (
            "traced.Ticker/t", "beat", "audited-0",
        )  # fmt: skip
        assert pause["before"]["paused"] is False and pause["after"]["paused"] is True
        assert [r["id"] for r in page["records"]] == [pause["id"]], "the dashboard's audit page"
        # The gateway client that registered the row is not an operator action: no record.
        everyone, _ = _audit(redis_url, env)
        assert [r["id"] for r in everyone] == [pause["id"]]
        group.stop("audited-0")
    # No silo up: the CLI reads the log from the store itself.
    records, how = _audit(redis_url, env, "--grain", "traced.Ticker/t", "--action", "pause")
    assert "no silo is up" in how
    assert [r["id"] for r in records] == [pause["id"]]
