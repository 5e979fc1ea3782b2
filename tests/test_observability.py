"""Metric names, sinks, Prometheus text and the silo-name log filter."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from orleanspy import observability as obs
from orleanspy.observability import (
    METRICS,
    InMemoryMetrics,
    MetricKind,
    MetricsSink,
    NoopMetrics,
    SiloNameFilter,
    render_prometheus,
    reset_current_silo,
    set_current_silo,
)

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def test_every_metric_constant_is_catalogued_with_a_valid_name() -> None:
    constants = {
        v for k, v in vars(obs).items() if k.isupper() and isinstance(v, str) and k in obs.__all__
    }
    assert constants == set(METRICS)
    for name, info in METRICS.items():
        assert _NAME.fullmatch(name), name
        assert name.startswith("orleanspy_")
        assert name.endswith("_total") == (info.kind is MetricKind.COUNTER), name
        if info.kind is MetricKind.HISTOGRAM:
            assert name.endswith("_seconds"), name
        assert info.help


def test_sinks_satisfy_the_protocol() -> None:
    assert isinstance(NoopMetrics(), MetricsSink)
    assert isinstance(InMemoryMetrics(), MetricsSink)


def test_noop_records_nothing_and_accepts_anything() -> None:
    sink = NoopMetrics()
    sink.counter(obs.GRAIN_CALLS, type="G")
    sink.gauge(obs.ACTIVATIONS, 3)
    sink.histogram(obs.GRAIN_CALL_LATENCY, 0.1)
    assert not hasattr(sink, "__dict__")


def test_counters_sum_per_label_set_and_filter_by_labels() -> None:
    m = InMemoryMetrics()
    m.counter(obs.REMINDER_TICKS_DELIVERED, priority=100)
    m.counter(obs.REMINDER_TICKS_DELIVERED, 2, priority=100)
    m.counter(obs.REMINDER_TICKS_DELIVERED, 5, priority=0)
    snap = m.snapshot()
    assert snap.counter(obs.REMINDER_TICKS_DELIVERED, priority=100) == 3
    assert snap.counter(obs.REMINDER_TICKS_DELIVERED, priority="0") == 5
    assert snap.counter(obs.REMINDER_TICKS_DELIVERED) == 8
    assert snap.counter(obs.REMINDER_TICKS_MISSED) == 0


def test_counter_refuses_to_decrease_and_kinds_do_not_mix() -> None:
    m = InMemoryMetrics()
    with pytest.raises(ValueError):
        m.counter(obs.GRAIN_CALLS, -1)
    m.counter(obs.GRAIN_CALLS)
    with pytest.raises(ValueError):
        m.gauge(obs.GRAIN_CALLS, 1)


def test_gauge_keeps_the_last_value_per_label_set() -> None:
    m = InMemoryMetrics()
    m.gauge(obs.SILOS_ACTIVE, 3, silo="a")
    m.gauge(obs.SILOS_ACTIVE, 2, silo="a")
    m.gauge(obs.SILOS_ACTIVE, 5, silo="b")
    snap = m.snapshot()
    assert snap.gauge(obs.SILOS_ACTIVE, silo="a") == 2
    assert snap.gauge(obs.SILOS_ACTIVE, silo="b") == 5
    assert snap.gauge(obs.ACTIVATIONS) is None
    with pytest.raises(ValueError):
        snap.gauge(obs.SILOS_ACTIVE)


def test_snapshot_is_a_copy() -> None:
    m = InMemoryMetrics()
    m.counter(obs.GRAIN_CALLS)
    m.histogram(obs.GRAIN_CALL_LATENCY, 1.0)
    before = m.snapshot()
    m.counter(obs.GRAIN_CALLS)
    m.histogram(obs.GRAIN_CALL_LATENCY, 2.0)
    assert before.counter(obs.GRAIN_CALLS) == 1
    assert before.samples(obs.GRAIN_CALL_LATENCY) == [1.0]
    assert m.snapshot().count(obs.GRAIN_CALL_LATENCY) == 2


def test_quantile_interpolates_and_filters_by_labels() -> None:
    m = InMemoryMetrics()
    for v in range(1, 101):
        m.histogram(obs.REMINDER_TICK_LATENESS, v / 1000, priority=0)
    m.histogram(obs.REMINDER_TICK_LATENESS, 9.0, priority=100)
    assert m.quantile(obs.REMINDER_TICK_LATENESS, 0.5, priority=0) == pytest.approx(0.0505)
    assert m.quantile(obs.REMINDER_TICK_LATENESS, 0.0, priority=0) == pytest.approx(0.001)
    assert m.quantile(obs.REMINDER_TICK_LATENESS, 1.0) == 9.0
    assert m.quantile(obs.REMINDER_TICK_LATENESS, 0.5, priority=100) == 9.0
    with pytest.raises(ValueError):
        m.quantile(obs.REMINDER_TICK_LATENESS, 1.5)
    with pytest.raises(ValueError):
        m.quantile(obs.GRAIN_CALL_LATENCY, 0.5)


def test_histogram_reservoir_bounds_memory_and_keeps_count_and_sum_exact() -> None:
    m = InMemoryMetrics(max_samples=100, seed=7)
    for v in range(10_000):
        m.histogram(obs.GRAIN_CALL_LATENCY, float(v))
    snap = m.snapshot()
    ((_, data),) = snap.histograms.items()
    assert len(data.samples) == 100
    assert data.count == 10_000
    assert data.sum == sum(range(10_000))
    # a uniform sample of 0..9999: its median is nowhere near the first 100 values
    assert 2_500 < m.quantile(obs.GRAIN_CALL_LATENCY, 0.5) < 7_500


def test_render_prometheus_text_format() -> None:
    m = InMemoryMetrics()
    m.counter(obs.GRAIN_CALLS, 3, type="Counter", method="add")
    m.gauge(obs.ACTIVATIONS, 7)
    m.gauge("custom_gauge", 0.25, note='say "hi"\\now\n')
    for v in (0.1, 0.2, 0.3, 0.4):
        m.histogram(obs.GRAIN_CALL_LATENCY, v)
    text = render_prometheus(m)
    lines = text.splitlines()
    assert text.endswith("\n")
    assert f"# TYPE {obs.GRAIN_CALLS} counter" in lines
    assert f"# HELP {obs.GRAIN_CALLS} {METRICS[obs.GRAIN_CALLS].help}" in lines
    assert f'{obs.GRAIN_CALLS}{{method="add",type="Counter"}} 3' in lines
    assert f"# TYPE {obs.ACTIVATIONS} gauge" in lines
    assert f"{obs.ACTIVATIONS} 7" in lines
    assert "# TYPE custom_gauge gauge" in lines
    assert not any(line.startswith("# HELP custom_gauge") for line in lines)
    assert 'custom_gauge{note="say \\"hi\\"\\\\now\\n"} 0.25' in lines
    assert f"# TYPE {obs.GRAIN_CALL_LATENCY} summary" in lines
    assert f'{obs.GRAIN_CALL_LATENCY}{{quantile="0.5"}} 0.25' in lines
    assert f"{obs.GRAIN_CALL_LATENCY}_count 4" in lines
    (sum_line,) = [line for line in lines if line.startswith(f"{obs.GRAIN_CALL_LATENCY}_sum ")]
    assert float(sum_line.split()[1]) == pytest.approx(1.0)
    # TYPE comes before the samples of its metric, one block per name
    assert lines.index(f"# TYPE {obs.ACTIVATIONS} gauge") < lines.index(f"{obs.ACTIVATIONS} 7")
    assert sum(line.startswith("# TYPE ") for line in lines) == 4


def test_render_prometheus_of_nothing_is_empty() -> None:
    assert render_prometheus(InMemoryMetrics()) == ""


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(silo)s %(message)s"))
        self.addFilter(SiloNameFilter("silo-1"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def test_silo_name_filter_stamps_records() -> None:
    logger = logging.getLogger("orleanspy.test.silo_filter")
    capture = _Capture()
    logger.addHandler(capture)
    try:
        logger.warning("plain")
        logger.warning("given", extra={"silo": "explicit"})
        token = set_current_silo("silo-2")
        try:
            logger.warning("context")
        finally:
            reset_current_silo(token)
        logger.warning("again")
    finally:
        logger.removeHandler(capture)
    assert capture.lines == ["silo-1 plain", "explicit given", "silo-2 context", "silo-1 again"]


async def test_current_silo_is_inherited_by_tasks_started_in_its_context() -> None:
    seen: dict[str, str | None] = {}

    async def silo(name: str) -> None:
        set_current_silo(name)
        await asyncio.create_task(child(name))

    async def child(name: str) -> None:
        await asyncio.sleep(0)
        seen[name] = obs.current_silo()

    await asyncio.gather(silo("a"), silo("b"))
    assert seen == {"a": "a", "b": "b"}
    assert obs.current_silo() is None
