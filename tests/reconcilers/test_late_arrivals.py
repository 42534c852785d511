"""A request that arrives before its PodTemplate, the ResourceClaimTemplate or DeviceClass
its pods claim through, or the CapacityPool that lets it fit (separate watch streams, or a
client that creates the request first) waits for them a little
(``retry.arrival_wait_seconds``) instead of failing at once, and is planned as soon as its
watch brings what it waits for; what never comes still fails the request, naming what to
create (controller/reconcilers/provisioning/plan.py).

Real Kueue (path A) creates the templates and then the request; under load Muster saw the
request first and failed it with FailedToCreatePods (benchmarks/kueue_bench.py, 1 Workload
in 200 on the real cluster), which costs the Workload an eviction and Kueue's retry backoff.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from controller.commands import objects
from controller.common.clock import ManualClock
from controller.inputs.dra_templates import NVIDIA_DRIVER, nvidia_gpu_node
from controller.kube import KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    DEVICE_CLASSES,
    POD_TEMPLATES,
    PROVISIONING_REQUESTS,
    RESOURCE_CLAIM_TEMPLATES,
)
from controller.operator import Controller
from providers.fake import FakeProvider
from tests.helpers import eventually

_until = functools.partial(eventually, within=10.0, step=0.02)


async def _condition(kube: KubeClient, name: str, type_: str) -> dict[str, Any] | None:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return next((c for c in (pr.get("status") or {}).get("conditions") or []
                 if c["type"] == type_), None)


async def _late_template(kube: KubeClient) -> None:
    await kube.create(POD_TEMPLATES, objects.pod_template(
        "late", namespace="ns", requests={"cpu": "90", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
    ), namespace="ns")


async def _late_pool(kube: KubeClient) -> None:
    # Racks of the "gpu" pool hold 16 nodes; only this pool's take the 20-worker gang.
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("wide", nodes_per_rack=32))


DRA_POOL = "dra"
GPU_CLASS = "late-gpu"


async def _dra_world(kube: KubeClient, *, device_class: bool, claim_template: bool) -> None:
    """A pool whose nodes publish 8 GPUs, a "claims" template whose pods each claim one
    through the ResourceClaimTemplate "one-gpu" of DeviceClass late-gpu, and whichever of
    those two the case does not create late."""
    pool = objects.gpu_pool(DRA_POOL, blocks=1, racks_per_block=1, nodes_per_rack=4,
                            max_nodes=4)
    pool["spec"]["nodeTemplate"]["allocatable"].pop(objects.GPU)
    pool["spec"]["nodeTemplate"]["resourceSlices"] = nvidia_gpu_node(gpus=8, nics=0)
    await kube.create(CAPACITY_POOLS, pool)
    worker = objects.pod_template("claims", namespace="ns", requests={"cpu": "8"},
                                  tolerations=[objects.GPU_TOLERATION])
    spec = worker["template"]["spec"]
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    spec["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    await kube.create(POD_TEMPLATES, worker, namespace="ns")
    if device_class:
        await _late_device_class(kube)
    if claim_template:
        await _late_claim_template(kube)


async def _late_device_class(kube: KubeClient) -> None:
    await kube.create(DEVICE_CLASSES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": GPU_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NVIDIA_DRIVER}"'}}]},
    })


async def _late_claim_template(kube: KubeClient) -> None:
    await kube.create(RESOURCE_CLAIM_TEMPLATES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "ns"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}},
        ]}}},
    }, namespace="ns")


Setup = Callable[[KubeClient], Awaitable[None]]


async def _nothing(kube: KubeClient) -> None:
    return None


LATE: dict[str, tuple[tuple[str, int], Setup, Setup, str, str]] = {
    # what arrives late: (the request's pod set, what exists before, what creates it late,
    # the reason if it never does, the object that message names)
    "template": (("late", 2), _nothing, _late_template, "FailedToCreatePods",
                 "PodTemplate ns/late"),
    "pool": (("workers", 20), _nothing, _late_pool, "CapacityNeverFits", ""),
    "claim-template": (("claims", 2), functools.partial(
        _dra_world, device_class=True, claim_template=False), _late_claim_template,
        "FailedToCreatePods", "ResourceClaimTemplate ns/one-gpu"),
    "device-class": (("claims", 2), functools.partial(
        _dra_world, device_class=False, claim_template=True), _late_device_class,
        "FailedToCreatePods", f"DeviceClass {GPU_CLASS}"),
}


async def _created_and_waiting(kube: KubeClient, clock: ManualClock, name: str,
                               pod_set: tuple[str, int], advance: float) -> None:
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        name, namespace="ns", pod_sets=[pod_set]), namespace="ns")
    await clock.advance(advance)
    await asyncio.sleep(0.3)
    assert await _condition(kube, name, "Failed") is None


@pytest.mark.parametrize("kind", sorted(LATE))
async def test_what_arrives_after_its_request_is_waited_for(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider], kind: str
) -> None:
    """``kubectl apply`` of a request with its template or pool, whose watch events reach
    Muster in either order: what arrives within the wait is used."""
    _, clock, _ = running
    pod_set, before, create, _, _ = LATE[kind]
    await before(kube)
    await _created_and_waiting(kube, clock, "early", pod_set, 1)
    await create(kube)

    async def provisioned() -> bool:
        await clock.advance(0.5)
        cond = await _condition(kube, "early", "Provisioned")
        return cond is not None and cond["status"] == "True"

    await _until(provisioned)
    assert await _condition(kube, "early", "Failed") is None


@pytest.mark.parametrize("kind", sorted(LATE))
async def test_what_never_comes_fails_the_request_after_the_wait(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider], kind: str
) -> None:
    controller, clock, _ = running
    pod_set, before, _, reason, missing = LATE[kind]
    await before(kube)
    await _created_and_waiting(kube, clock, "orphan", pod_set,
                               controller.config.retry.arrival_wait_seconds / 2)

    async def failed() -> dict[str, Any] | None:
        await clock.advance(1)
        return await _condition(kube, "orphan", "Failed")

    cond = await _until(failed)
    assert cond["reason"] == reason, cond
    if missing:
        assert f"{missing} not found" in cond["message"], cond
        assert f"Create {missing}, then recreate the request" in cond["message"], cond


@pytest.mark.parametrize("kind", sorted(LATE))
async def test_an_arrival_plans_the_waiting_request_at_once(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider], kind: str
) -> None:
    """The watch event that brings what a request waits for plans it again: no timer has to
    fire (the virtual clock stands still after the request is seen waiting)."""
    controller, clock, _ = running
    pod_set, before, create, _, _ = LATE[kind]
    await before(kube)
    await _created_and_waiting(kube, clock, "early", pod_set, 1)
    await create(kube)

    async def planned() -> bool:
        pr = await kube.get(PROVISIONING_REQUESTS, "early", namespace="ns")
        return "muster.dev/plan" in (pr["metadata"].get("annotations") or {})

    await _until(planned)
    assert not controller.state.waiting_for("ns/early")
    assert await _condition(kube, "early", "Failed") is None


async def test_the_wait_for_a_template_is_the_configured_one(kube: KubeClient) -> None:
    from datetime import UTC, datetime

    from controller.config import load_config
    from controller.kube.resources import NAMESPACES

    await kube.create(NAMESPACES, {"metadata": {"name": "ns"}})
    clock = ManualClock(start=datetime.now(UTC))
    cfg = load_config(retry={"arrival_wait_seconds": 60})
    controller = Controller(kube=kube, config=cfg, clock=clock,
                            providers={"kind": FakeProvider(kube, heartbeat_seconds=3600)})
    await controller.start()
    try:
        await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
            "patient", namespace="ns", pod_sets=[("absent", 2)]), namespace="ns")
        # Past the default 10 s, within the configured 60 s: still waiting.
        await clock.advance(40)
        await asyncio.sleep(0.5)
        assert await _condition(kube, "patient", "Failed") is None

        async def failed() -> dict[str, Any] | None:
            await clock.advance(2)
            return await _condition(kube, "patient", "Failed")

        cond = await _until(failed)
        assert cond["reason"] == "FailedToCreatePods"
    finally:
        await controller.stop()

