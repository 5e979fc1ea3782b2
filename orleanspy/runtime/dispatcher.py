"""The dispatcher: every message in and out of a silo passes through it.

Requests are validated (known grain type, callable method), then go to the local
activation, or are located (directory cache, directory, placement) and sent to
the silo that has or should create the activation. Responses complete the
caller's pending future, or travel back to the silo (or gateway client) that
sent the request. It also is the silo's ``CallInvoker``: calls made by grains
and by ``silo.client`` start here.

Requests this silo sends to another silo on behalf of its own callers (grains,
``silo.client``, gateway clients) are remembered until answered, so that a
call never waits out the response timeout on a silo that is gone: when the
connection to a silo is lost (``connection_lost``, also called when
membership declares it Dead) every such call fails at once with
``SiloUnavailableError`` and the grain's cached location is dropped. Only
reminder ticks (at-least-once by contract) are sent again, and only once the
target silo is known to be gone, to the grain's new activation. A call whose
target turned out to be an earlier incarnation of a restarted silo
(``SiloRestartedError``: it never ran) is routed again after re-resolving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from orleanspy import tracing
from orleanspy._retry import within
from orleanspy.clock import Clock, SystemClock
from orleanspy.errors import (
    ClosedError,
    GrainCallTimeoutError,
    GrainMethodNotFoundError,
    MessageRejectedError,
    SiloRestartedError,
    SiloUnavailableError,
    UnknownGrainTypeError,
)
from orleanspy.grain import GrainDefinition, lookup_definition
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.messaging.message import (
    PRINCIPAL_HEADER,
    SYSTEM_TYPE_PREFIX,
    Message,
    MessageKind,
    ResponseStatus,
    settle,
)
from orleanspy.messaging.pending import PendingCalls
from orleanspy.messaging.remote_errors import error_payload, rebuild_error, result_of
from orleanspy.messaging.transport import Transport
from orleanspy.metrics import GrainMetrics
from orleanspy.options import SiloOptions
from orleanspy.outbox import OUTBOX_HEADER, OutboxEvent
from orleanspy.reference import GrainFactory
from orleanspy.remindable.management import MANAGEMENT_TYPE
from orleanspy.remindable.registry import ReminderRegistry
from orleanspy.reminders.audit import LOCAL, acting_principal
from orleanspy.runtime.activation import Activation, activates_at_once
from orleanspy.runtime.catalog import Catalog
from orleanspy.runtime.context import CHAIN_HEADER, current_chain, encode_chain
from orleanspy.runtime.immutable import (
    INT_END,
    INT_MIN,
    SCALARS,
    all_immutable,
    result_immutable,
)
from orleanspy.runtime.inline import InlineDeadlines, task_of_loop
from orleanspy.runtime.locator import Locator
from orleanspy.runtime.ticks import TICK_METHOD, run_tick
from orleanspy.serialization import Codec, DecodeLimits
from orleanspy.versions import PROTOCOL

if TYPE_CHECKING:
    from orleanspy._otel import Tracer
    from orleanspy.directory.table import ActivationAddress
    from orleanspy.storage.contract import GrainStorage
    from orleanspy.streams.provider import StreamProvider

__all__ = ["Dispatcher"]

log = logging.getLogger(__name__)

# A sent request is remembered under (gateway client or None, message id).
_SentKey = tuple[str | None, int]
_RESTARTED = f"{SiloRestartedError.__module__}.{SiloRestartedError.__qualname__}"
# Reminder ticks are at-least-once: after their silo died they are sent again.
_TICK_METHOD = TICK_METHOD
#: Set on the ticks of a silo's reminder service, and only on them (``invoke``).
TICK_HEADER = "tick"
_FORGED_TICK = (
    "{gid}.receive_reminder refused: reminder ticks come only from the reminder "
    "service (use orleanspy.testing.simulate_tick in tests, or the management "
    "grain's trigger)"
)
_VERDICT_POLL = 0.1
# An activation's end that the directory store refused to record is tried again
# this often, this many times (a failover takes seconds; a dead store longer).
_UNREGISTER_RETRY_S = 1.0
_UNREGISTER_ATTEMPTS = 30
# Requests from silos not (yet) in the table that may wait for a table read;
# beyond it they are dropped, so made-up senders cannot pile up work.
_MAX_STRANGERS = 1000
# What gateway clients may always call on the reminder management grain.
_MANAGEMENT_READS = frozenset(
    {
        "upcoming",
        "list_for_grain",
        "get",
        "count_all",
        "count",
        "count_types",
        "orphans",
        "page",
        "history",
        "audit",
        "counters",
        "describe",
        "dead_letters",
        "dead_letter",
        "count_dead_letters",
        "get_calendar",
        "calendars",
        "backfills",
    }
)
# Local calls run inline (in the caller's task) this many in a row between yields.
_INLINE_STREAK = 64
# Dropped one-way messages are logged at most once per this many seconds, with
# the count since the last line: a stop can drop thousands that were queued.
_DROP_LOG_EVERY_S = 1.0


class Dispatcher:
    """Routes messages for one silo; implements ``CallInvoker``, ``MessageSink``
    and ``ActivationHost``."""

    def __init__(
        self,
        *,
        address: SiloAddress,
        clock: Clock,
        options: SiloOptions,
        locator: Locator,
        grain_types: Mapping[str, GrainDefinition],
        transport: Transport | None = None,
    ) -> None:
        self.address = address
        self.clock = clock
        # ActivationHost.activity_ns: read at the end of every turn, so on the
        # real clock the C function itself rather than a method around it.
        self.activity_ns: Callable[[], int] = (
            time.time_ns if type(clock) is SystemClock else lambda: clock.now_ms() * 1_000_000
        )
        self.codec = Codec(
            reference_factory=self._reference, limits=DecodeLimits.of(options.messaging)
        )
        self.activation_timeout = options.activation_timeout.total_seconds()
        self.deactivation_timeout = options.deactivation_timeout.total_seconds()
        self._response_timeout = options.messaging.response_timeout.total_seconds()
        self._response_timeout_ms = int(self._response_timeout * 1000)
        self._max_forwards = options.messaging.max_forward_count
        self._locator = locator
        self._local_only = locator.local_only
        # An embedded silo claims no directory entry: an activation with nothing
        # else to wait for is made synchronously (``Activation.start``).
        self.registers_activations = not self._local_only
        self._types = grain_types
        self._transport = transport
        self._pending: PendingCalls[Message] = PendingCalls(self._response_timeout)
        self._inline_deadlines = InlineDeadlines(self._response_timeout)
        self._inline_streak = _INLINE_STREAK
        self._loop: asyncio.AbstractEventLoop | None = None  # see invoke
        self._background: set[asyncio.Task[Any]] = set()
        self.factory = GrainFactory(self)
        self.catalog = Catalog(
            self,
            clock=clock,
            collection_age=options.collection_age,
            check_interval=options.collection_check_interval,
        )
        # The catalog's table, read on every call (one method call less per call).
        self._activations = self.catalog.activations_by_id
        self._reminders: ReminderRegistry | None = None
        # What outbox messages publish to (set by the silo once its streams start).
        self.streams: StreamProvider | None = None
        # Requests sent to other silos and not answered yet (see module docstring).
        self._sent: dict[_SentKey, Message] = {}
        self._sent_sweep_at = 1024
        self._client_management = options.client_management_allowed
        self._strangers = 0  # requests waiting to learn whether their sender is a member
        self._dropped_unlogged = 0  # one-way messages dropped since the last log line
        self._drop_logged_at = -_DROP_LOG_EVERY_S
        # Grain storage providers by name, set by the silo before it starts.
        self.grain_storage: Mapping[str, GrainStorage] = {}
        self.service_id = options.service_id
        # The cluster's feature level; the silo points it at its membership.
        self.feature_level: Callable[[], int] = _this_release
        self.grain_metrics = GrainMetrics()  # the silo sets a recording one
        self.tracing: Tracer | None = None
        self.trace_with(tracing.active())

    # -- wiring -------------------------------------------------------------------------

    def trace_with(self, tracer: Tracer | None) -> None:
        """Trace this silo's calls with ``tracer`` (``None``: not at all).

        A call that becomes a message gets the caller's span, whose context the
        message carries, and the callee's span where its turn runs
        (``Activation``); a local call that runs inline in its caller's task is
        one span (no hop, no message). Each hook tests ``tracing`` against
        ``None`` and does nothing else when the silo does not trace.
        """
        self.tracing = tracer

    def _reference(self, grain_id: GrainId, interface: str | None) -> Any:
        return self.factory.reference(grain_id, interface)

    @property
    def reminders(self) -> ReminderRegistry:
        """The reminder registry grains use (set by the silo)."""
        if self._reminders is None:
            raise RuntimeError("this silo has no reminder service")
        return self._reminders

    def set_reminders(self, registry: ReminderRegistry) -> None:
        self._reminders = registry

    def get_grain(self, grain: Any, key: Any) -> Any:
        return self.factory.get_grain(grain, key)

    # -- outgoing calls (CallInvoker) ---------------------------------------------------

    async def invoke(  # noqa: PLR0917 (see the docstring)
        self,
        grain_id: GrainId,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        one_way: bool = False,
        reminder_tick: bool = False,
        deadline: float | None = None,
    ) -> Any:
        """Send a call from this silo and wait for its result (see ``CallInvoker``).

        Pass ``one_way``, ``reminder_tick`` and ``deadline`` by keyword. They are
        not keyword-only because CPython calls a function with keyword-only
        parameters through its slower generic path, and this runs on every call.

        ``reminder_tick``: the call is a tick of a reminder this silo owns (its
        arguments, name and ``TickStatus``, are immutable); it is routed by
        ``route_reminder_tick`` (reminder-affine placement), or, when the grain
        is active here and idle, run at once as a turn in the calling task (its
        result is not returned: a tick's is discarded anyway). Only such calls
        carry the tick header that ``receive_reminder`` requires (``route``).
        ``deadline``: seconds to wait for the answer of a call that became a
        message (instead of the response timeout): then ``GrainCallTimeoutError``,
        and the message expires with it. A tick run inline is the grain's own
        work here and is not cut short.

        Any other call to an activation that is here, valid and idle runs as a
        turn in the calling task too (``Activation.enter_inline``): no message,
        no response future, no turn task. Cancelling the caller cancels that
        turn; otherwise the caller cannot tell it from a queued call.

        Immutable arguments (``runtime.immutable``) are not encoded here: a local
        activation gets them as they are, and ``_send_to`` encodes them only if
        the call leaves the process. Anything mutable is copied through the codec.
        """
        if method == _TICK_METHOD and not reminder_tick:
            # Refused here too, not only in ``route``: a local call may run inline
            # and never become a message.
            raise MessageRejectedError(_FORGED_TICK.format(gid=grain_id))
        act = self._activations.get(grain_id)
        # The grain is here and idle: the call runs as a turn in this task (no
        # message, response or turn task).
        if not one_way and (act is not None or self._local_only):
            if not self._inline_streak:
                # A caller awaiting local grains back to back, none of which
                # suspends, would never yield: every _INLINE_STREAK-th inline call
                # yields to the loop first (the activation is checked after).
                self._inline_streak = _INLINE_STREAK
                await asyncio.sleep(0)
                act = self._activations.get(grain_id)
            if act is None:
                # An embedded silo places every grain here: one whose activation
                # cannot wait (``activates_at_once``) is made valid right now, so
                # the call that causes it runs inline like any other (a cold
                # start of many grains costs no task or loop iteration each).
                act = self._activate_here(grain_id, method)
        if act is not None and not one_way:
            if reminder_tick:
                task = task_of_loop(self._loop)
                if task is None:
                    self._loop = asyncio.get_running_loop()
                    task = task_of_loop(self._loop)
                bound = None if kwargs or task is None else act.enter_inline(method, task)
                if bound is not None:
                    # The tick is the turn, in this task: no inline deadline (it
                    # is the grain's own work), and the grain's exception
                    # propagates as it is (the reminder service records it).
                    self._inline_streak -= 1
                    metrics = self.grain_metrics
                    timed = metrics.records
                    if timed:
                        began = time.perf_counter()
                    try:
                        tick = run_tick(
                            bound, act.definition, self.service_id, grain_id, args, self.clock
                        )
                        if self.tracing is None:
                            result = await tick
                        else:
                            with self.tracing.inline(grain_id, method, self.address):
                                result = await tick
                    except BaseException as exc:
                        act.exit_inline(exc)
                        if timed:
                            elapsed = time.perf_counter() - began
                            metrics.call(act.definition.type_name, elapsed, True, method)
                        raise
                    act.exit_inline(None)
                    if timed:
                        elapsed = time.perf_counter() - began
                        metrics.call(act.definition.type_name, elapsed, False, method)
                    return result
            else:
                # What the caller sees is what a queued call would give it:
                # mutable arguments and results are copied through the codec, an
                # exception comes back as ``result_of`` would rebuild it, and the
                # response timeout raises GrainCallTimeoutError (it cancels the
                # turn, which runs in this task; runtime.inline).
                call_args: tuple[Any, ...] | list[Any] = args
                call_kwargs = kwargs
                # all_immutable(args, kwargs), with the common arguments (in-range
                # ints, the scalars) decided here without a call.
                for value in args:
                    cls = type(value)
                    if cls is int:
                        if INT_MIN <= value < INT_END:
                            continue
                    elif cls in SCALARS:
                        continue
                    if not all_immutable(args, kwargs):
                        call_args, call_kwargs = self.codec.decode(
                            self.codec.encode((args, kwargs))
                        )
                    break
                else:
                    if kwargs and not all_immutable((), kwargs):
                        call_args, call_kwargs = self.codec.decode(
                            self.codec.encode((args, kwargs))
                        )
                # The caller's task, from the loop this silo runs in, cached: on
                # 3.11 asking for the running loop costs a getpid() system call,
                # a tenth of a local call. A stale loop is not running, so it
                # gives no task: then the running loop is asked.
                task = task_of_loop(self._loop)
                if task is None:
                    self._loop = asyncio.get_running_loop()
                    task = task_of_loop(self._loop)
                bound = None if task is None else act.enter_inline(method, task)
                if bound is not None:
                    assert task is not None
                    if self.tracing is not None:
                        bound = self._served_inline(self.tracing, bound, grain_id, method)
                    self._inline_streak -= 1
                    # InlineDeadlines.begin, without the call: only a task's
                    # outermost inline call is tracked.
                    deadlines = self._inline_deadlines
                    started = deadlines.started
                    outermost = task not in started
                    if outermost:
                        started[task] = deadlines.epoch
                        if not deadlines.sweeping:
                            deadlines.arm()
                    metrics = self.grain_metrics
                    timed = metrics.records
                    if timed:
                        began = time.perf_counter()
                    try:
                        if call_kwargs:
                            result = await bound(*call_args, **call_kwargs)
                        else:
                            result = await bound(*call_args)
                    except asyncio.CancelledError as exc:
                        act.exit_inline(exc)
                        if timed:
                            metrics.call(
                                act.definition.type_name, time.perf_counter() - began, True, method
                            )
                        if deadlines.timed_out(task, outermost):
                            raise GrainCallTimeoutError(
                                f"{grain_id}.{method}: no response within "
                                f"{self._response_timeout:g}s"
                            ) from None
                        raise
                    except Exception as exc:
                        act.exit_inline(exc)
                        if timed:
                            metrics.call(
                                act.definition.type_name, time.perf_counter() - began, True, method
                            )
                        raise rebuild_error(error_payload(exc)) from None
                    finally:
                        if outermost:
                            del started[task]
                    act.exit_inline(None)
                    if timed:
                        metrics.call(
                            act.definition.type_name, time.perf_counter() - began, False, method
                        )
                    # result_immutable(result), the common results decided here.
                    cls = type(result)
                    if cls is int:
                        if INT_MIN <= result < INT_END:
                            return result
                    elif cls in SCALARS or result_immutable(result):
                        return result
                    return self.codec.decode(self.codec.encode(result))
        # A tick's arguments are the reminder's name and a TickStatus, both
        # immutable by construction: no need to walk them.
        local = reminder_tick or all_immutable(args, kwargs)
        timeout_ms = self._response_timeout_ms if deadline is None else int(deadline * 1000)
        msg = Message.request(
            grain_id,
            method,
            b"" if local else self.codec.encode((args, kwargs)),
            one_way=one_way,
            expires_at_ms=self.clock.now_ms() + timeout_ms,
            sender_silo=self.address,
        )
        if local:
            msg.local_args = (args, kwargs)
        if reminder_tick:
            msg.headers[TICK_HEADER] = "1"
        chain = current_chain.get()
        if chain:
            msg.headers[CHAIN_HEADER] = encode_chain(chain)
        if grain_id.type_name.startswith(SYSTEM_TYPE_PREFIX):
            # Who a runtime grain's call acts for travels with it (the audit log).
            msg.headers[PRINCIPAL_HEADER] = acting_principal.get() or LOCAL
        if self.tracing is not None:
            # The caller's span; its context travels in the message.
            with self.tracing.call(grain_id, method):
                self.tracing.inject(msg.headers)
                return await self._send(msg, method, one_way, reminder_tick, deadline)
        return await self._send(msg, method, one_way, reminder_tick, deadline)

    async def _send(
        self,
        msg: Message,
        method: str,
        one_way: bool,
        reminder_tick: bool,
        deadline: float | None,
    ) -> Any:
        """Route a request made by ``invoke`` and wait for its result (``deadline``:
        ``invoke``'s); ``None`` at once for a one-way message."""
        grain_id = msg.target_grain
        assert grain_id is not None
        route = self.route_reminder_tick if reminder_tick else self.route
        if one_way:
            route(msg)
            return None
        fut = self._pending.add(msg.id, grain_id, method)
        try:
            route(msg)
            if deadline is None:
                response = await fut
            else:
                try:
                    async with asyncio.timeout(deadline):
                        response = await fut
                except TimeoutError:
                    if fut.cancelled() or not fut.done():
                        raise GrainCallTimeoutError(
                            f"{grain_id}.{method}: no answer within {deadline:g} s"
                        ) from None
                    # The answer landed as the deadline passed (the timer fired
                    # after it, before this task's turn): the call was made and
                    # answered, so its answer counts (a TimeoutError the callee
                    # raised comes back out of ``result_of`` as itself).
                    response = fut.result()
        finally:
            self._pending.discard(msg.id)
        return result_of(response, self.codec)

    # -- the outbox (runtime.outbox.OutboxPort) ------------------------------------------

    async def send_outbox_call(
        self, grain_id: GrainId, method: str, args: list[Any], message_id: str
    ) -> None:
        """A call an outbox queued: always a message (never inline), carrying its
        id in ``OUTBOX_HEADER``, answered within the response timeout."""
        msg = Message.request(
            grain_id,
            method,
            self.codec.encode((tuple(args), {})),
            one_way=False,
            expires_at_ms=self.clock.now_ms() + self._response_timeout_ms,
            sender_silo=self.address,
        )
        msg.headers[OUTBOX_HEADER] = message_id
        fut = self._pending.add(msg.id, grain_id, method)
        try:
            self.route(msg)
            response = await fut
        finally:
            self._pending.discard(msg.id)
        result_of(response, self.codec)

    async def outbox_publish(self, stream: str, event: OutboxEvent) -> None:
        """Publish an outbox's stream item with this silo's stream provider."""
        if self.streams is None:
            raise ClosedError("this silo has no stream provider yet")
        await self.streams.publish(stream, event)

    def _served_inline(
        self, tracer: Tracer, bound: Callable[..., Any], grain_id: GrainId, method: str
    ) -> Callable[..., Any]:
        """``bound`` (a method entered inline) inside the call's one span, a child
        of the span current in this task."""
        silo = self.address

        async def served(*args: Any, **kwargs: Any) -> Any:
            with tracer.inline(grain_id, method, silo):
                return await bound(*args, **kwargs)

        return served

    def _activate_here(self, grain_id: GrainId, method: str) -> Activation | None:
        """The new activation of ``grain_id`` on this embedded silo, if its type
        is hosted, ``method`` callable, and nothing in activating it can wait;
        otherwise ``None`` (the call takes the message path: ``route``
        validates it and starts an activation that waits for its task)."""
        defn = self._types.get(grain_id.type_name)
        if defn is None or method not in defn.methods or not activates_at_once(defn):
            return None
        return self.catalog.get_or_create(grain_id, defn)

    # -- routing ------------------------------------------------------------------------

    def route(self, msg: Message) -> None:
        """Deliver a request or one-way message locally, or send it where it belongs."""
        gid = msg.target_grain
        if gid is None:
            self._reject(msg, MessageRejectedError("message without a target grain"))
            return
        if msg.method == _TICK_METHOD and not _is_tick(msg):
            self._reject(msg, MessageRejectedError(_FORGED_TICK.format(gid=gid)))
            return
        defn = self._types.get(gid.type_name)
        if defn is None:
            self._route_elsewhere(msg, gid)
            return
        if msg.method not in defn.methods:
            self._reject_method(msg, gid)
            return
        act = self.catalog.get(gid)
        if act is not None:
            act.enqueue(msg)
            return
        if _is_here(msg.target_silo, self.address) or self._local_only:
            self.catalog.get_or_create(gid, defn).enqueue(msg)
            return
        self._send_where_it_lives(msg, gid, defn)

    def _route_elsewhere(self, msg: Message, gid: GrainId) -> None:
        """A grain type this silo does not host: in a cluster, send the call to
        a silo that does (placement only considers those)."""
        if self._local_only or _is_here(msg.target_silo, self.address):
            self._reject(
                msg,
                UnknownGrainTypeError.known(
                    f"this silo hosts no grain type {gid.type_name!r}", self._types
                ),
            )
            return
        # The class may be imported here without being hosted: then its
        # placement is known and a bad method fails without a round trip.
        try:
            known: GrainDefinition | None = lookup_definition(gid.type_name)
        except UnknownGrainTypeError:
            known = None
        if known is not None and msg.method not in known.methods:
            self._reject_method(msg, gid)
            return
        self._send_where_it_lives(msg, gid, known)

    def _send_where_it_lives(
        self, msg: Message, gid: GrainId, defn: GrainDefinition | None
    ) -> None:
        # The directory cache answers without I/O; otherwise locate (directory
        # lookup, then placement) in the background and send when known.
        silo = self._locator.cached(gid)
        if silo is not None:
            self._send_to(silo, msg)
        else:
            self._spawn(self._locate_and_send(msg, defn))

    def _reject_method(self, msg: Message, gid: GrainId) -> None:
        self._reject(
            msg,
            GrainMethodNotFoundError(
                f"{gid.type_name} has no callable method {msg.method!r}; "
                "only public async methods can be called"
            ),
        )

    def route_reminder_tick(self, msg: Message) -> None:
        """Route a reminder tick this silo's reminder service delivers.

        Reminder-affine placement: a grain with no activation anywhere is
        activated here, on the silo that owns the reminder, so its ticks stay
        local; an activation elsewhere keeps receiving them. A class declared
        with ``reminder_affinity=False`` is placed by its strategy as usual.
        """
        gid = msg.target_grain
        defn = None if gid is None else self._types.get(gid.type_name)
        if (
            gid is None
            or defn is None
            or self._local_only
            or not defn.reminder_affinity
            or msg.method not in defn.methods
            or self.catalog.get(gid) is not None
            or self._locator.cached(gid) is not None
        ):
            self.route(msg)
            return
        self._spawn(self._locate_and_send(msg, defn, prefer=self.address))

    async def _locate_and_send(
        self, msg: Message, defn: GrainDefinition | None, prefer: SiloAddress | None = None
    ) -> None:
        assert msg.target_grain is not None
        if msg.expires_at_ms:
            # The directory lookup may wait out a failover until the call
            # expires, no longer (``_retry.within``; this is the task's own).
            within((msg.expires_at_ms - self.clock.now_ms()) / 1000)
        try:
            silo = await self._locator.locate(msg.target_grain, defn, prefer)
        except Exception as exc:
            self._reject(msg, exc)
            return
        self._send_to(silo, msg)

    def _send_to(self, silo: SiloAddress, msg: Message) -> None:
        msg.target_silo = silo
        if _is_here(silo, self.address):
            self.route(msg)
        elif self._transport is None:
            self._reject(msg, MessageRejectedError(f"no transport to reach {silo}"))
        else:
            local = msg.local_args
            if local is not None:
                # Leaving the process: the fast path's arguments get their wire form.
                msg.body = self.codec.encode(local)
                msg.local_args = None
            if msg.kind is MessageKind.REQUEST and _is_here(msg.sender_silo, self.address):
                self._remember(msg)
            self._transport.send(silo, msg)

    # -- sent requests ------------------------------------------------------------------

    def _remember(self, msg: Message) -> None:
        # One dict operation per call on the hot path; which silo a request
        # went to is read from the message itself when a connection is lost.
        sent = self._sent
        sent[msg.sender_client, msg.id] = msg
        if len(sent) >= self._sent_sweep_at:
            self._sweep_sent()

    def _sweep_sent(self) -> None:
        # Calls whose caller has given up (expired, or timed out here) and which
        # were never answered; without this a silo that swallows requests would
        # grow it.
        now = self.clock.now_ms()
        for key, msg in list(self._sent.items()):
            if not msg.expires_at_ms or msg.expires_at_ms < now:
                del self._sent[key]
        self._sent_sweep_at = max(1024, 2 * len(self._sent))

    def _forget_sent(self, key: _SentKey) -> Message | None:
        return self._sent.pop(key, None)

    def connection_lost(self, silo: SiloAddress, error: Exception) -> None:
        """The link to ``silo`` broke (or it was declared dead): every request
        written to it and not answered fails now with ``SiloUnavailableError``,
        and the grains' cached locations are dropped. Reminder ticks wait for
        the membership verdict and go to the new activation if ``silo`` is gone."""
        keys = [key for key, msg in self._sent.items() if msg.target_silo == silo]
        if not keys:
            return
        failure = SiloUnavailableError(f"silo {silo} was lost with the call in flight: {error}")
        ticks: list[Message] = []
        for key in keys:
            msg = self._sent.pop(key)
            if msg.target_grain is not None:
                self._locator.invalidate(msg.target_grain)
            if _is_tick(msg):
                ticks.append(msg)
            else:
                self._fail(msg, failure)
        log.info(
            "connection lost silo=%s failed=%d ticks_waiting=%d",
            silo,
            len(keys) - len(ticks),
            len(ticks),
        )
        if ticks:
            self._spawn(self._resend_when_gone(silo, ticks, failure))

    async def _resend_when_gone(
        self, silo: SiloAddress, ticks: list[Message], failure: Exception
    ) -> None:
        """Send reminder ticks again once ``silo`` is known to be gone; fail them
        if their caller's deadline comes first (the silo may be alive after all,
        and then the tick may have run: at least once, never blindly twice)."""
        while True:
            try:
                gone = await self._locator.silo_unreachable(silo)
            except Exception as exc:
                log.warning("membership check failed silo=%s error=%r", silo, exc)
                gone = False
            live = [
                m for m in ticks if not m.expires_at_ms or m.expires_at_ms > self.clock.now_ms()
            ]
            if gone:
                log.info("silo gone; reminder ticks sent again silo=%s ticks=%d", silo, len(live))
                for msg in live:
                    msg.forward_count += 1
                    self.reroute(msg)
                return
            if not live:
                for msg in ticks:
                    self._fail(msg, failure)
                return
            await asyncio.sleep(_VERDICT_POLL)

    def reroute(self, message: Message) -> None:
        """Route again from scratch (the activation it reached went away)."""
        if message.target_grain is not None:
            self._locator.invalidate(message.target_grain)
        message.target_silo = None
        self.route(message)

    def forward(self, message: Message, to: ActivationAddress) -> None:
        """Send a message on to the activation that won the directory race."""
        message.forward_count += 1
        if message.forward_count > self._max_forwards:
            self._reject(
                message,
                MessageRejectedError(
                    f"{message.target_grain}: forwarded "
                    f"{message.forward_count - 1} times; giving up"
                ),
            )
            return
        self._send_to(to.silo, message)

    def _reject(self, msg: Message, exc: Exception) -> None:
        if msg.kind is MessageKind.REQUEST:
            body = self.codec.encode(error_payload(exc))
            self.send_response(msg.response(ResponseStatus.REJECTED, body))
        else:
            self._dropped_unlogged += 1
            now = time.monotonic()
            if now - self._drop_logged_at >= _DROP_LOG_EVERY_S:
                log.warning(
                    "dropped one-way message id=%d reason=%r dropped_since_last_line=%d",
                    msg.id,
                    exc,
                    self._dropped_unlogged,
                )
                self._dropped_unlogged = 0
                self._drop_logged_at = now
            settle(msg)

    # -- responses ----------------------------------------------------------------------

    def send_response(self, response: Message) -> None:
        target = response.target_silo
        if target is None or _is_here(target, self.address):
            if response.sender_client is not None and self._transport is not None:
                self._transport.send_to_client(response.sender_client, response)
            else:
                self._complete(response)
        elif self._transport is not None:
            self._transport.send(target, response)

    def _complete(self, response: Message) -> None:
        self._pending.resolve(response.correlation_id, response)

    # -- MessageSink --------------------------------------------------------------------

    def receive(self, message: Message) -> None:
        """A message from the network (another silo, or a client via the gateway)."""
        if message.kind is MessageKind.RESPONSE:
            if self._sent:
                sent = self._forget_sent((message.sender_client, message.correlation_id))
                if (
                    sent is not None
                    and message.status is ResponseStatus.REJECTED
                    and self._restarted(message)
                ):
                    # The target was an earlier incarnation; the call never ran.
                    self._retry_restarted(sent)
                    return
            if message.sender_client is None and message.target_silo is self.address:
                self._complete(message)  # the common case: an answer to a call from here
            else:
                self.send_response(message)
            return
        if message.sender_client is not None:
            if message.sender_silo is None:
                message.sender_silo = self.address
            if not self._client_management and _is_management_change(message):
                self._reject(
                    message,
                    MessageRejectedError(
                        f"{message.method} of the reminder management grain is not allowed "
                        "from clients of this cluster: set a cluster secret or TLS, or "
                        "SiloOptions(allow_client_management=True)"
                    ),
                )
                return
        if message.expires_at_ms and message.expires_at_ms < self.clock.now_ms():
            log.debug("dropped expired message id=%d", message.id)
            settle(message)
            return
        sender = message.sender_silo
        if message.sender_client is None and (sender is None or not self._locator.knows(sender)):
            # Answers go only to members of the table: an address named in a
            # request is never dialled on its word alone.
            if self._strangers >= _MAX_STRANGERS:
                log.debug("dropped message from an unknown silo id=%d", message.id)
                settle(message)
                return
            self._strangers += 1
            self._spawn(self._route_from_stranger(message))
            return
        self.route(message)

    async def _route_from_stranger(self, message: Message) -> None:
        sender = message.sender_silo
        try:
            known = sender is not None and await self._locator.learn(sender)
        finally:
            self._strangers -= 1
        if known:
            self.route(message)
        else:
            log.warning(
                "dropped message from a silo not in the membership table id=%d sender=%s",
                message.id,
                sender,
            )
            settle(message)

    def _restarted(self, response: Message) -> bool:
        try:
            payload = self.codec.decode(response.body)
        except Exception:
            return False
        return isinstance(payload, dict) and payload.get("type") == _RESTARTED

    def _retry_restarted(self, message: Message) -> None:
        target = message.target_silo
        if target is None or message.forward_count >= self._max_forwards:
            self._fail(message, SiloRestartedError(f"{target} restarted; giving up"))
            return
        self._spawn(
            self._retry_elsewhere(message, target, SiloRestartedError(f"{target} restarted"))
        )

    def undeliverable(self, message: Message, error: Exception) -> None:
        """The transport could not deliver: route again if the target silo turns out
        to be gone, else fail the call; responses are dropped."""
        if self._sent and message.kind is not MessageKind.RESPONSE:
            self._forget_sent((message.sender_client, message.id))
        if message.target_grain is not None:
            self._locator.invalidate(message.target_grain)
        target = message.target_silo
        if (
            message.kind is not MessageKind.RESPONSE
            and isinstance(error, SiloUnavailableError)
            and target is not None
            and message.forward_count < self._max_forwards
        ):
            self._spawn(self._retry_elsewhere(message, target, error))
            return
        self._fail(message, error)

    async def _retry_elsewhere(
        self, message: Message, target: SiloAddress, error: Exception
    ) -> None:
        try:
            gone = await self._locator.silo_unreachable(target)
        except Exception as exc:
            log.warning("membership check failed silo=%s error=%r", target, exc)
            gone = False
        if gone:
            message.forward_count += 1
            self.reroute(message)
        elif _is_tick(message):
            await self._resend_when_gone(target, [message], error)
        else:
            self._fail(message, error)

    def _fail(self, message: Message, error: Exception) -> None:
        if message.kind is MessageKind.REQUEST:
            body = self.codec.encode(error_payload(error))
            self.send_response(message.response(ResponseStatus.REJECTED, body))
        else:
            log.debug(
                "undeliverable message id=%d kind=%s error=%r", message.id, message.kind, error
            )
            settle(message)

    # -- ActivationHost -----------------------------------------------------------------

    async def register_activation(self, activation: Activation) -> ActivationAddress | None:
        if self._local_only:
            return None
        from orleanspy.directory.table import ActivationAddress

        gid = activation.grain_id
        mine = ActivationAddress(self.address, activation.activation_id)
        winner = await self._locator.register(gid, mine)
        if (
            winner is not None
            and _is_here(winner.silo, self.address)
            and self.catalog.get(gid) is activation
        ):
            # The directory names an activation of this silo that it no longer
            # has: one whose end could not be unregistered (the store was away
            # when it ended; ``activation_ended`` retries, but a call may come
            # first). Only this silo can know that, so it clears the entry and
            # claims once more; left alone, every call to the grain would be
            # forwarded here, to itself, until it gave up.
            log.info("stale directory entry of this silo cleared grain=%s entry=%s", gid, winner)
            await self._locator.unregister(gid, winner)
            winner = await self._locator.register(gid, mine)
        return winner

    async def activation_ended(self, activation: Activation) -> None:
        self.catalog.remove(activation)
        if self._local_only:
            return
        from orleanspy.directory.table import ActivationAddress

        address = ActivationAddress(self.address, activation.activation_id)
        try:
            await self._locator.unregister(activation.grain_id, address)
        except Exception as exc:
            log.warning(
                "directory unregister failed; trying again in the background grain=%s error=%r",
                activation.grain_id,
                exc,
            )
            self._spawn(self._unregister_later(activation.grain_id, address))

    async def _unregister_later(self, gid: GrainId, address: ActivationAddress) -> None:
        """Remove the entry of an activation that has ended, once the store
        answers (a compare-and-delete: a newer activation's entry stays). Until
        then, calls the entry sends here find no activation and a new one
        clears it (``register_activation``)."""
        for _ in range(_UNREGISTER_ATTEMPTS):
            await asyncio.sleep(_UNREGISTER_RETRY_S)
            try:
                await self._locator.unregister(gid, address)
                return
            except Exception as exc:
                error = exc
        log.warning("directory unregister gave up grain=%s error=%r", gid, error)

    # -- housekeeping -------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self, exc: Exception) -> None:
        """Fail every call still waiting and stop the timeout sweeper (silo stopped)."""
        await self._pending.close(exc)
        await self._inline_deadlines.close()


def _is_management_change(msg: Message) -> bool:
    """A call to the reminder management grain other than a read."""
    gid = msg.target_grain
    return (
        gid is not None and gid.type_name == MANAGEMENT_TYPE and msg.method not in _MANAGEMENT_READS
    )


def _is_tick(msg: Message) -> bool:
    """A reminder tick sent by a silo's reminder service: the tick header, which
    only ``invoke(reminder_tick=True)`` sets, and no client sender (the gateway
    stamps a client's calls with its id, whatever their headers say)."""
    return (
        msg.method == _TICK_METHOD
        and msg.sender_client is None
        and msg.headers.get(TICK_HEADER) == "1"
    )


def _is_here(silo: SiloAddress | None, here: SiloAddress) -> bool:
    # Asked several times per call: the identity test settles nearly every
    # case (parsed addresses are interned, see ``SiloAddress.parse``) without a
    # call to ``SiloAddress.__eq__``.
    return silo is here or (silo is not None and silo == here)


def _this_release() -> int:
    """The feature level of a silo that is its own cluster (embedded)."""
    return PROTOCOL
