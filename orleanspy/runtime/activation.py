"""One activation of a grain: its mailbox, its turns, its lifecycle.

Turn rule: a non-reentrant activation runs one message at a time, in arrival
order. A message may run alongside running ones when the class is
``@reentrant``, the method is ``@always_interleave``, it and every running call
are ``@read_only``, or it is a call back into this grain along the current call
chain (see ``runtime.context``). Timer ticks are turns too.

Lifecycle: ACTIVATING (directory registration, persistent state loaded,
``on_activate``) → VALID → DEACTIVATING (turns drain, ``on_deactivate``) →
INVALID. On an embedded silo (no directory) a grain with neither state nor an
``on_activate`` of its own is VALID as soon as it is created (``start``).
Messages that reach an activation that is going away are handed back to the
dispatcher, which routes them to a fresh activation. An
``InconsistentStateError`` that escapes a turn (a state write lost to another
activation) deactivates the activation, so the next call reloads the state, as
in Orleans.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from orleanspy._retry import no_deadline, within
from orleanspy.clock import Clock
from orleanspy.errors import (
    ActivationError,
    ConfigurationError,
    GrainCallTimeoutError,
    InconsistentStateError,
)
from orleanspy.grain import Grain, GrainDefinition, GrainReminders
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.messaging.message import (
    PRINCIPAL_HEADER,
    Message,
    MessageKind,
    ResponseStatus,
    settle,
)
from orleanspy.messaging.remote_errors import error_payload
from orleanspy.metrics import GrainMetrics
from orleanspy.outbox import OUTBOX_HEADER, current_message
from orleanspy.reminders.audit import acting_principal
from orleanspy.runtime.context import CHAIN_HEADER, current_chain, decode_chain
from orleanspy.runtime.outbox import OutboxPort, OutboxSender
from orleanspy.runtime.ticks import TICK_METHOD, run_tick
from orleanspy.runtime.timers import TimerHandle
from orleanspy.serialization import Codec

if TYPE_CHECKING:
    from orleanspy._otel import Tracer
    from orleanspy.directory.table import ActivationAddress
    from orleanspy.state import PersistentState
    from orleanspy.storage.contract import GrainStorage

__all__ = ["Activation", "ActivationHost", "ActivationState", "activates_at_once"]

log = logging.getLogger(__name__)


class ActivationState(enum.Enum):
    ACTIVATING = 1
    VALID = 2
    DEACTIVATING = 3
    INVALID = 4


class ActivationHost(OutboxPort, Protocol):
    """What an activation needs from its silo (implemented by the dispatcher)."""

    clock: Clock
    codec: Codec
    # The service the silo belongs to (a reminder tick's occurrence id names it).
    service_id: str
    # The cluster's feature level (``membership.agreement.cluster_level``): what
    # persistent state may write (``versions.Feature``).
    feature_level: Callable[[], int]
    # The hosting silo's address; grain code may read it (where am I running?).
    address: SiloAddress
    activation_timeout: float
    deactivation_timeout: float
    # Grain storage providers by name (``SiloOptions.storage``).
    grain_storage: Mapping[str, GrainStorage]
    grain_metrics: GrainMetrics
    # The process's tracer (``orleanspy.tracing``), ``None`` when it does not trace.
    tracing: Tracer | None
    # Whether ``register_activation`` claims the grain somewhere it may wait for
    # (a cluster's directory); an embedded silo's claims nothing.
    registers_activations: bool

    def activity_ns(self) -> int:
        """``clock``'s now in integer nanoseconds since the epoch (what a turn's
        end records); at least millisecond-exact, and cheap (read per turn)."""
        ...

    def get_grain(self, grain: Any, key: Any) -> Any: ...
    @property
    def reminders(self) -> GrainReminders: ...
    def send_response(self, response: Message) -> None: ...
    def reroute(self, message: Message) -> None: ...
    async def register_activation(self, activation: Activation) -> ActivationAddress | None:
        """Claim the grain in the directory; the winner's address if another won."""
        ...

    def forward(self, message: Message, to: ActivationAddress) -> None: ...
    async def activation_ended(self, activation: Activation) -> None:
        """Remove the activation from the catalog and the directory."""
        ...


def activates_at_once(definition: GrainDefinition) -> bool:
    """No persistent state to read and the default ``on_activate``: besides the
    directory's claim, nothing in activating such a grain can wait."""
    return not definition.states and definition.cls.on_activate is Grain.on_activate


