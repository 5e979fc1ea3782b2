"""The grain storage conformance kit: prove that a ``GrainStorage`` keeps the contract.

A provider author calls it from their own tests with a factory: an async context
manager that yields a started, empty provider (and cleans up after)::

    @asynccontextmanager
    async def make_storage():
        async with AsyncExitStack() as stack:
            storage = MyGrainStorage(...)         # empty, e.g. a fresh service id
            await storage.start(stack)
            yield storage

    async def test_my_storage_keeps_the_contract():
        await check_grain_storage(make_storage)

or, for one test per check::

    @pytest.mark.parametrize("check", GRAIN_STORAGE_CHECKS, ids=lambda c: c.__name__)
    async def test_contract(check):
        await check(make_storage)

A failed check raises ``AssertionError`` saying what was expected. The checks
cover the read of a missing state, write and read back (bytes unchanged, states
of different grains and names apart), etag conflicts (stale, made-up, and after
a clear), clear, a 1 MB state, concurrent writers (exactly one wins), many
concurrent reads (each gets its own state, also from a provider that batches), bad
data in storage, which must reach the grain as a ``StorageError`` that names
the state, never as a crash or a silently wrong value, and reminder ticks
committed with a state (``write(tick=...)``), which a new activation must still
see as done, as it must find the outbox messages a write queued (``after=``).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

from orleanspy import outbox
from orleanspy.errors import InconsistentStateError, StorageError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import TickStatus, bind_tick
from orleanspy.serialization import Codec
from orleanspy.state import OUTBOX_CALL, OUTBOX_PUBLISH, PersistentState, encode_state
from orleanspy.storage.contract import GrainStorage, StoredState

__all__ = ["GRAIN_STORAGE_CHECKS", "StorageFactory", "check_grain_storage"]

StorageFactory = Callable[[], AbstractAsyncContextManager[GrainStorage]]
Check = Callable[[StorageFactory], Awaitable[None]]

_MB: Final = 1024 * 1024
_WRITERS: Final = 16


def _gid(key: object = "a") -> GrainId:
    return GrainId("ContractStateGrain", key)  # type: ignore[arg-type]


async def _read(storage: GrainStorage, gid: GrainId, name: str = "s") -> StoredState | None:
    stored = await storage.read(gid, name)
    assert stored is None or isinstance(stored, StoredState), f"read returned {stored!r}"
    return stored


# -- the checks ---------------------------------------------------------------------


async def check_read_of_missing_state_is_none(factory: StorageFactory) -> None:
    async with factory() as storage:
        assert await _read(storage, _gid("never-written")) is None, "a missing state reads None"


async def check_write_then_read(factory: StorageFactory) -> None:
    async with factory() as storage:
        gid = _gid()
        data = bytes(range(256)) + b"\x00tail"  # not text: every byte value, a NUL
        etag = await storage.write(gid, "s", data, None)
        assert isinstance(etag, str) and etag, f"a first write returns a new etag, got {etag!r}"
        assert await _read(storage, gid) == StoredState(data, etag), "read returns what was written"
        etag2 = await storage.write(gid, "s", b"", etag)
        assert etag2 is not None and etag2 != etag, "a write with the read etag wins, new etag"
        assert await _read(storage, gid) == StoredState(b"", etag2), "empty bytes are a state"
        # Other names and other grains (also keys of other kinds) are other states.
        assert await _read(storage, gid, "other") is None, "another name is another state"
        for key in ("b", 1, uuid.UUID(int=1), "A"):
            assert await _read(storage, _gid(key)) is None, f"grain key {key!r} is another grain"
        assert await storage.write(_gid(1), "s", b"one", None) is not None
        assert await _read(storage, _gid("1")) is None, "int key 1 and str key '1' differ"
        assert await _read(storage, gid) == StoredState(b"", etag2), "others left it alone"


async def check_stale_etag_is_refused(factory: StorageFactory) -> None:
    async with factory() as storage:
        gid = _gid()
        first = await storage.write(gid, "s", b"v1", None)
        assert first is not None
        assert await storage.write(gid, "s", b"x", None) is None, (
            "a write claiming nothing is stored must lose when something is"
        )
        second = await storage.write(gid, "s", b"v2", first)
        assert second is not None
        assert await storage.write(gid, "s", b"x", first) is None, "a stale etag must lose"
        assert await storage.write(gid, "s", b"x", "no-such-etag") is None, "a made-up etag"
        assert await storage.write(_gid("fresh"), "s", b"x", second) is None, (
            "an etag of another state does not create this one"
        )
        assert await _read(storage, _gid("fresh")) is None
        assert await _read(storage, gid) == StoredState(b"v2", second), "lost writes change nothing"


async def check_clear(factory: StorageFactory) -> None:
    async with factory() as storage:
        gid = _gid()
        assert await storage.clear(gid, "s", None) is True, "clearing nothing is a no-op success"
        etag = await storage.write(gid, "s", b"v1", None)
        assert etag is not None
        assert await storage.clear(gid, "s", None) is False, "clear(None) must lose to a state"
        assert await storage.clear(gid, "s", "no-such-etag") is False, "clear with a wrong etag"
        assert await _read(storage, gid) == StoredState(b"v1", etag), "lost clears change nothing"
        assert await storage.clear(gid, "s", etag) is True
        assert await _read(storage, gid) is None, "a cleared state reads None"
        assert await storage.clear(gid, "s", etag) is False, "the etag died with the state"


async def check_etags_never_come_back(factory: StorageFactory) -> None:
    async with factory() as storage:
        gid = _gid()
        seen: set[str] = set()
        etag: str | None = None
        for round_ in range(3):
            for i in range(3):
                etag = await storage.write(gid, "s", f"{round_}.{i}".encode(), etag)
                assert etag is not None
                assert etag not in seen, f"etag {etag!r} was used before for this state"
                seen.add(etag)
            old = etag
            assert await storage.clear(gid, "s", etag) is True
            etag = None
            # A writer that read before the clear must not win over the new state.
            new = await storage.write(gid, "s", b"after", None)
            assert new is not None and new not in seen
            assert await storage.write(gid, "s", b"stale", old) is None, (
                "an etag from before a clear must lose to a state written after it"
            )
            seen.add(new)
            etag = new


async def check_large_state(factory: StorageFactory) -> None:
    async with factory() as storage:
        gid = _gid("large")
        big = os.urandom(_MB)
        etag = await storage.write(gid, "s", big, None)
        assert etag is not None
        stored = await _read(storage, gid)
        assert stored is not None and stored.data == big, "1 MB comes back unchanged"
        bigger = os.urandom(_MB) + b"!"
        etag = await storage.write(gid, "s", bigger, etag)
        assert etag is not None
        stored = await _read(storage, gid)
        assert stored is not None and stored.data == bigger, "a 1 MB state can be replaced"


async def check_concurrent_writers_one_wins(factory: StorageFactory) -> None:
    async with factory() as storage:
        gid = _gid("raced")
        # First writes: everyone read "nothing stored".
        results = await asyncio.gather(
            *(storage.write(gid, "s", f"first-{i}".encode(), None) for i in range(_WRITERS))
        )
        winners = [i for i, etag in enumerate(results) if etag is not None]
        assert len(winners) == 1, f"exactly one first write wins, got {len(winners)}"
        (w,) = winners
        assert await _read(storage, gid) == StoredState(f"first-{w}".encode(), results[w] or "")
        # Updates: everyone read the same etag.
        base = results[w]
        results = await asyncio.gather(
            *(storage.write(gid, "s", f"next-{i}".encode(), base) for i in range(_WRITERS))
        )
        winners = [i for i, etag in enumerate(results) if etag is not None]
        assert len(winners) == 1, f"exactly one update with one etag wins, got {len(winners)}"
        (w,) = winners
        assert await _read(storage, gid) == StoredState(f"next-{w}".encode(), results[w] or "")
        # Clears racing writes with the same etag: one of them wins, not both.
        base = results[w]
        cleared, written = await asyncio.gather(
            storage.clear(gid, "s", base), storage.write(gid, "s", b"racer", base)
        )
        assert cleared != (written is not None), "a clear and a write with one etag: one wins"


async def check_concurrent_reads_each_get_their_own(factory: StorageFactory) -> None:
    async with factory() as storage:
        expected: dict[tuple[GrainId, str], StoredState | None] = {}
        for i in range(100):
            gid = _gid(f"many-{i}")
            for name in ("s", "t"):
                if (i + len(name)) % 3 == 0:
                    expected[(gid, name)] = None  # never written
                    continue
                data = f"{i}/{name}".encode()
                etag = await storage.write(gid, name, data, None)
                assert etag is not None
                expected[(gid, name)] = StoredState(data, etag)
        keys = list(expected) * 2  # each state read twice at once
        results = await asyncio.gather(*(storage.read(gid, name) for gid, name in keys))
        for (gid, name), got in zip(keys, results, strict=True):
            assert got == expected[(gid, name)], f"{gid} {name!r}: read {got!r}"


@dataclass
class _ProfileV1:
    name: str = ""
    plan: str = "free"
    legacy: int = 0


@dataclass
class _ProfileV2:
    name: str = ""
    plan: str = "free"
    tags: list[str] = field(default_factory=list)


async def check_bad_data_is_a_clear_error(factory: StorageFactory) -> None:
    codec = Codec()
    async with factory() as storage:

        def state(gid: GrainId, cls: type[object] = _ProfileV2) -> PersistentState[object]:
            return PersistentState(cls, grain_id=gid, name="s", storage=storage, codec=codec)

        valid = encode_state(_ProfileV2(name="x" * 100), codec)
        bad = {
            "garbage": b"\x01\xc1\xff\xfe not msgpack",
            "truncated": valid[: len(valid) // 2],
            "future-format": b"\x7f" + valid[1:],
            "empty": b"",
            "not-the-fields": encode_state([1, 2, 3], codec),
            "a-string": b"\x01\xa1x",
        }
        for key, data in bad.items():
            gid = _gid(key)
            assert await storage.write(gid, "s", data, None) is not None
            holder = state(gid)
            try:
                await holder.read()
            except StorageError as exc:
                assert str(gid) in str(exc) and "'s'" in str(exc), (
                    f"{key}: the error must name the grain and the state: {exc}"
                )
            else:
                raise AssertionError(f"{key}: bad stored bytes read as {holder.state!r}")
            # Nothing was lost: the bad record is still there to be looked at.
            assert await _read(storage, gid) is not None, f"{key}: reading must not remove it"
        # Records of another version of the class load: added fields take their
        # defaults, removed ones are ignored.
        gid = _gid("evolved")
        old = state(gid, _ProfileV1)
        old.state = _ProfileV1(name="ann", plan="gold", legacy=7)
        await old.write()
        new = state(gid)
        await new.read()
        assert new.state == _ProfileV2(name="ann", plan="gold"), f"evolution: {new.state!r}"
        assert new.etag == old.etag and new.exists
        # And the optimistic check holds through the state API too.
        new.state = _ProfileV2(name="ann", plan="platinum")
        await new.write()
        try:
            await old.write()
        except InconsistentStateError:
            pass
        else:
            raise AssertionError("a write with a stale etag must raise InconsistentStateError")


async def check_tick_commits_survive_a_new_activation(factory: StorageFactory) -> None:
    codec = Codec()
    first = datetime(2030, 1, 1, tzinfo=UTC)
    step = timedelta(seconds=10)

    def tick(slot: datetime, registration: datetime = first) -> TickStatus:
        status = TickStatus(registration, step, None, slot, slot)
        bind_tick(status, "kit", _gid("ticks"), "r")
        return status

    async with factory() as storage:

        def activation() -> PersistentState[_ProfileV2]:
            return PersistentState(
                _ProfileV2, grain_id=_gid("ticks"), name="s", storage=storage, codec=codec
            )

        writer = activation()
        writer.state = _ProfileV2(name="after the first tick")
        await writer.write(tick=tick(first))
        writer.state = _ProfileV2(name="after the second tick")
        await writer.write(tick=tick(first + step))
        fresh = activation()
        await fresh.read()
        assert fresh.committed("r", tick(first + step)), "a new activation must see the commit"
        assert fresh.state == _ProfileV2(name="after the second tick"), fresh.state
        assert fresh.committed("r", tick(first)), "and every earlier slot of the registration"
        assert not fresh.committed("r", tick(first + 2 * step)), "a later slot is not done"
        assert not fresh.committed("r", tick(first, registration=first + step)), (
            "another registration's slot is not done"
        )
        assert not fresh.committed("other", tick(first)), "another reminder's slot is not done"
        # A commit that loses the etag check is not kept, and neither is its state.
        writer.state = _ProfileV2(name="lost")
        fresh.state = _ProfileV2(name="won")
        await fresh.write()
        try:
            await writer.write(tick=tick(first + 2 * step))
        except InconsistentStateError:
            pass
        else:
            raise AssertionError("a write(tick=...) with a stale etag must be refused")
        last = activation()
        await last.read()
        assert last.state == _ProfileV2(name="won") and not last.committed(
            "r", tick(first + 2 * step)
        ), "a refused commit must leave the stored state and its commits as they were"
        assert last.committed("r", tick(first + step)), "a plain write keeps the commits"


async def check_outbox_survives_a_new_activation(factory: StorageFactory) -> None:
    codec = Codec()
    target = GrainId("KitTarget", "t")
    async with factory() as storage:

        def activation() -> PersistentState[_ProfileV2]:
            return PersistentState(
                _ProfileV2, grain_id=_gid("outbox"), name="s", storage=storage, codec=codec
            )

        writer = activation()
        writer.state = _ProfileV2(name="charged")
        await writer.write(after=[outbox.call(target, "notify", 1), outbox.publish("s", {"n": 2})])
        queued = writer.outbox_unsent()
        assert [e[1:4] for e in queued] == [
            [OUTBOX_CALL, target.canonical, "notify"],
            [OUTBOX_PUBLISH, "s", ""],
        ], queued
        fresh = activation()
        await fresh.read()
        assert fresh.state == _ProfileV2(name="charged"), fresh.state
        assert fresh.outbox_unsent() == queued, (
            "a new activation must find the messages the write queued, ids and all"
        )
        # Sent messages leave the record with a flush, which keeps the stored
        # value as written (not what the activation holds and has not written).
        fresh.outbox_sent(queued[0][0])
        fresh.state = _ProfileV2(name="not written")
        await fresh.outbox_flush()
        third = activation()
        await third.read()
        assert third.state == _ProfileV2(name="charged"), third.state
        assert third.outbox_unsent() == queued[1:], third.outbox_unsent()
        # A write that loses the etag check queues nothing.
        try:
            await writer.write(after=[outbox.call(target, "notify", 3)])
        except InconsistentStateError:
            pass
        else:
            raise AssertionError("a write(after=...) with a stale etag must be refused")
        last = activation()
        await last.read()
        assert last.outbox_unsent() == queued[1:], "a refused write must queue nothing"


GRAIN_STORAGE_CHECKS: Final[tuple[Check, ...]] = (
    check_read_of_missing_state_is_none,
    check_write_then_read,
    check_stale_etag_is_refused,
    check_clear,
    check_etags_never_come_back,
    check_large_state,
    check_concurrent_writers_one_wins,
    check_concurrent_reads_each_get_their_own,
    check_bad_data_is_a_clear_error,
    check_tick_commits_survive_a_new_activation,
    check_outbox_survives_a_new_activation,
)
"""Every check, each taking the factory; for one pytest case per check."""


async def check_grain_storage(factory: StorageFactory) -> None:
    """Run every check against fresh providers from ``factory``; raises
    ``AssertionError`` (prefixed with the check's name) on the first violation."""
    for check in GRAIN_STORAGE_CHECKS:
        try:
            await check(factory)
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__}: {exc}") from exc
