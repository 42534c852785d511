"""Prometheus metrics of one controller, in its own registry.

Each :class:`ControllerMetrics` owns a ``CollectorRegistry`` rather than using the process
global one, so tests and ``muster demo``, which run several controllers in one process, never
collide on metric names. Counters and histograms are updated where things happen (reconcile
outcomes, provider calls, planner passes, condition transitions); gauges of the current state
(requests by phase, bookings, in-flight acquisitions, work-queue depth, event counters) are
read from the controller only when scraped, so keeping them costs nothing per reconcile.

``muster run`` serves :meth:`ControllerMetrics.exposition` at ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The classic text format every Prometheus version scrapes."""

PROVISIONING_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                        1200.0, 1800.0, 3600.0)
"""From a request that fits existing nodes (sub-second) to cloud boots of large gangs."""
PLANNER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True, slots=True)
class StateReading:
    """The controller's current state, read at scrape time."""

    requests_by_phase: Mapping[str, int]
    bookings: int
    acquisitions_in_flight: int
    queue_depth: int
    reconciles_running: int
    events: Mapping[str, int] = field(default_factory=dict)
    """Event recorder counters by result (created, aggregated, dropped, failed)."""


class _StateCollector:
    def __init__(self, read: Callable[[], StateReading]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        s = self._read()
        phases = GaugeMetricFamily(
            "muster_requests", "ProvisioningRequests of Muster's classes by phase.",
            labels=["phase"],
        )
        for phase, count in sorted(s.requests_by_phase.items()):
            phases.add_metric([phase], count)
        yield phases
        yield GaugeMetricFamily("muster_bookings",
                                "Requests holding booked capacity (planned, acquiring or booked).",
                                value=s.bookings)
        yield GaugeMetricFamily("muster_acquisitions_in_flight",
                                "Acquisition keys with provider calls running in this process.",
                                value=s.acquisitions_in_flight)
        yield GaugeMetricFamily("muster_workqueue_depth",
                                "Request keys waiting for a reconcile worker.",
                                value=s.queue_depth)
        yield GaugeMetricFamily("muster_reconciles_running",
                                "Reconciles running now.", value=s.reconciles_running)
        events = CounterMetricFamily(
            "muster_events", "Kubernetes Events by result: created, aggregated (count "
            "PATCHed on a repeat), dropped (queue full), failed (API error).",
            labels=["result"],
        )
        for result, count in sorted(s.events.items()):
            events.add_metric([result], count)
        yield events


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.reconciles = Counter(
            "muster_reconciles", "ProvisioningRequest reconciles by outcome: done (nothing "
            "more to do), requeued (runs again later), error (raised; retried with backoff).",
            ["outcome"], registry=r,
        )
        self.provider_acquisitions = Counter(
            "muster_provider_acquisitions", "Provider acquire calls (one per pool and domain "
            "group) by pool and result (success, or the provider error's reason).",
            ["pool", "result"], registry=r,
        )
        self.provider_releases = Counter(
            "muster_provider_releases", "Provider release calls by pool and result.",
            ["pool", "result"], registry=r,
        )
        self.nodes_acquired = Counter(
            "muster_nodes_acquired", "Nodes returned by successful provider acquire calls.",
            ["pool"], registry=r,
        )
        self.nodes_released = Counter(
            "muster_nodes_released", "Nodes deleted by provider release calls.",
            ["pool"], registry=r,
        )
        self.time_to_provisioned = Histogram(
            "muster_request_time_to_provisioned_seconds",
            "Time from a request's creationTimestamp to Provisioned=True (second resolution: "
            "creationTimestamp has no fraction).",
            buckets=PROVISIONING_BUCKETS, registry=r,
        )
        self.transitions = Counter(
            "muster_request_condition_transitions",
            "Condition transitions Muster wrote on requests, by condition, status and reason.",
            ["condition", "status", "reason"], registry=r,
        )
        self.planner_passes = Counter(
            "muster_planner_passes", "Planner passes (each plans every waiting request "
            "against one snapshot).", registry=r,
        )
        self.planner_pass_seconds = Histogram(
            "muster_planner_pass_duration_seconds", "Duration of one planner pass.",
            buckets=PLANNER_BUCKETS, registry=r,
        )
        self.pool_status_writes = Counter(
            "muster_pool_status_writes", "CapacityPool status writes by result (written, "
            "conflict, error); bounded by pool_status.max_writes_per_second.",
            ["result"], registry=r,
        )
        self._state: _StateCollector | None = None

    def watch_state(self, read: Callable[[], StateReading]) -> None:
        """Export the gauges from ``read``, called once per scrape."""
        if self._state is not None:
            self.registry.unregister(self._state)
        self._state = _StateCollector(read)
        self.registry.register(self._state)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (what ``/metrics`` serves)."""
        return generate_latest(self.registry)
