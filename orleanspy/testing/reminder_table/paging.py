"""Paging: ``read_page`` walks and ``count_types`` against brute force."""

from __future__ import annotations

import random
import uuid

from orleanspy.identity import GrainId
from orleanspy.reminders.model import (
    ReminderEntry,
)
from orleanspy.reminders.table import (
    ReminderTable,
)
from orleanspy.testing.reminder_table._support import (
    TableFactory,
    as_stored,
    new_row,
)

__all__ = [
    "check_read_page_against_brute_force",
]


async def _walk(
    table: ReminderTable, limit: int, type_name: str | None = None, key_prefix: str | None = None
) -> list[ReminderEntry]:
    out: list[ReminderEntry] = []
    cursor: str | None = None
    for _ in range(10_000):
        rows, cursor = await table.read_page(
            cursor, limit, type_name=type_name, key_prefix=key_prefix
        )
        assert len(rows) <= limit, f"a page of {len(rows)} rows for limit {limit}"
        out.extend(rows)
        if cursor is None:
            return out
    raise AssertionError("read_page never ended the walk")


async def check_read_page_against_brute_force(factory: TableFactory) -> None:
    """``read_page`` walks every row exactly once (paused ones too, with their
    etags), whatever the page size; ``type_name`` and ``key_prefix`` select what
    brute force selects (string keys only for a prefix, keys holding ``|``
    included); ``count_types`` agrees; a prefix without a type is refused."""
    async with factory() as table:
        rng = random.Random(7)
        expected: dict[str, ReminderEntry] = {}
        keys: list[object] = []
        for i in range(120):
            keys.append(rng.choice([f"t{i % 7}-{i}", f"a|b{i}", i, uuid.UUID(int=i)]))
        for i, key in enumerate(keys):
            type_name = ("PageGrain", "PageGrainB", "Page")[i % 3]
            gid = GrainId(type_name, key)  # type: ignore[arg-type]
            for name in ("r", "s")[: 1 + i % 2]:
                e = new_row(table, gid, name, paused=i % 5 == 0)
                expected[e.key] = as_stored(e, await table.upsert(e))
        for limit in (1, 7, 500):
            walked = await _walk(table, limit)
            got = [r.key for r in walked]
            assert len(got) == len(set(got)), f"limit {limit}: a row came back twice"
            assert set(got) == set(expected), f"limit {limit}: rows missing or extra"
            assert {r.key: r for r in walked} == expected, "a paged row differs from its write"
        for type_name, prefix in (
            ("PageGrain", None),
            ("Page", None),
            ("PageGrainB", "t3"),
            ("PageGrain", "a|"),
            ("PageGrain", "a|b1"),
            ("PageGrain", "1"),
            ("Nothing", None),
        ):
            want = {
                k
                for k, r in expected.items()
                if r.grain_id.type_name == type_name
                and (
                    prefix is None
                    or (isinstance(r.grain_id.key, str) and r.grain_id.key.startswith(prefix))
                )
            }
            got = [r.key for r in await _walk(table, 5, type_name, prefix)]
            assert len(got) == len(set(got)), f"{type_name} {prefix!r}: a row twice"
            assert set(got) == want, f"{type_name} {prefix!r}: {len(got)} rows, want {len(want)}"
        brute: dict[str, int] = {}
        for r in expected.values():
            brute[r.grain_id.type_name] = brute.get(r.grain_id.type_name, 0) + 1
        assert await table.count_types() == brute, "count_types differs from the rows"
        try:
            await table.read_page(None, 10, key_prefix="x")
        except ValueError:
            pass
        else:
            raise AssertionError("a key prefix without a type was accepted")
