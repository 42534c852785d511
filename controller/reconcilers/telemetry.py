"""What the ProvisioningRequest controller reports besides conditions: Events and metrics.

* :class:`RequestTelemetry` is the service's transition hook: a status write that changed a
  condition's status or reason posts at most one Event (:func:`controller.common.conditions.
  event_of`) through the background recorder and counts the transition; Provisioned=True
  also observes the time since the request's creation.
* :func:`planner_pass_observer` times each planner pass.
* :func:`metered` wraps the reconcile worker to count outcomes.
* :func:`state_reading` reads the gauges at scrape time.

None of it can fail or slow a reconcile: events are queued, metrics are in memory, and a bug
here is logged, not raised.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from controller.common.conditions import ConditionType, Transition, event_of
from controller.common.metrics import ControllerMetrics, StateReading
from controller.kube import Body
from controller.kube.events import EventBroadcaster, EventRecorder
from controller.lifecycle import Phase
from controller.runtime.workqueue import Worker, WorkQueue
from controller.state.cache import ClusterState

log = logging.getLogger(__name__)

PHASE_LABELS: Mapping[Phase, str] = {
    Phase.NEW: "Pending",
    Phase.ACQUIRING: "Acquiring",
    Phase.BOOKED: "Booked",
    Phase.FAILED: "Failed",
    Phase.ENDED: "Ended",
}


class RequestTelemetry:
    def __init__(
        self,
        *,
        recorder: EventRecorder | None,
        metrics: ControllerMetrics | None,
        now: Callable[[], datetime],
    ) -> None:
        self.recorder = recorder
        self.metrics = metrics
        self.now = now

    def __call__(self, body: Body, changes: Sequence[Transition]) -> None:
        try:
            self._record(body, changes)
        except Exception:  # reporting must never fail the reconcile that wrote the status
            log.exception("recording the transition of %s failed",
                          (body.get("metadata") or {}).get("name"))

    def _record(self, body: Body, changes: Sequence[Transition]) -> None:
        if self.metrics is not None:
            for t in changes:
                self.metrics.transitions.labels(
                    t.type, "True" if t.status else "False", t.reason).inc()
                if t.type == ConditionType.PROVISIONED and t.status:
                    created = _timestamp((body.get("metadata") or {}).get("creationTimestamp"))
                    if created is not None:
                        # The API server's clock stamped creation; ours may run a little
                        # behind it, which must not become a negative duration.
                        elapsed = (self.now() - created).total_seconds()
                        self.metrics.time_to_provisioned.observe(max(0.0, elapsed))
        if self.recorder is not None:
            event = event_of(changes)
            if event is not None:
                type_, t = event
                self.recorder.event(body, type_, t.reason, t.message)


def _timestamp(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def planner_pass_observer(metrics: ControllerMetrics) -> Callable[[int, float], None]:
    """The planner's ``on_pass``: counts and times its passes."""

    def observe(_requests: int, seconds: float) -> None:
        metrics.planner_passes.inc()
        metrics.planner_pass_seconds.observe(seconds)

    return observe


def metered(worker: Worker, metrics: ControllerMetrics) -> Worker:
    """``worker`` counting its outcomes: done (returned None), requeued (a delay), error."""
    outcomes = metrics.reconciles
    done, requeued, error = (outcomes.labels(o) for o in ("done", "requeued", "error"))

    async def run(key: str) -> float | None:
        try:
            delay = await worker(key)
        except asyncio.CancelledError:
            raise
        except Exception:
            error.inc()
            raise
        (done if delay is None else requeued).inc()
        return delay

    return run


def state_reading(
    *,
    state: ClusterState,
    served: Callable[[str], bool],
    in_flight: Callable[[], int],
    queue: WorkQueue,
    events: EventBroadcaster | None,
) -> Callable[[], StateReading]:
    """The scrape-time reader of the controller's gauges; ``served`` tells whether a class
    name is one of Muster's (requests of other classes are not counted)."""

    def read() -> StateReading:
        phases: Counter[str] = Counter({label: 0 for label in PHASE_LABELS.values()})
        for req in list(state.objects.requests().values()):
            if served(req.class_name):
                phases[PHASE_LABELS.get(req.phase, str(req.phase))] += 1
        return StateReading(
            requests_by_phase=phases,
            bookings=len(state.ledger.bookings()),
            acquisitions_in_flight=in_flight(),
            queue_depth=queue.depth,
            reconciles_running=queue.running,
            events={} if events is None else {
                "created": events.created, "aggregated": events.aggregated,
                "dropped": events.dropped, "failed": events.failed,
            },
        )

    return read
