"""Metric names, metric sinks, Prometheus text, and the silo name on log records.

Every metric orleanspy records is named here, once; components take a
``MetricsSink`` (default ``NoopMetrics``) and call it with these constants.
Counters end in ``_total``; durations are histograms in seconds.

``InMemoryMetrics`` keeps everything for tests and benchmarks and renders as
Prometheus text exposition (``render_prometheus``) without any dependency.
Histograms are exposed as Prometheus summaries (quantiles 0.5, 0.9, 0.99 plus
``_sum`` and ``_count``), since the sink keeps samples rather than buckets.

Log records get the silo's name through ``SiloNameFilter`` on a handler, so a
format can say ``%(silo)s``; ``set_current_silo`` lets several silos in one
process tell their records apart (tasks inherit the context they start in).
"""

from __future__ import annotations

import enum
import logging
import math
import random
from collections.abc import Iterable, Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "ACTIVATIONS",
    "ACTIVATIONS_COLLECTED",
    "GRAIN_CALLS",
    "GRAIN_CALL_ERRORS",
    "GRAIN_CALL_LATENCY",
    "METRICS",
    "REMINDER_BUCKET_SIZE",
    "REMINDER_CAS_CONFLICTS",
    "REMINDER_DELIVERY_RETRIES",
    "REMINDER_GRAIN_ERRORS",
    "REMINDER_LOADED_ROWS",
    "REMINDER_PERSIST_FAILURES",
    "REMINDER_TABLE_READS",
    "REMINDER_TICKS_DELIVERED",
    "REMINDER_TICKS_MISSED",
    "REMINDER_TICK_LATENESS",
    "SILOS_ACTIVE",
    "SILOS_DECLARED_DEAD",
    "SUSPECT_VOTES",
    "HistogramData",
    "InMemoryMetrics",
    "MetricInfo",
    "MetricKind",
    "MetricsSink",
    "MetricsSnapshot",
    "NoopMetrics",
    "SiloNameFilter",
    "current_silo",
    "render_prometheus",
    "reset_current_silo",
    "set_current_silo",
]