class _TimerTick:
    __slots__ = ("callback", "done")

    def __init__(self, callback: Callable[[], Awaitable[None]], done: asyncio.Future[None]):
        self.callback = callback
        self.done = done


_WorkItem = Message | _TimerTick
_VALID = ActivationState.VALID


class Activation:
    """The in-memory instance of a grain on this silo, with its mailbox.

    It is its grain's ``GrainRuntime`` (``grain._activation``): grain code
    reaches the silo only through the members that protocol names.
    """

    def __init__(
        self,
        grain_id: GrainId,
        definition: GrainDefinition,
        host: ActivationHost,
        activation_id: str,
    ) -> None:
        self.grain_id = grain_id
        self.definition = definition
        self.runtime = host
        self.activation_id = activation_id
        self.canonical = grain_id.canonical
        self.state = ActivationState.ACTIVATING
        self.grain: Grain | None = None
        # Read on every inline call: one attribute instead of two (or a tuple built).
        self._methods = definition.methods
        self._solo_chain = (self.canonical,)
        # Nanoseconds since the epoch (an int: a turn's end records it, and a
        # datetime, or a Python-level clock read, per turn was a measurable share
        # of a local call; ``host.activity_ns`` is ``time.time_ns`` on the real clock).
        self._stamp = host.activity_ns
        self._activity_ns: int = self._stamp()
        # The mailbox: made on the first message that must wait, dropped when it
        # empties (see below).
        self._queue: deque[_WorkItem] | None = None
        self._running = 0
        self._running_read_only = 0
        self._deactivate_requested = False
        # Made only when needed: a silo holds many activations, and every
        # container object here is one more for each full garbage collection to
        # walk. An idle activation that takes reminder ticks has none of
        # these four.
        self._idle_waiter: asyncio.Future[None] | None = None  # deactivation's wait
        self._timers: set[TimerHandle] | None = None
        self._turns: set[asyncio.Task[None]] | None = None  # message and timer turns
        self._inline: asyncio.Task[Any] | None = None  # the task of an inline turn
        # An inline call's turn (enter_inline/exit_inline): at most one at a time.
        self._inline_chain: contextvars.Token[tuple[str, ...]] | None = None
        self._inline_read_only = False
        self._lifecycle_task: asyncio.Task[None] | None = None
        self._outbox: OutboxSender | None = None  # made when a state queues messages

    @property
    def last_activity_ms(self) -> int:
        """When the last turn that counts as activity ended, in ms since the epoch."""
        return self._activity_ns // 1_000_000

    # -- GrainRuntime (what the grain reaches) ------------------------------------------

    @property
    def clock(self) -> Clock:
        return self.runtime.clock

    @property
    def silo_address(self) -> SiloAddress:
        return self.runtime.address

    @property
    def reminders(self) -> GrainReminders:
        return self.runtime.reminders

    def get_grain(self, grain: Any, key: Any) -> Any:
        return self.runtime.get_grain(grain, key)

    # -- activation ---------------------------------------------------------------------

    def start(self) -> None:
        """Begin activating: registration and ``on_activate`` run as a task,
        unless nothing in the activation can wait (``activates_at_once``): then
        it is VALID when this returns, with no task made for it.

        Either way the caller enqueues the message that caused the activation
        right after this, before anything else runs."""
        if not self.runtime.registers_activations and activates_at_once(self.definition):
            self._activate_now()
        else:
            self._lifecycle_task = asyncio.get_running_loop().create_task(self._activate())

    def _activate_now(self) -> None:
        """Activate synchronously (``start``): the grain's ``__init__`` is all
        there is to run. A cold start of many grains costs no task, no loop
        iteration and no suspension of the caller per activation."""
        defn = self.definition
        grain = defn.cls.__new__(defn.cls)
        grain._activation = self
        try:
            grain.__init__()  # type: ignore[misc]
        except Exception as exc:
            # Failed as the task would have failed it, once the message that
            # caused the activation is in the mailbox (the caller puts it there
            # before the loop runs this task).
            self._lifecycle_task = asyncio.get_running_loop().create_task(
                self._activation_failed(exc)
            )
            return
        self.grain = grain
        self.state = ActivationState.VALID

    async def _activation_failed(self, exc: Exception) -> None:
        self._fail_activation(exc)
        await self.runtime.activation_ended(self)

    async def _activate(self) -> None:
        host = self.runtime
        # The store operations of the activation (directory claim, state reads)
        # may wait out a failover until the call that caused it expires, and
        # never past the activation timeout (``_retry.within``).
        first = self._queue[0] if self._queue else None
        window = host.activation_timeout
        if isinstance(first, Message) and first.expires_at_ms:
            window = min(window, (first.expires_at_ms - host.clock.now_ms()) / 1000)
        within(window)
        try:
            winner = await host.register_activation(self)
            if winner is not None:
                # Another silo activated the grain first: hand everything to it.
                self.state = ActivationState.INVALID
                await host.activation_ended(self)
                while self._queue:
                    item = self._queue.popleft()
                    if isinstance(item, Message):
                        host.forward(item, winner)
                return
            defn = self.definition
            grain = defn.cls.__new__(defn.cls)
            grain._activation = self
            if not activates_at_once(defn):
                async with asyncio.timeout(host.activation_timeout):
                    if defn.states:
                        await self._load_states(grain)
                    grain.__init__()  # type: ignore[misc]
                    self.grain = grain
                    await grain.on_activate()
            else:
                # No state to read and the default on_activate: nothing can wait,
                # so no timeout (a timer per activation) is armed.
                grain.__init__()  # type: ignore[misc]
                self.grain = grain
        except asyncio.CancelledError:
            self.state = ActivationState.INVALID
            raise
        except Exception as exc:
            self._fail_activation(exc)
            await host.activation_ended(self)
            return
        self.state = ActivationState.VALID
        self._activity_ns = self._stamp()
        # Let go of this task as the lifecycle's: a live activation would
        # otherwise keep a done task, its coroutine and context (garbage every
        # full collection walks, for every activation).
        self._lifecycle_task = None
        queue = self._queue
        if not queue or not isinstance(queue[0], Message):
            self._pump()
            return
        # The call that caused the activation runs as this task's turn (one task
        # fewer per cold call); what may run beside it starts as usual.
        first = queue.popleft()
        assert isinstance(first, Message)
        read_only = self._info_flags(first)[1]
        self._running += 1
        if read_only:
            self._running_read_only += 1
        task = asyncio.current_task()
        assert task is not None
        if self._turns is None:
            self._turns = set()
        self._turns.add(task)
        self._pump()
        await self._run_message(first, read_only)

    async def _load_states(self, grain: Grain) -> None:
        """Bind and read every declared persistent state (before ``__init__``)."""
        host = self.runtime
        states = []
        for decl in self.definition.states:
            storage = host.grain_storage.get(decl.storage)
            if storage is None:
                raise ConfigurationError(
                    f"{self.definition.cls.__qualname__}.{decl.attribute} uses grain storage "
                    f"{decl.storage!r}, which this silo does not have (it has "
                    f"{sorted(host.grain_storage)}); name it in SiloOptions(storage={{...}})"
                )
            states.append(
                decl.bind(
                    grain,
                    grain_id=self.grain_id,
                    storage=storage,
                    codec=host.codec,
                    level=host.feature_level,
                    on_outbox=self._outbox_ready,
                )
            )
        if len(states) == 1:
            await states[0].read()
        else:
            await asyncio.gather(*(s.read() for s in states))

    def _outbox_ready(self, state: PersistentState[Any]) -> None:
        """``state`` holds outbox messages to send (``orleanspy.outbox``)."""
        if self._outbox is None:
            self._outbox = OutboxSender(self.runtime, self.grain_id, self.enqueue_timer_tick)
        self._outbox.wake(state)

    def _fail_activation(self, exc: Exception) -> None:
        self.state = ActivationState.INVALID
        log.warning("activation failed grain=%s error=%r", self.grain_id, exc)
        host = self.runtime
        first = True
        while self._queue:
            item = self._queue.popleft()
            if not isinstance(item, Message):
                item.done.cancel()
                continue
            if first and item.kind is MessageKind.REQUEST:
                first = False
                err = ActivationError(f"{self.grain_id}: activation failed: {exc!r}")
                err.__cause__ = exc
                payload = error_payload(err)
                payload["traceback"] = error_payload(exc)["traceback"]
                host.send_response(item.response(ResponseStatus.ERROR, host.codec.encode(payload)))
            else:
                # The call that caused the activation fails; the others get a fresh try.
                host.reroute(item)

    # -- mailbox ------------------------------------------------------------------------

    def enqueue(self, message: Message) -> None:
        """Accept a request or one-way message for this grain."""
        if self.state is ActivationState.INVALID:
            self.runtime.reroute(message)
            return
        if self.state is ActivationState.VALID and self._may_bypass(message):
            self._start(message)
        else:
            self._mailbox().append(message)
            if self.state is ActivationState.VALID:
                self._pump()

    def idle_and_valid(self) -> bool:
        """Whether a turn could start right now with nothing else running or queued."""
        return self.state is ActivationState.VALID and self._running == 0 and not self._queue

    def enter_inline(self, method: str, task: asyncio.Task[Any]) -> Callable[..., Any] | None:
        """Begin the call ``method`` as a turn in ``task``, the caller's, if a turn
        may start right now with nothing else running or queued (the activation
        is valid and idle) and ``method`` is callable: then the grain's bound
        method, which the caller calls and awaits itself, then calls
        ``exit_inline``, with no await in between; ``None`` otherwise.

        For local calls and the silo's own reminder ticks to an idle activation
        (``Dispatcher.invoke``): no message, no response, no task, no coroutine
        of the runtime's own around the grain's. Turn rules hold as for a
        message: calls that arrive meanwhile queue behind it (or interleave, as
        the class allows), the turn counts as activity, and an
        ``InconsistentStateError`` deactivates. The turn is the caller's:
        cancelling the caller (for a tick, the reminder service stopping)
        cancels it, and ``abandon`` (a simulated crash) cancels the caller. One
        inline turn at most runs at a time (it starts only when nothing runs),
        so its state lives here. The caller records the call in
        ``grain_metrics`` (it times it anyway).
        """
        if self._running or self._queue or self.state is not _VALID:
            return None
        info = self._methods.get(method)
        if info is None:
            return None
        self._running = 1
        if info.read_only:
            self._running_read_only += 1
            self._inline_read_only = True
        self._inline = task
        chain = current_chain.get()
        self._inline_chain = current_chain.set(
            (*chain, self.canonical) if chain else self._solo_chain
        )
        return getattr(self.grain, method)  # type: ignore[no-any-return]

    def exit_inline(self, error: BaseException | None) -> None:
        """End the turn ``enter_inline`` began; ``error`` is what the method raised."""
        current_chain.reset(self._inline_chain)  # type: ignore[arg-type]
        self._inline_chain = None
        if self._inline_read_only:
            self._inline_read_only = False
            self._running_read_only -= 1
        self._inline = None
        if error is not None and isinstance(error, InconsistentStateError):
            self.request_deactivation()
        # _turn_done(touch=True), without the call.
        self._running -= 1
        self._activity_ns = self._stamp()
        if self._idle_waiter is not None or self._deactivate_requested or self._queue is not None:
            self._turn_settled()

    def enqueue_timer_tick(self, callback: Callable[[], Awaitable[None]]) -> asyncio.Future[None]:
        """Queue a timer tick as a turn; the future completes when it has run."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._mailbox().append(_TimerTick(callback, done))
        if self.state is ActivationState.VALID:
            self._pump()
        return done

    @property
    def accepts_timer_ticks(self) -> bool:
        return self.state in (ActivationState.ACTIVATING, ActivationState.VALID)

    def _info_flags(self, message: Message) -> tuple[bool, bool]:
        info = self.definition.methods.get(message.method)
        if info is None:
            return False, False
        return info.always_interleave, info.read_only

    def _may_bypass(self, message: Message) -> bool:
        if self._running == 0 and not self._queue:
            return True
        interleave, _ = self._info_flags(message)
        return (
            self.definition.reentrant
            or interleave
            or self.canonical in decode_chain(message.headers.get(CHAIN_HEADER))
            or (not self._queue and self._can_run(message))
        )

    def _can_run(self, item: _WorkItem) -> bool:
        if self._running == 0 or self.definition.reentrant:
            return True
        if not isinstance(item, Message):
            return False
        interleave, read_only = self._info_flags(item)
        if interleave:
            return True
        if read_only and self._running_read_only == self._running:
            return True
        return self.canonical in decode_chain(item.headers.get(CHAIN_HEADER))

    def _mailbox(self) -> deque[_WorkItem]:
        if self._queue is None:
            self._queue = deque()
        return self._queue

    def _pump(self) -> None:
        queue = self._queue
        if queue is None:
            return
        while queue and self.state is ActivationState.VALID and self._can_run(queue[0]):
            self._start(queue.popleft())
        if not queue:
            self._queue = None

    def _start(self, item: _WorkItem) -> None:
        self._running += 1
        read_only = isinstance(item, Message) and self._info_flags(item)[1]
        if read_only:
            self._running_read_only += 1
        loop = asyncio.get_running_loop()
        if isinstance(item, Message):
            task = loop.create_task(self._run_message(item, read_only))
        else:
            task = loop.create_task(self._run_timer(item))
        # The loop keeps only weak references to tasks: hold running turns here
        # (each turn lets go of its own task in _turn_ended, which costs less
        # than a done-callback, a loop round of its own per turn).
        if self._turns is None:
            self._turns = set()
        self._turns.add(task)

    async def _run_message(self, message: Message, read_only: bool) -> None:
        host = self.runtime
        codec = host.codec
        headers = message.headers
        chain = (*decode_chain(headers.get(CHAIN_HEADER)), self.canonical)
        current_chain.set(chain)
        # Set for every message: the turn's task may have been made in another
        # turn's context (outbox.message_id).
        outbox_id = headers.get(OUTBOX_HEADER)
        current_message.set(None if outbox_id is None else (len(chain), outbox_id))
        # What the turn asks of the stores may wait out a failover until the
        # caller gives up, no longer (``_retry.within``); a message that never
        # expires (no caller waits) retries nothing. Set for every message too.
        left = 1.0
        if message.expires_at_ms:
            left = (message.expires_at_ms - host.clock.now_ms()) / 1000
            within(left)
        else:
            no_deadline()
        if PRINCIPAL_HEADER in headers:
            # Set by a gateway from what its transport authenticated, or by a silo.
            acting_principal.set(headers[PRINCIPAL_HEADER])
        started, failed = time.perf_counter(), True
        try:
            if left <= 0:
                # The caller gave up while the call waited for its turn (behind
                # other turns, or an activation waiting out a store failover),
                # and may have sent it again: running it now would run it twice
                # (a reminder tick retried by its service). Orleans drops an
                # expired message before its turn as well.
                raise GrainCallTimeoutError(
                    f"{self.grain_id}.{message.method}: the caller's deadline passed "
                    "before the call's turn; not run"
                )
            local = message.local_args
            args, kwargs = local if local is not None else codec.decode(message.body)
            if message.method == TICK_METHOD and not kwargs:
                call = run_tick(
                    getattr(self.grain, message.method),
                    self.definition,
                    host.service_id,
                    self.grain_id,
                    args,
                    self.clock,
                )
            else:
                call = getattr(self.grain, message.method)(*args, **kwargs)
            tracer = host.tracing
            if tracer is None:
                result = await call
            else:
                # The turn's span, a child of the caller's as the message carries it.
                with tracer.serve(self.grain_id, message.method, host.address, headers):
                    result = await call
            failed = False
            if message.kind is MessageKind.REQUEST:
                body = codec.encode(result)
                host.send_response(message.response(ResponseStatus.OK, body))
        except asyncio.CancelledError:
            if message.kind is MessageKind.REQUEST:
                err = error_payload(ActivationError(f"{self.grain_id}: call cancelled"))
                host.send_response(message.response(ResponseStatus.ERROR, codec.encode(err)))
            raise
        except Exception as exc:
            if isinstance(exc, InconsistentStateError):
                self.request_deactivation()
            if message.kind is MessageKind.REQUEST:
                payload = error_payload(exc)
                host.send_response(message.response(ResponseStatus.ERROR, codec.encode(payload)))
            else:
                log.warning("one-way call failed grain=%s method=%s", self.grain_id, message.method)
        finally:
            elapsed = time.perf_counter() - started
            host.grain_metrics.call(self.definition.type_name, elapsed, failed, message.method)
            if read_only:
                self._running_read_only -= 1
            if message.on_settled is not None:
                settle(message)  # a one-way message's sender may send another
            self._turn_ended(touch=True)

    async def _run_timer(self, tick: _TimerTick) -> None:
        try:
            await tick.callback()
            if not tick.done.done():
                tick.done.set_result(None)
        except asyncio.CancelledError:
            tick.done.cancel()
            raise
        except Exception as exc:
            if isinstance(exc, InconsistentStateError):
                self.request_deactivation()
            if not tick.done.done():
                tick.done.set_exception(exc)
        finally:
            # Timer ticks do not count as activity: a grain kept busy only by its
            # own timers is still collected (as in Orleans).
            self._turn_ended(touch=False)

    def _turn_ended(self, *, touch: bool) -> None:
        turns = self._turns
        if turns is not None:
            turns.discard(asyncio.current_task())
            if not turns:
                self._turns = None
        self._turn_done(touch=touch)

    def _turn_done(self, *, touch: bool) -> None:
        self._running -= 1
        if touch:
            self._activity_ns = self._stamp()
        self._turn_settled()

    def _turn_settled(self) -> None:
        """After a turn ended: wake deactivation, or start it, or run what waits."""
        if self._running == 0 and (self._idle_waiter is not None or self._deactivate_requested):
            if self._idle_waiter is not None and not self._idle_waiter.done():
                self._idle_waiter.set_result(None)
            if self._deactivate_requested and self.state is ActivationState.VALID:
                self.start_deactivation()
                return
        if self._queue is not None:
            self._pump()

    # -- timers -------------------------------------------------------------------------

    def register_timer(
        self,
        callback: Callable[[], Awaitable[None]],
        due: timedelta | float,
        period: timedelta | float | None,
    ) -> TimerHandle:
        handle = TimerHandle(self, callback, due, period)
        if self._timers is None:
            self._timers = set()
        self._timers.add(handle)
        return handle

    def forget_timer(self, handle: TimerHandle) -> None:
        if self._timers is not None:
            self._timers.discard(handle)

    # -- deactivation -------------------------------------------------------------------

    def is_idle_since(self, cutoff: datetime) -> bool:
        return (
            self.state is ActivationState.VALID
            and self._running == 0
            and not self._queue
            and self._activity_ns // 1_000_000 <= cutoff.timestamp() * 1000
        )

    def request_deactivation(self) -> None:
        """Deactivate once no turn is running (``Grain.deactivate_on_idle``)."""
        self._deactivate_requested = True
        if self._running == 0 and self.state is ActivationState.VALID:
            self.start_deactivation()

    def start_deactivation(self) -> asyncio.Task[None] | None:
        """Begin deactivating (idempotent); returns the task doing it."""
        if self.state is ActivationState.VALID:
            self.state = ActivationState.DEACTIVATING
            self._lifecycle_task = asyncio.get_running_loop().create_task(self._deactivate())
        return self._lifecycle_task

    async def deactivate(self) -> None:
        """Deactivate and wait until it is done."""
        if self.state is ActivationState.ACTIVATING and self._lifecycle_task is not None:
            await asyncio.wait([self._lifecycle_task])
        task = self.start_deactivation()
        if task is not None and self.state is not ActivationState.INVALID:
            await asyncio.shield(task)

    async def _deactivate(self) -> None:
        host = self.runtime
        for handle in list(self._timers or ()):
            handle.dispose()
        try:
            async with asyncio.timeout(host.deactivation_timeout):
                if self._running:
                    self._idle_waiter = asyncio.get_running_loop().create_future()
                    await self._idle_waiter
                if self._outbox is not None:
                    # No turn runs any more: what is queued is sent now, if it can be.
                    await self._outbox.finish(host.deactivation_timeout / 2)
                if self.grain is not None:
                    await self.grain.on_deactivate()
        except TimeoutError:
            log.warning("deactivation timed out grain=%s", self.grain_id)
        except Exception:
            log.exception("on_deactivate failed grain=%s", self.grain_id)
        self.state = ActivationState.INVALID
        await host.activation_ended(self)
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, Message):
                host.reroute(item)
            else:
                item.done.cancel()

    def abandon(self) -> None:
        """Drop everything at once, as a crash would: cancel turns, timers and the
        lifecycle task; no ``on_deactivate``, no directory clean-up."""
        self.state = ActivationState.INVALID
        for handle in list(self._timers or ()):
            handle.dispose()
        for task in [*(self._turns or ()), *filter(None, [self._inline])]:
            task.cancel()
        if self._lifecycle_task is not None:
            self._lifecycle_task.cancel()
        if self._outbox is not None:
            self._outbox.close()
        self._queue = None

    def __repr__(self) -> str:
        return f"<Activation {self.grain_id} {self.state.name} running={self._running}>"
