"""The transactional outbox on an embedded silo (memory storage and streams):
``write(after=[...])`` queues calls and stream items in the state's record, the
activation sends them after the commit with their message ids, a tick is
acknowledged once they are sent, a new activation sends what a crashed one
left, sends that may pass are retried, and bad messages are refused before
anything is written. Every provider: ``check_grain_storage``'s outbox check."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy import (
    ConfigurationError,
    Grain,
    Remindable,
    SerializationError,
    Silo,
    SiloOptions,
    TickStatus,
    outbox,
    persistent_state,
)
from orleanspy.grain import definition_of
from orleanspy.identity import GrainId
from orleanspy.outbox import OutboxEvent
from orleanspy.state import PersistentState
from orleanspy.storage.memory import InMemoryGrainStorage
from orleanspy.testing import simulate_tick, wait_for
from orleanspy.testing.clock import ManualClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)

#: What receivers saw: (receiver key, message id, argument).
RECEIVED: list[tuple[str, str | None, object]] = []
#: Keys of grains whose on_activate fails while their count is above zero.
FAIL_ACTIVATIONS: dict[str, int] = {}


@dataclass
class Ledger:
    charged: list[str] = field(default_factory=list)


class MailerGrain(Grain, type_name="test_outbox.Mailer"):
    async def on_activate(self) -> None:
        left = FAIL_ACTIVATIONS.get(str(self.grain_key), 0)
        if left:
            FAIL_ACTIVATIONS[str(self.grain_key)] = left - 1
            raise RuntimeError("not yet")

    async def receipt(self, amount: int) -> None:
        RECEIVED.append((str(self.grain_key), outbox.message_id(), amount))
        # A call this method makes is not an outbox call.
        await self.get_grain(MailerGrain, "nested").plain(amount)

    async def plain(self, amount: int) -> None:
        RECEIVED.append(("nested", outbox.message_id(), amount))

    async def boom(self, amount: int) -> None:
        RECEIVED.append((str(self.grain_key), outbox.message_id(), amount))
        raise ValueError("the receiver's own error")


class InvoiceGrain(Grain, Remindable, type_name="test_outbox.Invoice"):
    ledger = persistent_state(Ledger)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        self.ledger.state.charged.append(status.current_tick_time.isoformat())
        mailer = self.get_grain(MailerGrain, str(self.grain_key))
        await self.ledger.write(
            tick=status,
            after=[
                outbox.call(mailer, "receipt", 42),
                outbox.publish("billing", {"invoice": str(self.grain_key)}),
            ],
        )

    async def charge(self, method: str, *after_args: object) -> None:
        """A plain call with an outbox (no tick): one call of ``method``."""
        self.ledger.state.charged.append(method)
        mailer = self.get_grain(MailerGrain, str(self.grain_key))
        await self.ledger.write(after=[outbox.call(mailer, method, *after_args)])

    async def bad_write(self, what: str) -> None:
        self.ledger.state.charged.append("bad")
        if what == "not-a-message":
            await self.ledger.write(after=[42])  # type: ignore[list-item]
        elif what == "unencodable":
            mailer = self.get_grain(MailerGrain, "x")
            await self.ledger.write(after=[outbox.call(mailer, "receipt", object())])
        else:
            mailer = self.get_grain(MailerGrain, "x")
            await self.ledger.write(
                after=[outbox.call(mailer, "receipt", i) for i in range(outbox.MAX_MESSAGES + 1)]
            )

    async def charged(self) -> list[str]:
        return self.ledger.state.charged

    async def leave(self) -> None:
        self.deactivate_on_idle()


def _gid(key: str) -> GrainId:
    return GrainId(definition_of(InvoiceGrain).type_name, key)


@pytest.fixture
async def silo() -> AsyncIterator[Silo]:
    RECEIVED.clear()
    FAIL_ACTIVATIONS.clear()
    options = SiloOptions(storage={"default": InMemoryGrainStorage()})
    async with Silo.local(options, clock=ManualClock(T0)) as silo:
        yield silo


async def _stored_outbox(silo: Silo, key: str) -> list[list[object]]:
    state: PersistentState[Ledger] = PersistentState(
        Ledger,
        grain_id=_gid(key),
        name="ledger",
        storage=silo.dispatcher.grain_storage["default"],
        codec=silo.dispatcher.codec,
    )
    await state.read()
    return state.outbox_unsent()


async def test_a_tick_sends_its_messages_after_the_commit_with_its_occurrence_id(
    silo: Silo,
) -> None:
    assert silo.streams is not None
    subscription = silo.streams.subscribe("billing")
    status = await simulate_tick(silo, InvoiceGrain, "a", "monthly", slot=T0)
    # The tick returned: its messages were sent, in order, with their ids.
    occurrence = status.occurrence_id
    assert RECEIVED[0] == ("a", f"{occurrence}.1", 42)
    assert RECEIVED[1] == ("nested", None, 42)  # the receiver's own call is not one
    async with asyncio.timeout(5):
        item = await anext(aiter(subscription))
    await subscription.aclose()
    assert item.item == OutboxEvent(f"{occurrence}.2", {"invoice": "a"})
    # The sent messages leave the record (a turn of the grain's own writes it).
    await wait_for(lambda: _stored_empty(silo, "a"), 5)
    assert await silo.client.get_grain(InvoiceGrain, "a").charged() == [T0.isoformat()]


async def _stored_empty(silo: Silo, key: str) -> bool:
    return await _stored_outbox(silo, key) == []


async def test_a_redelivered_tick_does_not_queue_its_messages_again(silo: Silo) -> None:
    await simulate_tick(silo, InvoiceGrain, "b", "monthly", slot=T0)
    await simulate_tick(silo, InvoiceGrain, "b", "monthly", slot=T0)  # deduplicated
    assert [r for r in RECEIVED if r[0] == "b"] == [RECEIVED[0]]


async def test_a_new_activation_sends_what_a_crashed_one_left(silo: Silo) -> None:
    """A record that holds an unsent message (its activation died before the
    send) is sent by the grain's next activation, with the same message id."""
    storage = silo.dispatcher.grain_storage["default"]
    crashed: PersistentState[Ledger] = PersistentState(
        Ledger, grain_id=_gid("c"), name="ledger", storage=storage, codec=silo.dispatcher.codec
    )
    crashed.state.charged.append("before the crash")
    await crashed.write(after=[outbox.call(GrainId("test_outbox.Mailer", "c"), "receipt", 7)])
    [queued] = crashed.outbox_unsent()
    assert RECEIVED == []  # nothing sends for a state no activation holds
    assert await silo.client.get_grain(InvoiceGrain, "c").charged() == ["before the crash"]
    await wait_for(lambda: ("c", queued[0], 7) in RECEIVED, 5)
    await wait_for(lambda: _stored_empty(silo, "c"), 5)
    assert len(RECEIVED) == 2  # the call and its nested call, once