class MetricKind(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class MetricInfo:
    """What a metric name means: its kind and the help text Prometheus shows."""

    name: str
    kind: MetricKind
    help: str


# Reminder service
REMINDER_TICKS_DELIVERED = "orleanspy_reminder_ticks_delivered_total"
REMINDER_TICKS_MISSED = "orleanspy_reminder_ticks_missed_total"
REMINDER_TICK_LATENESS = "orleanspy_reminder_tick_lateness_seconds"
REMINDER_BUCKET_SIZE = "orleanspy_reminder_bucket_size"
REMINDER_LOADED_ROWS = "orleanspy_reminder_loaded_rows_total"
REMINDER_TABLE_READS = "orleanspy_reminder_table_reads_total"
REMINDER_GRAIN_ERRORS = "orleanspy_reminder_grain_errors_total"
REMINDER_DELIVERY_RETRIES = "orleanspy_reminder_delivery_retries_total"
REMINDER_CAS_CONFLICTS = "orleanspy_reminder_cas_conflicts_total"
REMINDER_PERSIST_FAILURES = "orleanspy_reminder_persist_failures_total"
# Grain calls and activations
GRAIN_CALLS = "orleanspy_grain_calls_total"
GRAIN_CALL_ERRORS = "orleanspy_grain_call_errors_total"
GRAIN_CALL_LATENCY = "orleanspy_grain_call_latency_seconds"
ACTIVATIONS = "orleanspy_activations"
ACTIVATIONS_COLLECTED = "orleanspy_activations_collected_total"
# Membership
SILOS_ACTIVE = "orleanspy_silos_active"
SUSPECT_VOTES = "orleanspy_membership_suspect_votes_total"
SILOS_DECLARED_DEAD = "orleanspy_membership_silos_declared_dead_total"

_C, _G, _H = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM

METRICS: Mapping[str, MetricInfo] = {
    info.name: info
    for info in (
        MetricInfo(
            REMINDER_TICKS_DELIVERED, _C, "Reminder ticks delivered (receive_reminder returned)."
        ),
        MetricInfo(
            REMINDER_TICKS_MISSED, _C, "Reminder slots missed (reached later than the grace)."
        ),
        MetricInfo(
            REMINDER_TICK_LATENESS, _H, "Delivery time minus the scheduled slot, in seconds."
        ),
        MetricInfo(
            REMINDER_BUCKET_SIZE, _G, "Reminder rows held in the silo's in-memory due heap."
        ),
        MetricInfo(
            REMINDER_LOADED_ROWS, _C, "Reminder rows read from the table into the due heap."
        ),
        MetricInfo(REMINDER_TABLE_READS, _C, "Due-index queries sent to the reminder table."),
        MetricInfo(REMINDER_GRAIN_ERRORS, _C, "receive_reminder calls that raised in the grain."),
        MetricInfo(
            REMINDER_DELIVERY_RETRIES, _C, "Tick deliveries retried after a transport failure."
        ),
        MetricInfo(REMINDER_CAS_CONFLICTS, _C, "Schedule updates that lost a compare-and-swap."),
        MetricInfo(
            REMINDER_PERSIST_FAILURES, _C, "Schedule updates that failed to reach the table."
        ),
        MetricInfo(GRAIN_CALLS, _C, "Grain calls completed, successful or not."),
        MetricInfo(GRAIN_CALL_ERRORS, _C, "Grain calls that ended in an exception."),
        MetricInfo(GRAIN_CALL_LATENCY, _H, "Grain call duration as the caller saw it, in seconds."),
        MetricInfo(ACTIVATIONS, _G, "Grain activations alive in the silo."),
        MetricInfo(ACTIVATIONS_COLLECTED, _C, "Activations deactivated by idle collection."),
        MetricInfo(SILOS_ACTIVE, _G, "Silos Active in the membership snapshot."),
        MetricInfo(SUSPECT_VOTES, _C, "Suspect votes this silo wrote against peers."),
        MetricInfo(SILOS_DECLARED_DEAD, _C, "Silos this silo declared Dead in the table."),
    )
}
"""Every metric orleanspy records, by name."""


@runtime_checkable
class MetricsSink(Protocol):
    """Where components report measurements. Calls must be cheap and never raise
    for a valid name; label values are turned into strings by the sink."""

    def counter(self, name: str, value: float = 1, **labels: object) -> None:
        """Add ``value`` (>= 0) to the counter ``name`` for this label set."""
        ...

    def gauge(self, name: str, value: float, **labels: object) -> None:
        """Set the gauge ``name`` for this label set to ``value``."""
        ...

    def histogram(self, name: str, value: float, **labels: object) -> None:
        """Record one observation ``value`` of the distribution ``name``."""
        ...


class NoopMetrics:
    """The default sink: records nothing."""

    __slots__ = ()

    def counter(self, name: str, value: float = 1, **labels: object) -> None:
        pass

    def gauge(self, name: str, value: float, **labels: object) -> None:
        pass

    def histogram(self, name: str, value: float, **labels: object) -> None:
        pass


LabelSet = tuple[tuple[str, str], ...]
SeriesKey = tuple[str, LabelSet]


def _label_set(labels: Mapping[str, object]) -> LabelSet:
    if not labels:
        return ()
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _matches(key: SeriesKey, name: str, wanted: LabelSet) -> bool:
    return key[0] == name and all(pair in key[1] for pair in wanted)


@dataclass(frozen=True, slots=True)
class HistogramData:
    """One histogram series: exact ``count`` and ``sum``, and its kept ``samples``
    (all of them up to the sink's ``max_samples``, a uniform sample after that)."""

    count: int
    sum: float
    samples: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """A copy of an ``InMemoryMetrics`` at one moment.

    The lookups take labels as a filter: a series matches when it carries every
    label given (and possibly more), so ``counter(name)`` is the total over all
    label sets.
    """

    counters: Mapping[SeriesKey, float]
    gauges: Mapping[SeriesKey, float]
    histograms: Mapping[SeriesKey, HistogramData]

    def counter(self, name: str, **labels: object) -> float:
        """The sum of the matching counter series; 0 when none matches."""
        wanted = _label_set(labels)
        return sum(v for k, v in self.counters.items() if _matches(k, name, wanted))

    def gauge(self, name: str, **labels: object) -> float | None:
        """The matching gauge's value, ``None`` if no series matches.

        Raises ``ValueError`` if several series match (give more labels)."""
        wanted = _label_set(labels)
        found = [v for k, v in self.gauges.items() if _matches(k, name, wanted)]
        if len(found) > 1:
            raise ValueError(f"{len(found)} series of gauge {name!r} match {dict(wanted)}")
        return found[0] if found else None

    def samples(self, name: str, **labels: object) -> list[float]:
        """The kept samples of every matching histogram series, in recording order per series."""
        wanted = _label_set(labels)
        return [
            s for k, h in self.histograms.items() if _matches(k, name, wanted) for s in h.samples
        ]

    def count(self, name: str, **labels: object) -> int:
        """How many observations the matching histogram series recorded (exact)."""
        wanted = _label_set(labels)
        return sum(h.count for k, h in self.histograms.items() if _matches(k, name, wanted))


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class _Series:
    __slots__ = ("count", "samples", "sum")

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.samples: list[float] = []


class InMemoryMetrics:
    """A sink that keeps counters, gauges and histogram samples, for tests and benchmarks.

    Each histogram series keeps up to ``max_samples`` samples; beyond that a
    uniform reservoir sample of them (count and sum stay exact), so a long
    benchmark cannot exhaust memory. A name used as one kind cannot be used as
    another (``ValueError``). Meant for one event loop; not thread-safe.
    """

    def __init__(self, *, max_samples: int = 1_000_000, seed: int | None = None) -> None:
        if max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {max_samples}")
        self._max_samples = max_samples
        self._random = random.Random(seed)
        self._kinds: dict[str, MetricKind] = {}
        self._counters: dict[SeriesKey, float] = {}
        self._gauges: dict[SeriesKey, float] = {}
        self._histograms: dict[SeriesKey, _Series] = {}

    def _check_kind(self, name: str, kind: MetricKind) -> None:
        known = self._kinds.setdefault(name, kind)
        if known is not kind:
            raise ValueError(f"metric {name!r} is a {known.value}, not a {kind.value}")

    def counter(self, name: str, value: float = 1, **labels: object) -> None:
        if value < 0:
            raise ValueError(f"counter {name!r} cannot decrease (got {value})")
        self._check_kind(name, MetricKind.COUNTER)
        key = (name, _label_set(labels))
        self._counters[key] = self._counters.get(key, 0) + value

    def gauge(self, name: str, value: float, **labels: object) -> None:
        self._check_kind(name, MetricKind.GAUGE)
        self._gauges[(name, _label_set(labels))] = value

    def histogram(self, name: str, value: float, **labels: object) -> None:
        self._check_kind(name, MetricKind.HISTOGRAM)
        key = (name, _label_set(labels))
        series = self._histograms.get(key)
        if series is None:
            series = self._histograms[key] = _Series()
        series.count += 1
        series.sum += value
        if len(series.samples) < self._max_samples:
            series.samples.append(value)
        else:
            # Algorithm R: every observation so far stays in the sample with
            # equal probability, so quantiles remain unbiased.
            slot = self._random.randrange(series.count)
            if slot < self._max_samples:
                series.samples[slot] = value

    def snapshot(self) -> MetricsSnapshot:
        """A copy of everything recorded so far; later recording does not change it."""
        return MetricsSnapshot(
            counters=dict(self._counters),
            gauges=dict(self._gauges),
            histograms={
                k: HistogramData(s.count, s.sum, tuple(s.samples))
                for k, s in self._histograms.items()
            },
        )

    def quantile(self, name: str, q: float, **labels: object) -> float:
        """The ``q``-quantile (0..1) of the matching histogram series' samples.

        Labels filter as in ``MetricsSnapshot``. Raises ``ValueError`` for ``q``
        outside 0..1 or when no sample matches.
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be within 0..1, got {q}")
        wanted = _label_set(labels)
        ordered = sorted(
            v for k, s in self._histograms.items() if _matches(k, name, wanted) for v in s.samples
        )
        if not ordered:
            raise ValueError(f"no samples of {name!r} match {dict(wanted)}")
        return _quantile(ordered, q)

    def kinds(self) -> Mapping[str, MetricKind]:
        """The kind of every name recorded so far."""
        return dict(self._kinds)

    def reset(self) -> None:
        """Forget everything recorded."""
        self._kinds.clear()
        self._counters.clear()
        self._gauges.clear()
        self._histograms.clear()


_SUMMARY_QUANTILES = (0.5, 0.9, 0.99)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _format_labels(labels: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
    return f"{{{body}}}" if body else ""


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def render_prometheus(metrics: InMemoryMetrics) -> str:
    """Everything in ``metrics`` in the Prometheus text exposition format (0.0.4).

    Names are sorted; each gets ``# HELP`` (for names in ``METRICS``) and
    ``# TYPE``; histograms are written as summaries. Returns ``""`` when
    nothing was recorded, otherwise text ending in a newline.
    """
    snap = metrics.snapshot()
    series: dict[str, list[str]] = {}
    for (name, labels), value in sorted(snap.counters.items()):
        series.setdefault(name, []).append(f"{name}{_format_labels(labels)} {_format_value(value)}")
    for (name, labels), value in sorted(snap.gauges.items()):
        series.setdefault(name, []).append(f"{name}{_format_labels(labels)} {_format_value(value)}")
    for (name, labels), hist in sorted(snap.histograms.items()):
        lines = series.setdefault(name, [])
        ordered = sorted(hist.samples)
        for q in _SUMMARY_QUANTILES:
            value = _quantile(ordered, q) if ordered else math.nan
            quantile_labels = (*labels, ("quantile", _format_value(q)))
            lines.append(f"{name}{_format_labels(quantile_labels)} {_format_value(value)}")
        lines.append(f"{name}_sum{_format_labels(labels)} {_format_value(hist.sum)}")
        lines.append(f"{name}_count{_format_labels(labels)} {hist.count}")

    kinds = metrics.kinds()
    out: list[str] = []
    for name in sorted(series):
        info = METRICS.get(name)
        if info is not None:
            out.append(f"# HELP {name} {_escape_help(info.help)}")
        kind = kinds[name]
        out.append(f"# TYPE {name} {'summary' if kind is MetricKind.HISTOGRAM else kind.value}")
        out.extend(series[name])
    return "\n".join(out) + "\n" if out else ""


_current_silo: ContextVar[str | None] = ContextVar("orleanspy_current_silo", default=None)


def set_current_silo(name: str | None) -> Token[str | None]:
    """Name the silo for log records of this context and the tasks it starts.

    Returns a token for ``reset_current_silo``, which restores the name before.
    """
    return _current_silo.set(name)


def reset_current_silo(token: Token[str | None]) -> None:
    """Undo the ``set_current_silo`` call that returned ``token``."""
    _current_silo.reset(token)


def current_silo() -> str | None:
    """The silo name set for this context, if any."""
    return _current_silo.get()


class SiloNameFilter(logging.Filter):
    """Stamps ``record.silo`` so a format can include ``%(silo)s``; passes every record.

    The name is, first found: a ``silo`` the caller gave in ``extra``, the
    context's ``set_current_silo`` name, else the ``name`` given here. Attach it
    to handlers (a logger's filters do not see records of child loggers).
    """

    def __init__(self, name: str = "-") -> None:
        super().__init__()
        self.silo_name = name

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "silo", None) is None:
            record.silo = _current_silo.get() or self.silo_name
        return True
