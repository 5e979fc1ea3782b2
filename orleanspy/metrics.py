"""Recording points: what components call where things happen.

Components hold a recorder with named methods (``ReminderMetrics``,
``GrainMetrics``). The base classes record nothing, so a component that was
given none pays one empty method call. ``SiloMetrics.recording()`` returns
recorders that keep plain counters and histogram buckets in memory: no lock,
no label lookup beyond one dict, no string formatting on the hot path. The
exposition (``orleanspy._prometheus``, built on ``prometheus_client``) turns
them into Prometheus series when ``/metrics`` is scraped.

Counters that a component already keeps as attributes (the reminder service's
``stats``, the catalog's ``collected``, the health monitor's probe counts, the
transport's ``WireStats``) are not recorded twice: the exposition reads them
at scrape time.

Label sets are bounded: grain types are the types a silo hosts (and, for
orphaned reminder rows, the types of the table that no silo hosts), priorities
are -128..127, actions are the three ``MissedReminderAction`` members, skip
reasons the ``SkipReason`` members.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

__all__ = [
    "LATENCY_BUCKETS",
    "LATENESS_BUCKETS",
    "ROWS_BUCKETS",
    "CallSeries",
    "GrainMetrics",
    "Histogram",
    "RecordingGrainMetrics",
    "RecordingReminderMetrics",
    "ReminderMetrics",
    "SiloMetrics",
    "priority_label",
]

#: Seconds: a grain call on one silo takes tens of microseconds; a slow one, seconds.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip
#: Seconds a tick came after its slot: milliseconds when healthy, up to the grace and past it.
LATENESS_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
#: Rows: per refill, per persisted batch.
ROWS_BUCKETS: tuple[float, ...] = (0, 1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)

_PRIORITY_NAMES = {100: "critical", 0: "normal", -100: "background"}


def priority_label(priority: int) -> str:
    """The ``priority`` label: the name of a ``ReminderPriority`` member, else the number."""
    return _PRIORITY_NAMES.get(priority) or str(priority)


class Histogram:
    """Observations counted into fixed buckets (``le`` upper bounds) plus their sum.

    ``counts[i]`` counts observations ``<= bounds[i]`` and ``> bounds[i-1]``;
    the last slot counts those above every bound (Prometheus' ``+Inf``).
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)


class ReminderMetrics:
    """The reminder service's recording points. This base records nothing."""

    __slots__ = ()

    def tick(self, priority: int, lateness: float, grain_error: bool) -> None:
        """A tick was delivered ``lateness`` seconds after its slot; ``grain_error``
        when the grain's ``receive_reminder`` raised."""

    def missed(self, action: str) -> None:
        """A row was reached past the grace; ``action`` is its ``MissedReminderAction`` name."""

    def deduplicated(self) -> None:
        """A tick was not run again: the grain's state had committed its occurrence."""

    def skipped(self, reason: str, slots: int) -> None:
        """``slots`` slots were skipped; ``reason`` is a ``SkipReason`` value."""

    def dead_lettered(self) -> None:
        """A tick failed its last attempt (a dead letter, where they are kept)."""

    def deadline_exceeded(self) -> None:
        """A tick's run was cancelled at its deadline."""

    def refilled(self, rows: int) -> None:
        """A refill loaded ``rows`` rows into the window."""

    def table_reads(self, queries: int) -> None:
        """``queries`` reads were sent to the reminder table."""

    def persisted(self, rows: int) -> None:
        """A batch of ``rows`` schedule updates was sent to the table."""

    def feed_event(self) -> None:
        """A change notification arrived."""

    def feed_reconnect(self) -> None:
        """The change feed was lost and is being resubscribed."""

    def orphans(self, rows_by_type: dict[str, int]) -> None:
        """The last orphan check found these rows per grain type that no silo
        hosts (``remindable.orphans``)."""