async def test_a_send_that_may_pass_is_retried_until_it_does(silo: Silo) -> None:
    FAIL_ACTIVATIONS["d"] = 2  # the receiver fails to activate twice: ActivationError
    await silo.client.get_grain(InvoiceGrain, "d").charge("receipt", 5)
    await wait_for(lambda: any(r[0] == "d" for r in RECEIVED), 10)
    assert FAIL_ACTIVATIONS["d"] == 0
    assert [r[2] for r in RECEIVED if r[0] == "d"] == [5]
    await wait_for(lambda: _stored_empty(silo, "d"), 5)


async def test_a_receiver_that_raises_got_the_message_and_a_missing_method_is_dropped(
    silo: Silo, caplog: pytest.LogCaptureFixture
) -> None:
    await silo.client.get_grain(InvoiceGrain, "e").charge("boom", 1)
    await wait_for(lambda: _stored_empty(silo, "e"), 5)
    assert [r[2] for r in RECEIVED if r[0] == "e"] == [1]  # delivered once, not retried
    await silo.client.get_grain(InvoiceGrain, "e").charge("no_such_method", 2)
    await wait_for(lambda: _stored_empty(silo, "e"), 5)
    assert "can never be delivered" in caplog.text and "no_such_method" in caplog.text


@pytest.mark.parametrize("what", ["not-a-message", "unencodable", "too-many"])
async def test_bad_messages_are_refused_and_nothing_is_written(silo: Silo, what: str) -> None:
    grain = silo.client.get_grain(InvoiceGrain, "f")
    error = SerializationError if what == "unencodable" else ValueError
    with pytest.raises(error):
        await grain.bad_write(what)
    stored = await silo.dispatcher.grain_storage["default"].read(_gid("f"), "ledger")
    assert stored is None
    assert RECEIVED == []


async def test_below_the_feature_level_the_outbox_is_refused(silo: Silo) -> None:
    """While a 0.1 silo is live (level 1) nothing can read a queued message."""
    silo.dispatcher.feature_level = lambda: 1
    with pytest.raises(ConfigurationError, match="feature level 2"):
        await silo.client.get_grain(InvoiceGrain, "g").charge("receipt", 1)
    assert await silo.dispatcher.grain_storage["default"].read(_gid("g"), "ledger") is None


def test_outbox_messages_name_their_target() -> None:
    with pytest.raises(TypeError, match="grain reference"):
        outbox.call("MailerGrain/x", "receipt")
    with pytest.raises(ValueError, match="public grain method"):
        outbox.call(GrainId("T", "k"), "_private")
    with pytest.raises(ValueError, match="non-empty"):
        outbox.publish("", 1)
    assert outbox.message_id() is None  # outside any grain call


async def test_a_grain_that_goes_away_sends_and_flushes_first(silo: Silo) -> None:
    grain = silo.client.get_grain(InvoiceGrain, "h")
    await grain.charge("receipt", 9)
    await grain.leave()
    # Deactivation waits for the sends (no turn runs then: it flushes itself).
    await wait_for(lambda: _gid("h") not in silo.dispatcher.catalog.activations_by_id, 5)
    assert [r[2] for r in RECEIVED if r[0] == "h"] == [9]
    assert await _stored_outbox(silo, "h") == []
