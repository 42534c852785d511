"""A crash or a failed write at any point is repaired by the next reconcile.

Every outcome Muster decides (failed, booked, booking ended) must reach the request's status
even when the API server refuses one of the writes (a 503 on the status PATCH) or the process
dies between two writes: the user, and Kueue, only ever read the status.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

from controller.commands import objects
from controller.common.clock import ManualClock
from controller.config import MusterConfig
from controller.kube import KubeClient
from controller.kube.resources import NODES, POD_TEMPLATES, PROVISIONING_REQUESTS
from controller.operator import Controller
from controller.state.bookings import Booking
from providers.fake import FakeProvider
from sandbox.server import SandboxServer
from tests.cluster_objects import gpu_node
from tests.helpers import eventually

_until = functools.partial(eventually, within=15.0, step=0.02)
STATUS = "provisioningrequests/status"


async def _condition(kube: KubeClient, name: str, type_: str) -> dict[str, Any] | None:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return next((c for c in (pr.get("status") or {}).get("conditions") or []
                 if c["type"] == type_ and c["status"] == "True"), None)


def _ticking(clock: ManualClock, probe: Any) -> Any:
    """``probe``, advancing virtual time a little first: the controller's retry after a
    failed write waits on its clock."""
    async def run() -> Any:
        await clock.advance(1)
        return await probe()

    return run


async def test_a_503_on_the_failed_status_still_ends_failed(
    server: SandboxServer, kube: KubeClient,
    running: tuple[Controller, ManualClock, FakeProvider],
) -> None:
    _, clock, _ = running
    server.faults.add_errors(1.0, status=503, verbs="patch", resources=STATUS, times=1)
    # 20 workers in one rack of at most 16 nodes: never fits.
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "huge", namespace="ns", pod_sets=[("workers", 20)]), namespace="ns")

    failed = await _until(_ticking(clock, lambda: _condition(kube, "huge", "Failed")))
    assert failed["reason"] == "CapacityNeverFits"
    assert server.faults.injected == 1


async def test_a_crash_between_the_writes_of_a_failure_is_repaired_on_restart(
    server: SandboxServer, kube: KubeClient,
    running: tuple[Controller, ManualClock, FakeProvider],
) -> None:
    first, first_clock, _ = running
    server.faults.add_errors(1.0, status=503, verbs="patch", resources=STATUS)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "huge", namespace="ns", pod_sets=[("workers", 20)]), namespace="ns")

    async def tried() -> bool:
        return server.faults.injected >= 1

    # The failure is written once retry.arrival_wait_seconds have passed.
    await _until(_ticking(first_clock, tried))
    await first.stop()  # the process dies here, the status never written
    server.faults.clear()
    clock = ManualClock(start=datetime.now(UTC))
    second = Controller(kube=kube, config=MusterConfig(), clock=clock,
                        providers={"kind": FakeProvider(kube, heartbeat_seconds=3600)})
    await second.start()
    try:
        failed = await _until(_ticking(clock, lambda: _condition(kube, "huge", "Failed")))
        assert failed["reason"] == "CapacityNeverFits"
    finally:
        await second.stop()


async def test_a_503_on_confirming_a_booking_of_existing_nodes_still_provisions(
    server: SandboxServer, kube: KubeClient,
    running: tuple[Controller, ManualClock, FakeProvider],
) -> None:
    controller, clock, provider = running
    for i in range(2):
        await kube.create(NODES, gpu_node(f"old-{i}", "b1-r1"))

    async def cached() -> bool:
        return all(controller.state.objects.node_exists(f"old-{i}") for i in range(2))

    await _until(cached)
    server.faults.add_errors(1.0, status=503, verbs="patch", resources=STATUS, times=1)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "fits", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")

    booked = await _until(_ticking(clock, lambda: _condition(kube, "fits", "Provisioned")))
    assert booked["reason"] == "CapacityIsFound"
    assert server.faults.injected == 1
    assert not [c for c in provider.calls if c.op == "acquire"]


async def test_a_503_on_ending_a_booking_still_says_it_expired_and_releases(
    server: SandboxServer, kube: KubeClient,
    running: tuple[Controller, ManualClock, FakeProvider],
) -> None:
    _, clock, _ = running
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "gang", namespace="ns", pod_sets=[("workers", 3)]), namespace="ns")
    await _until(lambda: _condition(kube, "gang", "Provisioned"))
    server.faults.add_errors(1.0, status=503, verbs="patch", resources=STATUS, times=1)
    await clock.advance(600)  # booking.duration_seconds

    expired = await _until(_ticking(clock, lambda: _condition(kube, "gang", "BookingExpired")))
    assert expired["reason"] == "CapacityReservationTimeExpired"
    assert server.faults.injected == 1

    async def released() -> bool:
        return not (await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]

    await _until(released)


async def _half_gpu_template(kube: KubeClient) -> None:
    """Pods of half a node: a second request can book the other half of a node the first
    one acquired."""
    await kube.create(POD_TEMPLATES, objects.pod_template(
        "half", namespace="ns", requests={"cpu": "40", objects.GPU: "4"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
    ), namespace="ns")


async def _booked_on(kube: KubeClient, name: str) -> list[str]:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    plan = (pr["metadata"].get("annotations") or {}).get("muster.dev/plan")
    if not plan:
        return []
    return sorted(n for n in Booking.from_annotation(plan).existing_nodes)


async def test_a_node_another_booking_counts_on_outlives_the_booking_that_acquired_it(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider],
) -> None:
    controller, clock, provider = running
    await _half_gpu_template(kube)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "first", namespace="ns", pod_sets=[("half", 1)]), namespace="ns")
    await _until(lambda: _condition(kube, "first", "Provisioned"))
    acquired = [n["metadata"]["name"] for n in
                (await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]]
    assert len(acquired) == 1

    await clock.advance(300)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "second", namespace="ns", pod_sets=[("half", 1)]), namespace="ns")
    second = await _until(lambda: _condition(kube, "second", "Provisioned"))
    assert second["reason"] == "CapacityIsFound"
    assert await _booked_on(kube, "second") == acquired

    # The first booking expires (its unused nodes are released) and its request goes; the
    # second still counts on the node.
    await clock.advance(300)
    await _until(lambda: _condition(kube, "first", "BookingExpired"))
    await kube.delete(PROVISIONING_REQUESTS, "first", namespace="ns")

    async def first_gone() -> bool:
        return controller.state.objects.request("ns/first") is None

    await _until(first_gone)
    assert not await controller.collector.run_once()
    await clock.advance(controller.config.acquisition.idle_ttl_seconds)
    assert not await controller.collector.run_once()
    still = [n["metadata"]["name"] for n in
             (await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]]
    assert still == acquired
    assert await _condition(kube, "second", "CapacityRevoked") is None
    assert not [c for c in provider.calls if c.op == "release" and c.count]