class RecordingReminderMetrics(ReminderMetrics):
    """Keeps what ``ReminderMetrics`` is told, for the exposition to read."""

    __slots__ = (
        "dead_letters",
        "deadline_cuts",
        "deduplicated_ticks",
        "feed_events",
        "feed_reconnects",
        "grain_errors",
        "lateness",
        "missed_by_action",
        "orphaned",
        "persist_batches",
        "reads",
        "refill_rows",
        "skipped_by_reason",
        "ticks",
    )

    def __init__(self) -> None:
        self.ticks: dict[str, int] = {}
        self.grain_errors: dict[str, int] = {}
        self.lateness: dict[str, Histogram] = {}
        self.missed_by_action: dict[str, int] = {}
        self.refill_rows = Histogram(ROWS_BUCKETS)
        self.persist_batches = Histogram(ROWS_BUCKETS)
        self.reads = 0
        self.feed_events = 0
        self.feed_reconnects = 0
        self.orphaned: dict[str, int] = {}
        self.deduplicated_ticks = 0
        self.skipped_by_reason: dict[str, int] = {}
        self.dead_letters = 0
        self.deadline_cuts = 0

    def tick(self, priority: int, lateness: float, grain_error: bool) -> None:
        label = priority_label(priority)
        self.ticks[label] = self.ticks.get(label, 0) + 1
        if grain_error:
            self.grain_errors[label] = self.grain_errors.get(label, 0) + 1
        hist = self.lateness.get(label)
        if hist is None:
            hist = self.lateness[label] = Histogram(LATENESS_BUCKETS)
        hist.observe(max(0.0, lateness))

    def missed(self, action: str) -> None:
        self.missed_by_action[action] = self.missed_by_action.get(action, 0) + 1

    def deduplicated(self) -> None:
        self.deduplicated_ticks += 1

    def skipped(self, reason: str, slots: int) -> None:
        self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + slots

    def dead_lettered(self) -> None:
        self.dead_letters += 1

    def deadline_exceeded(self) -> None:
        self.deadline_cuts += 1

    def refilled(self, rows: int) -> None:
        self.refill_rows.observe(rows)

    def table_reads(self, queries: int) -> None:
        self.reads += queries

    def persisted(self, rows: int) -> None:
        self.persist_batches.observe(rows)

    def feed_event(self) -> None:
        self.feed_events += 1

    def feed_reconnect(self) -> None:
        self.feed_reconnects += 1

    def orphans(self, rows_by_type: dict[str, int]) -> None:
        self.orphaned = dict(rows_by_type)


class GrainMetrics:
    """Grain calls as the hosting silo ran them. This base records nothing."""

    __slots__ = ()
    #: Whether ``call`` keeps anything: callers skip timing a call when it does not.
    records = False

    def call(self, grain_type: str, seconds: float, failed: bool, method: str = "") -> None:
        """A call of ``grain_type``'s ``method`` took ``seconds``; ``failed`` if it raised."""


class CallSeries(Histogram):
    """The latency histogram of one grain type (its count is the calls), plus errors."""

    __slots__ = ("errors",)

    def __init__(self) -> None:
        super().__init__(LATENCY_BUCKETS)
        self.errors = 0


class RecordingGrainMetrics(GrainMetrics):
    """Keeps a ``CallSeries`` per grain type, and ``[calls, errors]`` per
    ``(grain type, method)`` (methods are a class's public ones: a bounded set)."""

    __slots__ = ("by_method", "by_type")
    records = True

    def __init__(self) -> None:
        self.by_type: dict[str, CallSeries] = {}
        self.by_method: dict[tuple[str, str], list[int]] = {}

    def call(self, grain_type: str, seconds: float, failed: bool, method: str = "") -> None:
        counts = self.by_method.get((grain_type, method))
        if counts is None:
            counts = self.by_method[(grain_type, method)] = [0, 0]
        counts[0] += 1
        if failed:
            counts[1] += 1
        # Histogram.observe inlined: this runs once per grain call.
        series = self.by_type.get(grain_type)
        if series is None:
            series = self.by_type[grain_type] = CallSeries()
        series.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        series.sum += seconds
        if failed:
            series.errors += 1


class SiloMetrics:
    """The recorders of one silo. ``SiloMetrics()`` records nothing;
    ``SiloMetrics.recording()`` keeps everything for the exposition."""

    __slots__ = ("enabled", "grains", "reminders")

    def __init__(
        self,
        reminders: ReminderMetrics | None = None,
        grains: GrainMetrics | None = None,
    ) -> None:
        self.reminders = reminders or ReminderMetrics()
        self.grains = grains or GrainMetrics()
        self.enabled = isinstance(self.reminders, RecordingReminderMetrics)

    @classmethod
    def recording(cls) -> SiloMetrics:
        return cls(RecordingReminderMetrics(), RecordingGrainMetrics())
