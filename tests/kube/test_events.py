"""Kubernetes Events on ProvisioningRequests, as ``kubectl describe`` shows them.

Against the API sandbox: a provisioned request carries one Normal event, a request that can
never fit a Warning; repeats are aggregated into one Event's count (client-go's correlator);
a slow or hung events API never holds a reconcile, and a full queue drops events instead.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from controller.commands import objects
from controller.common.clock import ManualClock
from controller.common.conditions import Transition, event_of, transitions
from controller.config import MusterConfig
from controller.kube import KubeClient
from controller.kube.events import EventBroadcaster, ObjectReference
from controller.kube.resources import (
    CAPACITY_POOLS,
    EVENTS,
    NAMESPACES,
    POD_TEMPLATES,
    PROVISIONING_REQUESTS,
)
from controller.operator import Controller
from providers.fake import FakeProvider
from sandbox.server import SandboxServer
from tests.helpers import eventually

_until = functools.partial(eventually, within=10.0, step=0.02)


async def _world(kube: KubeClient) -> None:
    await kube.create(NAMESPACES, {"metadata": {"name": "ns"}})
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu"))  # 16 nodes per rack at most
    await kube.create(POD_TEMPLATES, objects.pod_template(
        "workers", namespace="ns", requests={"cpu": "90", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
    ), namespace="ns")


@pytest.fixture
async def running(kube: KubeClient) -> AsyncIterator[Controller]:
    await _world(kube)
    # Virtual time from now: a request's age is measured against its creationTimestamp.
    controller = Controller(kube=kube, config=MusterConfig(),
                            clock=ManualClock(start=datetime.now(UTC)),
                            providers={"kind": FakeProvider(kube, heartbeat_seconds=3600)})
    await controller.start()
    try:
        yield controller
    finally:
        await controller.stop()


async def _events_of(kube: KubeClient, name: str) -> list[dict[str, Any]]:
    items = (await kube.list(EVENTS, namespace="ns")).get("items") or []
    return [e for e in items if e["involvedObject"]["name"] == name]


async def _provisioned(kube: KubeClient, name: str) -> bool:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return any(c["type"] == "Provisioned" and c["status"] == "True"
               for c in (pr.get("status") or {}).get("conditions") or [])


async def test_provisioned_request_shows_one_normal_event(
    kube: KubeClient, running: Controller
) -> None:
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "gang", namespace="ns", pod_sets=[("workers", 3)]), namespace="ns")
    await _until(lambda: _provisioned(kube, "gang"))
    events = await _until(lambda: _events_of(kube, "gang"))
    pr = await kube.get(PROVISIONING_REQUESTS, "gang", namespace="ns")

    assert len(events) == 1, "the happy path costs one event (Accepted/Provisioning are not)"
    ev = events[0]
    assert (ev["type"], ev["reason"]) == ("Normal", "CapacityIsProvisioned")
    assert "3 new node(s)" in ev["message"]
    assert ev["involvedObject"]["kind"] == "ProvisioningRequest"
    assert ev["involvedObject"]["uid"] == pr["metadata"]["uid"]
    assert ev["involvedObject"]["resourceVersion"], "the version the event is about"
    assert ev["source"]["component"] == ev["reportingComponent"] == "muster"
    assert ev["count"] == 1 and ev["firstTimestamp"] == ev["lastTimestamp"]


async def test_request_that_never_fits_shows_a_warning(
    kube: KubeClient, running: Controller
) -> None:
    # 20 workers required in one rack; no rack of the pool holds more than 16 nodes.
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "huge", namespace="ns", pod_sets=[("workers", 20)]), namespace="ns")
    clock = running.clock
    assert isinstance(clock, ManualClock)

    async def events_after_the_arrival_wait() -> list[dict[str, Any]]:
        await clock.advance(1)  # the verdict waits retry.arrival_wait_seconds
        return await _events_of(kube, "huge")

    events = await _until(events_after_the_arrival_wait)
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "CapacityNeverFits")], (
        "one Warning: the Provisioned=False written with Failed adds no second event")
    assert "can never fit" in events[0]["message"]


async def test_a_hung_events_api_holds_no_reconcile_and_a_full_queue_drops(
    server: SandboxServer, kube: KubeClient
) -> None:
    await _world(kube)
    server.faults.add_latency(5.0, resources="events")
    controller = Controller(kube=kube, config=MusterConfig(), clock=ManualClock(),
                            providers={"kind": FakeProvider(kube, heartbeat_seconds=3600)},
                            event_queue_size=1)
    await controller.start()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for name in ("a", "b", "c"):
            await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
                name, namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")

        async def all_provisioned() -> bool:
            return all([await _provisioned(kube, n) for n in ("a", "b", "c")])

        await _until(all_provisioned)
        assert loop.time() - started < 4.0, "a reconcile waited for an event"
        # One event in the sender (stuck in the 5 s call), one queued, the third dropped.
        assert controller.events.dropped == 1
        assert controller.events.created == 0
    finally:
        await controller.stop()


async def test_repeats_are_aggregated_into_one_event(kube: KubeClient) -> None:
    await kube.create(NAMESPACES, {"metadata": {"name": "ns"}})
    clock = ManualClock()
    broadcaster = EventBroadcaster(kube, now=clock.now)
    recorder = broadcaster.recorder("muster")
    ref = ObjectReference(api_version="autoscaling.x-k8s.io/v1", kind="ProvisioningRequest",
                          name="gang", namespace="ns", uid="u-1", resource_version="7")
    broadcaster.start()
    try:
        recorder.event(ref, "Warning", "CapacityIsNotFound", "no rack has 4 free nodes")
        await clock.advance(30)
        recorder.event(ref, "Warning", "CapacityIsNotFound", "no rack has 4 free nodes")
        recorder.event(ref, "Warning", "CapacityIsNotFound", "no rack has 4 free nodes")
        recorder.event(ref, "Warning", "CapacityIsNotFound", "another message")
        await broadcaster.flush()
    finally:
        await broadcaster.stop()

    events = sorted(await _events_of(kube, "gang"), key=lambda e: e["count"])
    assert [(e["message"], e["count"]) for e in events] == [
        ("another message", 1), ("no rack has 4 free nodes", 3)]
    repeated = events[1]
    assert repeated["firstTimestamp"] == "2026-01-01T00:00:00Z"
    assert repeated["lastTimestamp"] == "2026-01-01T00:00:30Z"
    assert (broadcaster.created, broadcaster.aggregated) == (2, 2)


async def test_a_repeat_after_the_aggregation_window_is_a_new_event(kube: KubeClient) -> None:
    # The aggregation cache holds events of requests long deleted unless it forgets by age:
    # a long-running controller's memory then grows until 4096 of them are remembered.
    await kube.create(NAMESPACES, {"metadata": {"name": "ns"}})
    clock = ManualClock()
    broadcaster = EventBroadcaster(kube, now=clock.now)  # 10 minutes
    recorder = broadcaster.recorder("muster")
    gang = ObjectReference(api_version="v1", kind="Pod", name="gang", namespace="ns")
    broadcaster.start()
    try:
        recorder.event(gang, "Warning", "CapacityIsNotFound", "no rack")
        for other in range(20):  # requests that come and go, never to repeat an event
            recorder.event(ObjectReference(api_version="v1", kind="Pod", name=f"p{other}",
                                           namespace="ns"), "Normal", "Started", "started")
        await clock.advance(599)
        recorder.event(gang, "Warning", "CapacityIsNotFound", "no rack")
        await broadcaster.flush()
        assert broadcaster.remembered == 21
        await clock.advance(601)
        recorder.event(gang, "Warning", "CapacityIsNotFound", "no rack")
        await broadcaster.flush()
        assert broadcaster.remembered == 1
    finally:
        await broadcaster.stop()
    events = sorted(await _events_of(kube, "gang"), key=lambda e: e["firstTimestamp"])
    assert [(e["count"], e["firstTimestamp"], e["lastTimestamp"]) for e in events] == [
        (2, "2026-01-01T00:00:00Z", "2026-01-01T00:09:59Z"),
        (1, "2026-01-01T00:20:00Z", "2026-01-01T00:20:00Z")]


async def test_an_expired_event_is_created_again(kube: KubeClient) -> None:
    await kube.create(NAMESPACES, {"metadata": {"name": "ns"}})
    broadcaster = EventBroadcaster(kube, now=ManualClock().now)
    recorder = broadcaster.recorder("muster")
    ref = ObjectReference(api_version="v1", kind="Pod", name="p", namespace="ns")
    broadcaster.start()
    try:
        recorder.event(ref, "Normal", "Started", "started")
        await broadcaster.flush()
        (first,) = await _events_of(kube, "p")
        await kube.delete(EVENTS, first["metadata"]["name"], namespace="ns")  # the TTL ran out
        recorder.event(ref, "Normal", "Started", "started")
        await broadcaster.flush()
    finally:
        await broadcaster.stop()
    (again,) = await _events_of(kube, "p")
    assert again["count"] == 1 and again["metadata"]["name"] != first["metadata"]["name"]


async def test_failing_events_api_is_counted_not_raised(
    server: SandboxServer, kube: KubeClient
) -> None:
    server.faults.add_errors(1.0, status=500, resources="events")
    broadcaster = EventBroadcaster(kube, now=ManualClock().now)
    broadcaster.start()
    try:
        ok = broadcaster.recorder("muster").event(
            ObjectReference(api_version="v1", kind="Pod", name="p", namespace="default"),
            "Normal", "Started", "started")
        await broadcaster.flush()
    finally:
        await broadcaster.stop()
    assert ok and (broadcaster.failed, broadcaster.created) == (1, 0)


def test_bad_events_are_refused_with_a_clear_error() -> None:
    recorder = EventBroadcaster(None, now=ManualClock().now).recorder("muster")  # type: ignore[arg-type]
    ref = ObjectReference(api_version="v1", kind="Pod", name="p", namespace="default")
    with pytest.raises(ValueError, match="Normal or Warning"):
        recorder.event(ref, "Error", "Boom", "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a reason"):
        recorder.event(ref, "Normal", "", "x")
    with pytest.raises(ValueError, match=r"kind and metadata\.name"):
        recorder.event({"metadata": {}}, "Normal", "R", "x")
    with pytest.raises(ValueError, match="queue_size"):
        EventBroadcaster(None, now=ManualClock().now, queue_size=0)  # type: ignore[arg-type]


def _cond(type_: str, status: str, reason: str, message: str = "m") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def test_which_transitions_are_events() -> None:
    accepted = _cond("Accepted", "True", "Accepted")
    provisioning = _cond("Provisioned", "False", "Provisioning")
    # Routine steps of the happy path are no event.
    assert event_of(transitions([], [accepted, provisioning])) is None
    done = event_of(transitions([accepted, provisioning],
                                [accepted, _cond("Provisioned", "True", "CapacityIsProvisioned")]))
    assert done is not None and (done[0], done[1].reason) == ("Normal", "CapacityIsProvisioned")
    # A retry is a Warning once; the next attempt's new message alone is no transition.
    retrying = _cond("Provisioned", "False", "CapacityIsNotFound", "attempt 1")
    warn = event_of(transitions([accepted], [accepted, retrying]))
    assert warn is not None and warn[0] == "Warning"
    assert transitions([retrying], [_cond("Provisioned", "False", "CapacityIsNotFound",
                                          "attempt 2")]) == []
    # Failed wins over the Provisioned=False written with it.
    failed = event_of(transitions([accepted, retrying], [
        accepted, _cond("Provisioned", "False", "RetriesExhausted"),
        _cond("Failed", "True", "RetriesExhausted")]))
    assert failed == ("Warning", Transition("Failed", True, "RetriesExhausted", "m"))
    expired = event_of(transitions(
        [], [_cond("BookingExpired", "True", "CapacityBookingConsumed")]))
    revoked = event_of(transitions([], [_cond("CapacityRevoked", "True", "BookedNodesVanished")]))
    assert expired is not None and expired[0] == "Normal"
    assert revoked is not None and revoked[0] == "Warning"
