"""``orleanspy reminders dead-letters | replay | discard | counters``, run for real in
subprocesses: straight on the Redis table with no silo up, and through the gateway of
a running silo (which replay needs)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.counters import CounterDelta
from orleanspy.reminders.letters import DeadLetter
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from tests.cluster.test_cli import _cli, _stop, acli, ok_json

pytestmark = pytest.mark.slow

GRAIN = GrainId("CliEchoGrain", "k")


def _letter(i: int, at: datetime) -> DeadLetter:
    return DeadLetter(
        id=f"{i:032x}",
        grain_id=GRAIN,
        name="hourly",
        slot=at - timedelta(hours=i),
        first_tick_time=at - timedelta(days=1),
        attempts=2,
        error_type="ValueError",
        message=f"bad input {i}",
        traceback=f"Traceback (most recent call last):\nValueError: bad input {i}",
        at=at - timedelta(minutes=i),
        silo="silo-x",
        cron="0 0 * * * *",
    )


async def _seed(redis_url: str, *letters: DeadLetter) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="default")
        await table.start(stack)
        entry = new_entry(
            ReminderSpec(cron="0 0 * * * *"),
            service_id="default",
            grain_id=GRAIN,
            name="hourly",
            now=datetime.now(UTC),
            options=ReminderOptions(),
        )
        await table.upsert(entry)
        delta = CounterDelta(GRAIN, "hourly")
        delta.counts[:2] = [5, 2]  # delivered, failed
        delta.error(ValueError("bad input 1"), datetime(2030, 1, 1, tzinfo=UTC))
        await table.add_counts([delta])
        now = datetime.now(UTC)
        await table.add_dead_letters(letters, keep=100, expire_before=now - timedelta(days=1))


async def test_dead_letter_commands_straight_on_the_redis_table(redis_url: str) -> None:
    now = datetime.now(UTC)
    first, second = _letter(1, now), _letter(2, now)
    await _seed(redis_url, first, second)
    url = ("--redis-url", redis_url)
    listed, human, shown, counters = await asyncio.gather(
        acli(*url, "reminders", "dead-letters", "--json"),
        acli(*url, "reminders", "dead-letters"),
        acli(*url, "reminders", "dead-letters", "--grain", "CliEchoGrain/k", "--show"),
        acli(*url, "reminders", "counters", "CliEchoGrain/k", "hourly", "--json"),
    )
    doc = ok_json(listed)
    assert [d["id"] for d in doc["letters"]] == [first.id, second.id]
    assert doc["cursor"] is None
    assert doc["letters"][0]["message"] == "bad input 1" and doc["letters"][0]["attempts"] == 2
    assert human.returncode == 0 and human.stdout.split()[:7] == [
        "ID", "GRAIN", "NAME", "SLOT", "ATTEMPTS", "ERROR", "DEAD-LETTERED"
    ]  # fmt: skip
    assert first.id in human.stdout and "ValueError: bad input 2" in human.stdout
    assert "Traceback (most recent call last)" in shown.stdout
    c = ok_json(counters)
    assert (c["delivered"], c["failed"], c["last_error"]) == (5, 2, "ValueError: bad input 1")
    paged = await acli(*url, "reminders", "dead-letters", "--limit", "1")
    assert f"--cursor {first.id}" not in paged.stderr and "more: --cursor" in paged.stderr
    replayed = await acli(*url, "reminders", "replay", first.id)
    assert replayed.returncode == 1 and "no gateway of the cluster answered" in replayed.stderr
    discarded = await acli(*url, "reminders", "discard", first.id, "--json")
    assert ok_json(discarded)["discarded"]["id"] == first.id
    again = await acli(*url, "reminders", "discard", first.id)
    assert again.returncode == 1 and f"no dead letter '{first.id}'" in again.stderr
    left = ok_json(await acli(*url, "reminders", "dead-letters", "--json"))
    assert [d["id"] for d in left["letters"]] == [second.id]


async def test_export_and_import_carry_dead_letters(redis_url: str, tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    letters = [_letter(i, now) for i in (4, 5)]
    await _seed(redis_url, *letters)
    url = ("--redis-url", redis_url)
    out = tmp_path / "export.jsonl"
    exported = await acli(*url, "reminders", "export", "--dead-letters", "--output", str(out))
    assert exported.returncode == 0 and "exported 1 rows and 2 dead letters" in exported.stderr
    lines = out.read_text().splitlines()
    assert ['"row"' in lines[0], *('"dead_letter"' in line for line in lines[1:])] == [True] * 3
    for letter in letters:
        assert (await acli(*url, "reminders", "discard", letter.id)).returncode == 0
    imported = ok_json(await acli(*url, "reminders", "import", str(out), "--json"))
    assert imported["dead_letters"] == 2 and imported["exist"] == 1
    back = ok_json(await acli(*url, "reminders", "dead-letters", "--json"))
    assert [d["id"] for d in back["letters"]] == [d.id for d in letters]
    assert back["letters"][0]["message"] == "bad input 4"


async def test_replay_through_the_gateway_of_a_running_silo(redis_url: str) -> None:
    letter = _letter(3, datetime.now(UTC).replace(microsecond=0))  # stored to the ms
    await _seed(redis_url, letter)
    secret = ("--secret", "cli-test-secret")
    proc = _cli(
        "silo", "--import", "cli_grains", "--name", "cli-dl", "--redis-url", redis_url, *secret
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("READY "), (line, proc.stderr.read() if proc.stderr else "")
        url = ("--redis-url", redis_url, *secret)
        replayed = await acli(*url, "reminders", "replay", letter.id)
        assert replayed.returncode == 0, replayed.stderr
        assert "via gateway" in replayed.stderr
        assert replayed.stdout.startswith(f"replayed {letter.id} (slot {letter.slot.isoformat()})")
        left = ok_json(await acli(*url, "reminders", "dead-letters", "--json"))
        assert left == {"letters": [], "cursor": None}
        unknown = await acli(*url, "reminders", "replay", letter.id)
        assert unknown.returncode == 1 and "no dead letter" in unknown.stderr
    finally:
        _stop(proc)
