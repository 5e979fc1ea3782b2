"""Prometheus exposition of one silo: the only module importing ``prometheus_client``.

``SiloCollector`` turns, at scrape time, the silo's recorders
(``orleanspy.metrics``) and the counters its components keep (reminder service
stats, catalog, health monitor, transport) into metric families. Every name
orleanspy exposes is in this file; counters end in ``_total``, durations are
in seconds. ``render(silo.readings())`` is the ``/metrics`` body.

``prometheus_client`` is the optional extra ``orleanspy[metrics]``; import
this module only after ``available()`` said yes.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from orleanspy.metrics import Histogram
    from orleanspy.runtime.readings import SiloReadings

__all__ = ["CONTENT_TYPE", "available", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def available() -> bool:
    """Whether ``prometheus_client`` is installed (``pip install 'orleanspy[metrics]'``)."""
    return importlib.util.find_spec("prometheus_client") is not None


def _bound(value: float) -> str:
    return repr(float(value))


def _histogram(name: str, doc: str, label: str | None, series: Mapping[str, Histogram]) -> Metric:
    from prometheus_client.core import HistogramMetricFamily

    family = HistogramMetricFamily(name, doc, labels=[label] if label else None)
    for value, hist in sorted(series.items()):
        cumulative, buckets = 0, []
        for bound, count in zip(hist.bounds, hist.counts, strict=False):
            cumulative += count
            buckets.append((_bound(bound), float(cumulative)))
        buckets.append(("+Inf", float(cumulative + hist.counts[-1])))
        family.add_metric([value] if label else [], buckets, hist.sum)
    return family


def _counter(name: str, doc: str, value: float) -> Metric:
    from prometheus_client.core import CounterMetricFamily

    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> Metric:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, doc, value=value)


def _labelled(kind: str, name: str, doc: str, label: str, values: Mapping[str, float]) -> Metric:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    family: CounterMetricFamily | GaugeMetricFamily
    if kind == "counter":
        family = CounterMetricFamily(name, doc, labels=[label])
    else:
        family = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class SiloCollector:
    """A ``prometheus_client`` collector reading one silo's ``SiloReadings``
    (``Silo.readings()``) when scraped."""

    def __init__(self, silo: SiloReadings) -> None:
        self._silo = silo

    def collect(self) -> Iterator[Metric]:
        yield from self._grains()
        yield from self._reminders()
        yield from self._membership()
        yield from self._messaging()

    def _grains(self) -> Iterator[Metric]:
        from orleanspy.metrics import RecordingGrainMetrics

        silo = self._silo
        recorder = silo.metrics.grains
        if isinstance(recorder, RecordingGrainMetrics):
            by_type = recorder.by_type
            yield _labelled(
                "counter",
                "orleanspy_grain_calls_total",
                "Grain calls run by this silo, by grain type.",
                "grain_type",
                {t: s.count for t, s in by_type.items()},
            )
            yield _labelled(
                "counter",
                "orleanspy_grain_call_errors_total",
                "Grain calls that raised, by grain type.",
                "grain_type",
                {t: s.errors for t, s in by_type.items()},
            )
            yield _histogram(
                "orleanspy_grain_call_duration_seconds",
                "Time a grain method ran on this silo, in seconds.",
                "grain_type",
                dict(by_type),
            )
        counts = silo.activations_by_type()
        collected = silo.activations_collected
        if counts is None or collected is None:
            return
        yield _labelled(
            "gauge", "orleanspy_activations", "Activations alive, by grain type.", "grain_type",
            counts,
        )  # fmt: skip
        yield _counter(
            "orleanspy_activations_collected_total",
            "Activations deactivated by idle collection.",
            collected,
        )

    def _reminders(self) -> Iterator[Metric]:
        from orleanspy.metrics import RecordingReminderMetrics

        rec = self._silo.metrics.reminders
        if isinstance(rec, RecordingReminderMetrics):
            yield _labelled(
                "counter",
                "orleanspy_reminder_ticks_total",
                "Reminder ticks delivered (receive_reminder returned or raised), by priority.",
                "priority",
                rec.ticks,
            )
            yield _labelled(
                "counter",
                "orleanspy_reminder_ticks_failed_total",
                "Reminder ticks whose receive_reminder raised in the grain, by priority.",
                "priority",
                rec.grain_errors,
            )
            yield _labelled(
                "counter",
                "orleanspy_reminder_ticks_missed_total",
                "Reminder slots reached past the grace, by missed-tick action.",
                "action",
                rec.missed_by_action,
            )
            yield _counter(
                "orleanspy_reminder_ticks_deduplicated_total",
                "Reminder ticks not run again: the grain's state had committed their "
                "occurrence (write(tick=...)).",
                rec.deduplicated_ticks,
            )
            yield _labelled(
                "counter",
                "orleanspy_reminder_slots_skipped_total",
                "Reminder slots not delivered, by reason (paused, overlap, calendar, "
                "catchup_window, late).",
                "reason",
                rec.skipped_by_reason,
            )
            yield _counter(
                "orleanspy_reminder_dead_letters_total",
                "Reminder ticks that failed their last attempt (dead letters).",
                rec.dead_letters,
            )
            yield _counter(
                "orleanspy_reminder_ticks_deadline_exceeded_total",
                "Reminder ticks cancelled where they ran at their deadline.",
                rec.deadline_cuts,
            )
            yield _histogram(
                "orleanspy_reminder_tick_lateness_seconds",
                "Delivery time minus the scheduled slot, in seconds, by priority.",
                "priority",
                rec.lateness,
            )
            yield _histogram(
                "orleanspy_reminder_refill_rows",
                "Rows loaded into the window per refill.",
                None,
                {"": rec.refill_rows},
            )
            yield _histogram(
                "orleanspy_reminder_persist_batch_rows",
                "Schedule updates per write sent to the reminder table.",
                None,
                {"": rec.persist_batches},
            )
            yield _counter(
                "orleanspy_reminder_table_reads_total",
                "Reads sent to the reminder table (due-index queries and row reads).",
                rec.reads,
            )
            yield _counter(
                "orleanspy_reminder_feed_events_total",
                "Change notifications received from the reminder table.",
                rec.feed_events,
            )
            yield _counter(
                "orleanspy_reminder_feed_reconnects_total",
                "Times the change feed was lost and resubscribed.",
                rec.feed_reconnects,
            )
            yield _labelled(
                "gauge",
                "orleanspy_reminder_orphaned_rows",
                "Reminder rows whose grain type no silo of the cluster hosts, by grain type "
                "(at the last orphan check).",
                "grain_type",
                rec.orphaned,
            )
        st = self._silo.reminder_stats
        if st is None:
            return
        for name, doc, value in (
            ("tick_retries", "Tick deliveries retried after a call-path failure.", st.retries),
            ("ticks_skipped", "Missed slots skipped (SKIP and NOTIFY).", st.skipped),
            ("ticks_notified", "MissedReminder events published for NOTIFY rows.", st.notified),
            ("repaired", "Long-overdue rows moved on in place by the repair pass.", st.repaired),
            ("cas_conflicts", "Schedule writes that lost a compare-and-swap.", st.cas_conflicts),
            ("persisted", "Schedule updates written to the table.", st.persisted),
            ("persist_failures", "Schedule writes that failed (retried).", st.persist_failures),
            ("refills", "Window refills from the table.", st.refills),
            ("table_read_errors", "Reads of the reminder table that failed.", st.load_errors),
            ("evicted", "Queued rows evicted from the window by earlier ones.", st.evicted),
        ):
            yield _counter(f"orleanspy_reminder_{name}_total", doc, value)
        for name, doc, value in (
            ("bucket_size", "The window's capacity (the adaptive bucket size).", st.bucket_size),
            ("window_rows", "Rows held in memory (queued and due).", st.resident),
            ("window_queued_rows", "Rows waiting in the due-heap for their time.", st.loaded),
            ("due_rows", "Due rows waiting for a delivery permit.", st.queued),
            ("in_flight", "Tick deliveries running.", st.in_flight),
            ("persist_pending", "Schedule updates waiting to be written.", st.persist_pending),
            ("owned_ranges", "Ring ranges this silo owns.", self._silo.owned_ranges),
        ):
            yield _gauge(f"orleanspy_reminder_{name}", doc, value)

    def _membership(self) -> Iterator[Metric]:
        health = self._silo.membership()
        if health is None:
            return
        by_status = health.by_status
        yield _labelled(
            "gauge", "orleanspy_membership_silos", "Silos in the membership table, by status.",
            "status", by_status,
        )  # fmt: skip
        for name, doc, value in (
            ("probes_sent", "Probes this silo sent to peers.", health.probes_sent),
            ("probes_failed", "Probes that went unanswered.", health.probes_failed),
            ("suspicions", "Suspect votes this silo wrote against peers.", health.suspicions),
            ("declared_dead", "Silos this silo declared Dead.", health.declared_dead),
        ):
            yield _counter(f"orleanspy_membership_{name}_total", doc, value)

    def _messaging(self) -> Iterator[Metric]:
        from orleanspy.messaging.transport import PeerCounters, QueueDepths, WireCounters

        transport = self._silo.transport
        if not isinstance(transport, WireCounters):
            return
        stats = transport.stats
        for name, doc in (
            ("frames_sent", "Frames (batches of messages) written."),
            ("messages_sent", "Messages written; divided by frames_sent, the batch size."),
            ("frames_received", "Frames read."),
            ("messages_received", "Messages read."),
        ):
            yield _counter(f"orleanspy_messaging_{name}_total", doc, getattr(stats, name))
        if isinstance(transport, PeerCounters):
            peers = transport.peer_stats
            for name, doc in (
                ("frames_sent", "Frames written to one peer silo."),
                ("messages_sent", "Messages written to one peer silo."),
                ("frames_received", "Frames read from one peer silo."),
                ("messages_received", "Messages read from one peer silo."),
            ):
                yield _labelled(
                    "counter", f"orleanspy_messaging_peer_{name}_total", doc, "peer",
                    {str(peer): getattr(s, name) for peer, s in peers.items()},
                )  # fmt: skip
        if isinstance(transport, QueueDepths):
            yield _labelled(
                "gauge", "orleanspy_messaging_queue_depth",
                "Messages queued for a peer silo (or 'clients' for gateway clients).",
                "peer", transport.queue_depths(),
            )  # fmt: skip


def render(silo: SiloReadings) -> bytes:
    """The silo's metrics (read from ``Silo.readings()``) in the Prometheus text format."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SiloCollector(silo))
    return generate_latest(registry)
