"""Must FAIL ``mypy --strict``: proves the check sees orleanspy's real types (were
every name ``Any``, as with an unreadable editable install, this would pass)."""

from __future__ import annotations

from orleanspy import Silo


async def main() -> None:
    async with Silo.local() as silo:
        total: str = await silo.client.get_grain("CounterGrain", "a").add(2)
        silo.no_such_attribute  # noqa: B018
        print(total)
