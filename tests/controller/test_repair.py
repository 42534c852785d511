"""A crash or a failed write at any point is repaired by the next reconcile.

Every outcome Muster decides (failed, booked, booking ended) must reach the request's status
even when the API server refuses one of the writes (a 503 on the status PATCH) or the process
dies between two writes: the user, and Kueue, only ever read the status.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

from controller.clock import ManualClock
from controller.commands import objects
from controller.config import MusterConfig
from controller.kube import KubeClient
from controller.kube.resources import NODES, PROVISIONING_REQUESTS
from controller.reconcilers.operator import Controller
from providers.kind import KindProvider
from sandbox.server import SandboxServer
from tests.controller.builders import gpu_node
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
    running: tuple[Controller, ManualClock, KindProvider],
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
    running: tuple[Controller, ManualClock, KindProvider],
) -> None:
    first, _, _ = running
    server.faults.add_errors(1.0, status=503, verbs="patch", resources=STATUS)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "huge", namespace="ns", pod_sets=[("workers", 20)]), namespace="ns")

    async def tried() -> bool:
        return server.faults.injected >= 1

    await _until(tried)
    await first.stop()  # the process dies here, the status never written
    server.faults.clear()
    clock = ManualClock(start=datetime.now(UTC))
    second = Controller(kube=kube, config=MusterConfig(), clock=clock,
                        providers={"kind": KindProvider(kube, heartbeat_seconds=3600)},
                        use_kopf=False)
    await second.start()
    try:
        failed = await _until(_ticking(clock, lambda: _condition(kube, "huge", "Failed")))
        assert failed["reason"] == "CapacityNeverFits"
    finally:
        await second.stop()


async def test_a_503_on_confirming_a_booking_of_existing_nodes_still_provisions(
    server: SandboxServer, kube: KubeClient,
    running: tuple[Controller, ManualClock, KindProvider],
) -> None:
    controller, clock, provider = running
    for i in range(2):
        await kube.create(NODES, gpu_node(f"old-{i}", "b1-r1"))

    async def cached() -> bool:
        return all(controller.state.node_exists(f"old-{i}") for i in range(2))

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
    running: tuple[Controller, ManualClock, KindProvider],
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
