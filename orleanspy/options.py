"""Options: frozen, validated dataclasses with ``timedelta`` durations.

A duration may also be given as a number of seconds, as the reminder API takes
them (``ReminderOptions(poll_interval=10)``); it is stored as a ``timedelta``.
A bad value fails at construction with a ``ConfigurationError`` (a
``ValueError``) that names the field and says how to fix it, a value of the
wrong type too (``SiloOptions(gateway_port="30000")``). Defaults follow Orleans
where Orleans has one (REFERENCE.md).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from orleanspy.errors import ConfigurationError
from orleanspy.schemes import KINDS, backend_of, schemes_for

__all__ = [
    "MembershipOptions",
    "MessagingOptions",
    "ReminderOptions",
    "SiloOptions",
    "TlsOptions",
    "dashboard_exposure_error",
    "is_loopback",
]


def _positive(owner: object, name: str) -> None:
    value = getattr(owner, name)
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise ConfigurationError(f"{type(owner).__name__}.{name} must be > 0, got {value}")
    elif value <= 0:
        raise ConfigurationError(f"{type(owner).__name__}.{name} must be > 0, got {value!r}")


def _durations(owner: object, *names: str, allow_zero: bool = False) -> None:
    """Check ``names`` are positive durations (or zero, with ``allow_zero``); a
    number of seconds becomes the ``timedelta`` it means (written past the
    frozen dataclass, once, here)."""
    for name in names:
        value = getattr(owner, name)
        if not isinstance(value, timedelta):
            value = _as_duration(owner, name, value)
            object.__setattr__(owner, name, value)
        if not allow_zero:
            _positive(owner, name)
        elif value < timedelta(0):
            raise ConfigurationError(f"{type(owner).__name__}.{name} must be >= 0, got {value}")


def _as_duration(owner: object, name: str, value: object) -> timedelta:
    what = f"{type(owner).__name__}.{name}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{what} must be a datetime.timedelta or a number of seconds, "
            f"got {type(value).__name__} {value!r}"
        )
    if not math.isfinite(value):
        raise ConfigurationError(f"{what} must be a finite number of seconds, got {value!r}")
    try:
        return timedelta(seconds=value)
    except OverflowError:
        raise ConfigurationError(f"{what} of {value!r} seconds is too large") from None


_PLAIN_TYPES: dict[type, dict[str, tuple[type, ...]]] = {}


def _plain_types(cls: type) -> dict[str, tuple[type, ...]]:
    """Each field of ``cls`` whose annotation is a class or a union of classes
    (``int | None``), with those classes. Fields of a generic type
    (``Mapping[str, Any]``) are left to their own checks."""
    cached = _PLAIN_TYPES.get(cls)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls)
    found: dict[str, tuple[type, ...]] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        members = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if all(isinstance(m, type) and not typing.get_args(m) for m in members):
            found[f.name] = tuple(members)
    _PLAIN_TYPES[cls] = found
    return found


def _check_types(owner: object) -> None:
    """``ConfigurationError`` naming the field for a value of the wrong type
    (``bool`` is no ``int`` here, an ``int`` is a ``float``)."""
    for name, allowed in _plain_types(type(owner)).items():
        value = getattr(owner, name)
        if isinstance(value, bool) and bool not in allowed:
            ok = False
        elif isinstance(value, int) and float in allowed:
            ok = True
        else:
            ok = isinstance(value, allowed)
        if not ok:
            wanted = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
            shown = "" if "secret" in name else f" {value!r}"
            raise ConfigurationError(
                f"{type(owner).__name__}.{name} must be {wanted}, got {type(value).__name__}{shown}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class TlsOptions:
    """TLS for silo-to-silo and client-to-gateway gRPC (PEM file paths).

    ``ca_file`` verifies the peer; both sides present ``cert_file``/``key_file``.
    """

    cert_file: str
    key_file: str
    ca_file: str
    server_name: str | None = None

    def __post_init__(self) -> None:
        _check_types(self)
        for name in ("cert_file", "key_file", "ca_file"):
            path = getattr(self, name)
            if not os.path.isfile(path):
                raise ConfigurationError(f"TlsOptions.{name}: no such file {path!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class MessagingOptions:
    """Calls and the wire.

    ``response_timeout``: how long a caller waits for a response (Orleans: 30 s).
    ``max_message_size``: larger envelopes are refused with an error response.
    ``max_forward_count``: how often a message may chase a moved activation.
    ``max_batch``: most envelopes per stream frame. Small enough that two or more
    frames are in flight, so both ends of a busy link work at once; large
    enough to spread gRPC's per-frame cost (docs/decisions.md has the figures).
    ``cluster_secret``: when set, every silo-to-silo and client-to-gateway
    connection must present it or is refused.

    Decoding bodies off the wire is bounded (a breach fails that call with
    ``SerializationError``): ``max_nesting_depth`` lists/maps nested in one
    msgpack document, ``max_extension_depth`` registered dataclasses nested in
    one another, ``max_container_length`` items in one list or map,
    ``max_string_length`` bytes in one string, binary or extension value
    (``None``: ``max_message_size``).
    ``max_in_flight``: requests one gateway client or one peer silo may have
    unanswered, and one-way messages whose turn has not run; beyond it a
    client's stream is not read until answers go out, so gRPC flow control
    pushes back on the sender (a peer's excess is refused instead).
    ``max_frame_items``: envelopes plus header entries one stream frame may
    hold; a frame with more ends its stream before it is decoded. With
    ``max_message_size`` it bounds what one connection holds decoded at a time.
    At least ``2 * max_batch``; a sender cuts its own frames to this many items
    too (envelopes carry up to five header entries: call chain, tick, trace
    context, principal), so peers with the same setting never refuse them.
    """

    response_timeout: timedelta = timedelta(seconds=30)
    max_message_size: int = 4 * 1024 * 1024
    max_forward_count: int = 2
    max_batch: int = 32
    cluster_secret: str | None = None
    tls: TlsOptions | None = None
    max_nesting_depth: int = 100
    max_extension_depth: int = 16
    max_container_length: int = 1_000_000
    max_string_length: int | None = None
    max_in_flight: int = 10_000
    max_frame_items: int = 10_000

    if TYPE_CHECKING:
        # What a type checker sees of the generated __init__: durations also take
        # numbers of seconds (``__post_init__`` makes them timedeltas).
        def __init__(
            self,
            *,
            response_timeout: timedelta | float = ...,
            max_message_size: int = ...,
            max_forward_count: int = ...,
            max_batch: int = ...,
            cluster_secret: str | None = ...,
            tls: TlsOptions | None = ...,
            max_nesting_depth: int = ...,
            max_extension_depth: int = ...,
            max_container_length: int = ...,
            max_string_length: int | None = ...,
            max_in_flight: int = ...,
            max_frame_items: int = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        _durations(self, "response_timeout")
        _check_types(self)
        _positive(self, "max_message_size")
        _positive(self, "max_batch")
        for name in (
            "max_nesting_depth",
            "max_extension_depth",
            "max_container_length",
            "max_in_flight",
            "max_frame_items",
        ):
            _positive(self, name)
        if self.max_frame_items < 2 * self.max_batch:
            raise ConfigurationError(
                "MessagingOptions.max_frame_items must be at least 2 * max_batch "
                f"({2 * self.max_batch}): peers would refuse this silo's own frames"
            )
        if self.max_string_length is not None:
            _positive(self, "max_string_length")
        if self.max_forward_count < 0:
            raise ConfigurationError("MessagingOptions.max_forward_count must be >= 0")
        if self.cluster_secret is not None and not self.cluster_secret:
            raise ConfigurationError("MessagingOptions.cluster_secret must be non-empty or None")


@dataclass(frozen=True, kw_only=True, slots=True)
class MembershipOptions:
    """Failure detection, with Orleans' defaults (short values in tests).

    Every ``probe_interval`` a silo probes up to ``num_probed_silos`` peers; a peer
    that misses ``num_missed_probes_limit`` probes in a row (each waits
    ``probe_timeout``) is suspected and voted on; a peer whose port refuses the
    connection is voted on at once. ``num_votes_for_death_declaration`` fresh
    votes (younger than ``death_vote_expiration``) declare it Dead; the votes
    needed are ``min(that, (active + 1) // 2)``. Every ``table_refresh_interval``
    a silo re-reads the table, so it learns of its own Dead verdict within that
    even when no gossip reaches it.

    Defaults (docs/decisions.md, "Failure detection defaults"): probes every
    1 s with a 2 s timeout, where Orleans has 5 s and 5 s, and a table read
    every 2 s, where Orleans has 60 s: a killed process is declared Dead in
    about a second, a silent host in about 9 s, and a silo learns its own
    verdict within 2 s.

    ``balanced_ring`` picks the ring that splits the hash space between the
    Active silos; unset (the default), a silo builds the ring the cluster
    builds; set, it insists, and refuses to join a cluster on the other ring
    (docs/decisions.md, "A silo follows the cluster's ring unless told").
    """

    probe_interval: timedelta = timedelta(seconds=1)
    probe_timeout: timedelta = timedelta(seconds=2)
    num_missed_probes_limit: int = 3
    num_probed_silos: int = 10
    num_votes_for_death_declaration: int = 2
    death_vote_expiration: timedelta = timedelta(minutes=2)
    i_am_alive_interval: timedelta = timedelta(seconds=30)
    table_refresh_interval: timedelta = timedelta(seconds=2)
    i_am_alive_staleness: timedelta = timedelta(minutes=10)
    defunct_silo_expiration: timedelta = timedelta(days=7)
    defunct_silo_cleanup_interval: timedelta = timedelta(hours=1)
    shutdown_timeout: timedelta = timedelta(seconds=30)
    #: Move the ring's hashed points until every Active silo owns its fair share
    #: (``orleanspy.ring``): the busiest silo within 1.001x fair at p90 at 2-10
    #: silos, where the hashed points alone leave it 1.2-1.5x. The price: a join
    #: or leave moves a median 1.1-1.4x the minimal 1/N, some of it between silos
    #: that stay. ``False`` keeps the hashed ring, whose join moves hashes only
    #: to the joiner and a leave only from the leaver. Every silo of a cluster
    #: builds the same ring. ``None`` (the default) follows the cluster: the
    #: ring of the Active silos that insist on one (every 0.1.x silo does, on
    #: its own setting), else the balanced one; so a new silo joins an older
    #: cluster on either ring, and the balanced ring switches on once the last
    #: silo that insists on the hashed one has left (``membership.agreement``).
    #: ``True`` or ``False`` insists: a silo whose setting differs from the live
    #: members' refuses to start before it writes anything.
    balanced_ring: bool | None = None

    if TYPE_CHECKING:
        # What a type checker sees of the generated __init__: durations also take
        # numbers of seconds (``__post_init__`` makes them timedeltas).
        def __init__(
            self,
            *,
            probe_interval: timedelta | float = ...,
            probe_timeout: timedelta | float = ...,
            num_missed_probes_limit: int = ...,
            num_probed_silos: int = ...,
            num_votes_for_death_declaration: int = ...,
            death_vote_expiration: timedelta | float = ...,
            i_am_alive_interval: timedelta | float = ...,
            table_refresh_interval: timedelta | float = ...,
            i_am_alive_staleness: timedelta | float = ...,
            defunct_silo_expiration: timedelta | float = ...,
            defunct_silo_cleanup_interval: timedelta | float = ...,
            shutdown_timeout: timedelta | float = ...,
            balanced_ring: bool | None = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        _durations(
            self,
            "probe_interval",
            "probe_timeout",
            "death_vote_expiration",
            "i_am_alive_interval",
            "table_refresh_interval",
            "i_am_alive_staleness",
            "defunct_silo_expiration",
            "defunct_silo_cleanup_interval",
            "shutdown_timeout",
        )
        _check_types(self)
        _positive(self, "num_missed_probes_limit")
        _positive(self, "num_probed_silos")
        _positive(self, "num_votes_for_death_declaration")


#: The missed-tick grace of rows without one of their own, unless
#: ``ReminderOptions.missed_tick_grace`` says otherwise.
DEFAULT_MISSED_TICK_GRACE = timedelta(seconds=10)


def _default_permits() -> int:
    return (os.cpu_count() or 1) * 4


@dataclass(frozen=True, kw_only=True, slots=True)
class ReminderOptions:
    """The adaptive reminder service (docs/architecture.md, section 2).

    ``look_ahead``: rows due within this window are loaded into the heap.
    ``poll_interval``: the safety-net refill when no change notification came.
    ``missed_tick_grace``: a tick reached later than this after its slot is missed,
    for rows without a ``grace`` of their own (``None`` means
    ``DEFAULT_MISSED_TICK_GRACE``, 10 s: longer than a fail-over or a GC pause,
    short enough that a tick an hour late is not taken for an on-time one; it
    no longer follows ``poll_interval``). Whatever the grace, several passed
    slots of one row get at most one delivery (the missed-tick rule).
    ``tick_timeout``: the longest a tick's grain call may take before its
    delivery permit is given back and the tick retried later (a row's own
    deadline is its period, within ``minimum_tick_timeout`` ..
    ``tick_timeout``, and never more than half the messaging response timeout).
    ``look_ahead`` must be at least twice
    ``poll_interval`` so a poll always sees rows before they fall due.
    ``history_size``: fire records kept per row in the table (``0``: none).
    ``catch_up_rate``, ``catch_up_ceiling``, ``catch_up_lateness``,
    ``catch_up_max_lag``: herd control after an outage, on by default
    (``reminders/_service/herd.py``; the defaults are measured in
    benchmarks/README.md, "herd restart"). Grain calls of ticks whose slot is
    more than ``catch_up_lateness`` (10 s, the default missed-tick grace) old
    start at ``catch_up_rate`` per second per silo, doubling every second up to
    ``catch_up_ceiling`` (``0``: no ceiling), critical rows first; while they
    run, an event-loop lag above ``catch_up_max_lag`` halves the rate (never
    below ``catch_up_rate``), holds it for a second, then grows it by
    ``catch_up_rate`` a second (``None``: the ramp alone). ``catch_up_rate = 0``
    turns herd control off: every overdue tick goes as fast as permits allow.
    ``backfill_rate``: how many slots per second one backfill delivers at most
    (``client.reminders.backfill``); ``backfill_concurrency``: how many backfills
    one silo runs at once (the others wait for a place).
    ``handover_delay``: how long a silo waits before it reads the rows of ranges
    it took over from a silo that is still alive (a join, or a leave that moved
    boundaries between the remaining silos, as the balanced ring does). That
    silo stopped ticking them at the same ring change; meanwhile its ticks in
    flight finish and its last schedule writes land, so the new owner does not
    deliver their slots again. Rows taken over from a silo that left gracefully
    (it drained first) or died (fenced) are read at once. ``0``: read at once
    (a slot ticked just before the move may then be delivered twice).
    ``audit_retention``, ``audit_max_records``: how long, and how many, records
    of management actions the operator audit log keeps (``reminders.audit``).
    ``tick_deadline``: how long a tick's ``receive_reminder`` may run before it
    is cancelled where it runs (``TickDeadlineError``, handled by the row's
    retry policy), for rows without a ``deadline`` of their own; ``None`` (the
    default): no limit. Used once the cluster has ``Feature.TICK_DEADLINE``.
    ``dead_letter_retention`` and ``max_dead_letters``: a failed tick's dead
    letter is kept this long, and at most this many per service (the oldest go
    first); both bounds are applied whenever a dead letter is written.
    """

    look_ahead: timedelta = timedelta(minutes=5)
    poll_interval: timedelta = timedelta(seconds=30)
    base_bucket_size: int = 1024
    permits: int = field(default_factory=_default_permits)
    missed_tick_grace: timedelta | None = None
    repair_interval: timedelta = timedelta(minutes=1)
    minimum_period: timedelta = timedelta(seconds=1)
    enable_priority: bool = True
    shards: int = 256
    max_name_length: int = 256
    persist_batch: int = 256
    retry_initial: timedelta = timedelta(milliseconds=100)
    retry_max: timedelta = timedelta(seconds=10)
    adaptive: bool = True
    history_size: int = 20
    catch_up_rate: float = 50.0
    catch_up_ceiling: float = 0.0
    # The default missed-tick grace: a tick later than that is a missed one, from
    # an outage or a deep overload; a silo running a little behind is not braked.
    catch_up_lateness: timedelta = timedelta(seconds=10)
    catch_up_max_lag: timedelta | None = timedelta(milliseconds=50)
    tick_timeout: timedelta = timedelta(seconds=10)
    minimum_tick_timeout: timedelta = timedelta(seconds=2)
    handover_delay: timedelta = timedelta(milliseconds=500)
    audit_retention: timedelta = timedelta(days=90)
    audit_max_records: int = 100_000
    tick_deadline: timedelta | None = None
    dead_letter_retention: timedelta = timedelta(days=7)
    max_dead_letters: int = 10_000
    backfill_rate: float = 10.0
    backfill_concurrency: int = 4

    if TYPE_CHECKING:
        # What a type checker sees of the generated __init__: durations also take
        # numbers of seconds (``__post_init__`` makes them timedeltas).
        def __init__(
            self,
            *,
            look_ahead: timedelta | float = ...,
            poll_interval: timedelta | float = ...,
            base_bucket_size: int = ...,
            permits: int = ...,
            missed_tick_grace: timedelta | float | None = ...,
            repair_interval: timedelta | float = ...,
            minimum_period: timedelta | float = ...,
            enable_priority: bool = ...,
            shards: int = ...,
            max_name_length: int = ...,
            persist_batch: int = ...,
            retry_initial: timedelta | float = ...,
            retry_max: timedelta | float = ...,
            adaptive: bool = ...,
            history_size: int = ...,
            catch_up_rate: float = ...,
            catch_up_ceiling: float = ...,
            catch_up_lateness: timedelta | float = ...,
            catch_up_max_lag: timedelta | float | None = ...,
            tick_timeout: timedelta | float = ...,
            minimum_tick_timeout: timedelta | float = ...,
            handover_delay: timedelta | float = ...,
            audit_retention: timedelta | float = ...,
            audit_max_records: int = ...,
            tick_deadline: timedelta | float | None = ...,
            dead_letter_retention: timedelta | float = ...,
            max_dead_letters: int = ...,
            backfill_rate: float = ...,
            backfill_concurrency: int = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        _durations(
            self,
            "audit_retention",
            "dead_letter_retention",
            "look_ahead",
            "poll_interval",
            "repair_interval",
            "minimum_period",
            "retry_initial",
            "retry_max",
            "catch_up_lateness",
            "tick_timeout",
            "minimum_tick_timeout",
        )
        _durations(self, "handover_delay", allow_zero=True)  # 0: read taken-over rows at once
        if self.minimum_tick_timeout > self.tick_timeout:
            raise ConfigurationError(
                "ReminderOptions.minimum_tick_timeout must not exceed tick_timeout "
                f"(got {self.minimum_tick_timeout} > {self.tick_timeout})"
            )
        if self.missed_tick_grace is not None:
            _durations(self, "missed_tick_grace")
        if self.tick_deadline is not None:
            _durations(self, "tick_deadline")
            if self.tick_deadline > timedelta(days=1):
                raise ConfigurationError(
                    f"ReminderOptions.tick_deadline must be at most 1 day, got {self.tick_deadline}"
                )
        if self.catch_up_max_lag is not None:
            _durations(self, "catch_up_max_lag")
        _check_types(self)
        for name in (
            "base_bucket_size",
            "permits",
            "max_name_length",
            "persist_batch",
            "audit_max_records",
            "max_dead_letters",
            "backfill_concurrency",
        ):
            _positive(self, name)
        rate = self.backfill_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 10_000:
            raise ConfigurationError(
                f"ReminderOptions.backfill_rate must be a number of slots per second in "
                f"(0, 10000], got {rate!r}"
            )
        if not 0 <= self.history_size <= 10_000:
            raise ConfigurationError(
                f"ReminderOptions.history_size must be in 0..10000, got {self.history_size}"
            )
        if self.shards < 1 or self.shards > 65536 or self.shards & (self.shards - 1):
            raise ConfigurationError("ReminderOptions.shards must be a power of two in 1..65536")
        for name in ("catch_up_rate", "catch_up_ceiling"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ConfigurationError(
                    f"ReminderOptions.{name} must be a number of deliveries per second >= 0, "
                    f"got {value!r}"
                )
        if 0 < self.catch_up_ceiling < self.catch_up_rate:
            raise ConfigurationError(
                "ReminderOptions.catch_up_ceiling must be 0 (none) or >= catch_up_rate "
                f"(got {self.catch_up_ceiling} < {self.catch_up_rate})"
            )
        if self.look_ahead < 2 * self.poll_interval:
            raise ConfigurationError(
                "ReminderOptions.look_ahead must be >= 2 x poll_interval "
                f"(got look_ahead={self.look_ahead}, poll_interval={self.poll_interval}); "
                "raise look_ahead or lower poll_interval"
            )

    @property
    def grace(self) -> timedelta:
        """``missed_tick_grace``, defaulting to ``DEFAULT_MISSED_TICK_GRACE``."""
        if self.missed_tick_grace is not None:
            return self.missed_tick_grace
        return DEFAULT_MISSED_TICK_GRACE


@dataclass(frozen=True, kw_only=True, slots=True)
class RedisOptions:
    """How the Redis providers write.

    ``wait_replicas``: after each write that must survive a failover (a reminder
    registration or removal, a grain-state write or clear, a membership change)
    send ``WAIT wait_replicas wait_timeout`` on the same connection; fewer
    replicas acknowledging in time raises ``StorageUnavailableError`` (the write
    may still have happened on the primary: retry it, etags make that safe).
    0 (the default) does not wait: Redis replicates asynchronously, so a write
    acknowledged just before the primary dies can be lost (docs/redis.md).
    """

    wait_replicas: int = 0
    wait_timeout: timedelta = timedelta(seconds=1)

    if TYPE_CHECKING:

        def __init__(
            self, *, wait_replicas: int = ..., wait_timeout: timedelta | float = ...
        ) -> None: ...

    def __post_init__(self) -> None:
        _durations(self, "wait_timeout")
        _check_types(self)
        if self.wait_replicas < 0:
            raise ConfigurationError(
                f"RedisOptions.wait_replicas must be >= 0, got {self.wait_replicas}"
            )

    @property
    def wait_ms(self) -> int:
        """``wait_timeout`` in whole milliseconds (at least 1), as WAIT takes it."""
        return max(1, int(self.wait_timeout.total_seconds() * 1000))


@dataclass(frozen=True, kw_only=True, slots=True)
class SiloOptions:
    """Everything a silo needs; the embedded default is ``SiloOptions()``.

    With no URL set the silo uses the in-memory membership table,
    directory and reminder table and accepts no network traffic (one process).
    With a URL set it joins the cluster ``cluster_id`` over gRPC on
    ``silo_port`` (``0`` picks a free port) and accepts clients on
    ``gateway_port`` (``None``: no gateway).

    ``allow_client_management``: whether gateway clients may call the reminder
    management grain's operations that change or delete rows (reading is always
    allowed). ``None`` (the default) allows them only when clients must
    authenticate, i.e. a cluster secret or TLS is set; calls made inside the
    cluster (grains, ``silo.client``) are never restricted.

    ``host`` is the address the silo, gateway and metrics ports listen on;
    ``advertised_host`` the address (or DNS name) peers and clients dial, written
    to the membership table. Left ``None`` it is ``host``, except when ``host``
    is a wildcard (``0.0.0.0``, ``::``): the silo then advertises the local
    address it reaches the membership store from (``orleanspy.runtime.addresses``),
    and refuses to start when it cannot tell one. An advertised wildcard,
    multicast or broadcast address is a ``ConfigurationError`` here: no peer
    could dial it.

    ``storage`` names the grain storage providers that ``persistent_state``
    declarations refer to: each value is a provider object (a ``GrainStorage``)
    or a URL (``memory://``, ``redis://``, ``rediss://``, ``unix://``,
    ``postgresql://``). Left ``None``, the silo has one provider, ``"default"``:
    Redis at ``redis_url`` when that is set, otherwise in memory.

    ``storage_url`` names the store of the cluster's tables: Redis
    (``redis://``, ``rediss://``, ``unix://``) or PostgreSQL (``postgresql://``).
    ``redis_url`` is the older name and means the same (``storage_url`` wins
    when both are set). ``membership_url`` and ``reminder_table_url`` put one
    table elsewhere. The grain directory lives with ``storage_url`` (else with
    the membership table); the stream provider on the first Redis URL given,
    and in memory (this silo only) when there is none.
    ``metrics_port``: serve ``/metrics``, ``/healthz`` and ``/readyz`` over HTTP
    on ``host`` (``0`` picks a free port; ``None``, the default: no endpoint and
    no metrics recorded). ``storage_start_timeout``: how long ``start`` keeps
    retrying an unreachable Redis before it fails (a compose start-up brings
    Redis up alongside the silos).
    ``dashboard_port``: serve the dashboard (``orleanspy.dashboard``, the
    ``orleanspy[dashboard]`` extra) on ``dashboard_host`` (loopback by default;
    ``None``, the default: no dashboard). On an address other than loopback the
    silo refuses to start unless ``dashboard_token`` is set or the cluster has
    TLS (then the dashboard serves HTTPS and asks for a client certificate
    signed by the cluster's CA). A dashboard records metrics as
    ``metrics_port`` does. ``dashboard_token_name`` names the token's holder:
    the audit log records the dashboard's actions as ``dashboard:<name>``.
    ``tune_gc``: once started, the silo calls ``gc.freeze()`` and raises the
    garbage collector's young-generation threshold to 10,000 (never lowers it),
    so full collections are rare and do not walk start-up objects
    (``orleanspy.runtime.collector``); the last silo to stop puts the collector
    back. ``True`` (the default, since 0.2) does this for every silo, embedded
    ones too: the pauses it spares are the same wherever a silo runs (an
    application that manages the collector itself passes ``False``); ``None``
    means ``True`` (0.1 read it as "cluster silos only"). ``redis``: how the Redis
    providers write (``RedisOptions``: replicas to ``WAIT`` for).
    """

    cluster_id: str = "dev"
    service_id: str = "default"
    name: str | None = None
    host: str = "127.0.0.1"
    advertised_host: str | None = None
    silo_port: int = 0
    gateway_port: int | None = None
    redis_url: str | None = None
    storage_url: str | None = None
    membership_url: str | None = None
    reminder_table_url: str | None = None
    collection_age: timedelta = timedelta(minutes=15)
    collection_check_interval: timedelta = timedelta(minutes=1)
    activation_timeout: timedelta = timedelta(seconds=30)
    deactivation_timeout: timedelta = timedelta(seconds=30)
    messaging: MessagingOptions = field(default_factory=MessagingOptions)
    membership: MembershipOptions = field(default_factory=MembershipOptions)
    reminders: ReminderOptions = field(default_factory=ReminderOptions)
    redis: RedisOptions = field(default_factory=RedisOptions)
    grain_types: tuple[Any, ...] | None = None
    use_uvloop: bool = True
    tune_gc: bool | None = True
    allow_client_management: bool | None = None
    storage: Mapping[str, Any] | None = None

    @property
    def client_management_allowed(self) -> bool:
        """``allow_client_management`` with its default resolved."""
        if self.allow_client_management is not None:
            return self.allow_client_management
        return self.messaging.cluster_secret is not None or self.messaging.tls is not None

    metrics_port: int | None = None
    dashboard_port: int | None = None
    dashboard_host: str = "127.0.0.1"
    dashboard_token: str | None = None
    dashboard_token_name: str = "dashboard"
    storage_start_timeout: timedelta = timedelta(seconds=30)

    if TYPE_CHECKING:
        # What a type checker sees of the generated __init__: durations also take
        # numbers of seconds (``__post_init__`` makes them timedeltas).
        def __init__(
            self,
            *,
            cluster_id: str = ...,
            service_id: str = ...,
            name: str | None = ...,
            host: str = ...,
            advertised_host: str | None = ...,
            silo_port: int = ...,
            gateway_port: int | None = ...,
            redis_url: str | None = ...,
            storage_url: str | None = ...,
            membership_url: str | None = ...,
            reminder_table_url: str | None = ...,
            collection_age: timedelta | float = ...,
            collection_check_interval: timedelta | float = ...,
            activation_timeout: timedelta | float = ...,
            deactivation_timeout: timedelta | float = ...,
            messaging: MessagingOptions = ...,
            membership: MembershipOptions = ...,
            reminders: ReminderOptions = ...,
            redis: RedisOptions = ...,
            grain_types: tuple[Any, ...] | None = ...,
            use_uvloop: bool = ...,
            tune_gc: bool | None = ...,
            allow_client_management: bool | None = ...,
            storage: Mapping[str, Any] | None = ...,
            metrics_port: int | None = ...,
            dashboard_port: int | None = ...,
            dashboard_host: str = ...,
            dashboard_token: str | None = ...,
            dashboard_token_name: str = ...,
            storage_start_timeout: timedelta | float = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        _durations(
            self,
            "collection_age",
            "collection_check_interval",
            "activation_timeout",
            "deactivation_timeout",
            "storage_start_timeout",
        )
        _check_types(self)
        for name in ("cluster_id", "service_id"):
            value = getattr(self, name)
            if not value or not isinstance(value, str) or any(c in value for c in "{}:|"):
                raise ConfigurationError(
                    f"SiloOptions.{name} must be a non-empty string without '{{', '}}', ':', '|'"
                )
        for name in ("silo_port", "gateway_port", "metrics_port", "dashboard_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port <= 65535:
                raise ConfigurationError(f"SiloOptions.{name} must be in 0..65535, got {port}")
        if self.storage is not None:
            _check_storage(self.storage)
        _check_host(self.host)
        if self.advertised_host is not None:
            _check_advertised_host(self.advertised_host)
        if self.dashboard_port is not None:
            why = dashboard_exposure_error(
                self.dashboard_host, self.dashboard_token, self.messaging.tls is not None
            )
            if why is not None:
                raise ConfigurationError(f"SiloOptions.dashboard_host: {why}")
        token_name = self.dashboard_token_name
        if not (
            isinstance(token_name, str)
            and 0 < len(token_name) <= 64
            and all(c.isalnum() or c in "-_.@" for c in token_name)
        ):
            raise ConfigurationError(
                "SiloOptions.dashboard_token_name must be 1..64 letters, digits or -_.@ "
                f"(the audit log's principal dashboard:<name>), got {token_name!r}"
            )

        # ``redis_url`` is the older name of ``storage_url`` and takes the same schemes.
        for name in ("redis_url", "storage_url", "membership_url", "reminder_table_url"):
            url = getattr(self, name)
            if url is not None:
                try:
                    backend_of(url, "tables")
                except ConfigurationError as exc:
                    raise ConfigurationError(f"SiloOptions.{name}: {exc}") from None

    @property
    def clustered(self) -> bool:
        """Whether any table URL is set (the silo then joins a cluster)."""
        return any(
            u is not None
            for u in (
                self.storage_url,
                self.redis_url,
                self.membership_url,
                self.reminder_table_url,
            )
        )

    @property
    def membership_table_url(self) -> str | None:
        """Where the membership table lives: ``membership_url``, else the storage URL."""
        return self.membership_url or self.storage_url or self.redis_url

    @property
    def reminders_url(self) -> str | None:
        """Where the reminder table lives: ``reminder_table_url``, else the storage URL."""
        return self.reminder_table_url or self.storage_url or self.redis_url

    @property
    def directory_url(self) -> str | None:
        """Where the grain directory lives: the storage URL, else with membership."""
        return self.storage_url or self.redis_url or self.membership_url

    @property
    def streams_url(self) -> str | None:
        """The first Redis URL of storage, membership and reminders (``None``: none)."""
        for url in (
            self.storage_url or self.redis_url,
            self.membership_url,
            self.reminder_table_url,
        ):
            if url is not None and backend_of(url) in KINDS["streams"]:
                return url
        return None


def is_wildcard(host: str) -> bool:
    """Whether ``host`` is an unspecified address (``0.0.0.0``, ``::``): listen on
    every interface, dial none."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


# Host names and literals: no separator of a silo address ("host:port@gen"), no space.
_BAD_HOST_CHARS = set("@/ \t\n[]")


def _check_host(host: object) -> None:
    if not isinstance(host, str) or not host or _BAD_HOST_CHARS & set(host):
        raise ConfigurationError(
            f"SiloOptions.host must be an IP address or a host name to listen on, got {host!r}"
        )


def _check_advertised_host(host: object) -> None:
    """Refuse what no peer could dial: a wildcard, multicast or broadcast address,
    or text that is neither an address nor a host name."""
    if not isinstance(host, str) or not host or _BAD_HOST_CHARS & set(host):
        raise ConfigurationError(
            f"SiloOptions.advertised_host must be an IP address or a DNS name peers can dial, "
            f"got {host!r}"
        )
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if ":" in host:
            raise ConfigurationError(
                f"SiloOptions.advertised_host {host!r} is neither an IPv6 address nor a host name"
            ) from None
        return  # a DNS name: peers resolve it
    if address.is_unspecified or address.is_multicast or host == "255.255.255.255":
        raise ConfigurationError(
            f"SiloOptions.advertised_host {host!r} is not an address peers can dial "
            "(it is a wildcard, multicast or broadcast address); give this host's own "
            "address or DNS name, e.g. the pod or VM IP (--advertise-host, "
            "ORLEANSPY_ADVERTISE_HOST)"
        )


_STORAGE_METHODS = ("start", "read", "write", "clear")


def _check_storage(storage: Mapping[str, Any]) -> None:
    if not isinstance(storage, Mapping):
        raise ConfigurationError(
            "SiloOptions.storage must map provider names to providers or URLs, "
            'e.g. {"default": "redis://127.0.0.1:6379/0"}'
        )
    for name, value in storage.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"SiloOptions.storage: {name!r} is not a provider name")
        if isinstance(value, str):
            try:
                backend_of(value, "storage")
            except ConfigurationError:
                raise ConfigurationError(
                    f"SiloOptions.storage[{name!r}]: {value!r} is not a storage URL; use one "
                    f"of {', '.join(schemes_for('storage'))}"
                ) from None
        elif not all(callable(getattr(value, m, None)) for m in _STORAGE_METHODS):
            raise ConfigurationError(
                f"SiloOptions.storage[{name!r}]: {value!r} is neither a URL nor a GrainStorage "
                "(start, read, write, clear)"
            )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback name or address (reachable from this host only)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def dashboard_exposure_error(host: str, token: str | None, tls: bool) -> str | None:
    """Why a dashboard must not listen on ``host`` as configured, or ``None``: off
    loopback it needs a token (of at least 16 characters) or the cluster's TLS."""
    if token is not None and len(token) < 16:
        return "the dashboard token must have at least 16 characters"
    if is_loopback(host) or token is not None or tls:
        return None
    return (
        f"the dashboard would listen on {host}, reachable from other hosts, with no "
        "authentication: set a token (dashboard_token, --dashboard-token, "
        "ORLEANSPY_DASHBOARD_TOKEN) or TLS (MessagingOptions.tls), or bind to 127.0.0.1"
    )
