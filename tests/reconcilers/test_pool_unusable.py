"""A request that only a pool the provider refuses could serve waits for the pool's fix
(``Provisioned=False``, ``PoolUnusable``, naming the pool and its problem) and provisions
once the pool is fixed; one that would not fit even with that pool still fails
``CapacityNeverFits`` (controller/reconcilers/provisioning/plan.py ``no_fit``)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from controller.commands import objects
from controller.common.clock import ManualClock
from controller.kube import KubeClient
from controller.kube.resources import CAPACITY_POOLS, PROVISIONING_REQUESTS
from controller.operator import Controller
from providers.fake import FakeProvider
from tests.helpers import eventually

_until = functools.partial(eventually, within=20.0, step=0.02)


async def _condition(kube: KubeClient, name: str, type_: str) -> dict[str, Any] | None:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return next((c for c in (pr.get("status") or {}).get("conditions") or []
                 if c["type"] == type_), None)


async def _refused_pool(kube: KubeClient, controller: Controller, clock: ManualClock) -> None:
    # Racks of the "gpu" pool hold 16 nodes; only this pool's take a 20-worker gang.
    await kube.create(CAPACITY_POOLS, objects.gpu_pool(
        "wide", nodes_per_rack=32, parameters={"defaultStock": -1}))

    async def judged() -> bool:
        await clock.advance(1)
        return "wide" in controller.state.pool_registry.unusable_pools()

    await _until(judged)


async def test_a_request_waits_for_its_refused_pool_and_provisions_once_it_is_fixed(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider],
) -> None:
    controller, clock, _ = running
    await _refused_pool(kube, controller, clock)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "big", namespace="ns", pod_sets=[("workers", 20)]), namespace="ns")

    async def waiting() -> bool:
        await clock.advance(0.5)
        cond = await _condition(kube, "big", "Provisioned")
        return cond is not None and cond["reason"] == "PoolUnusable"

    await _until(waiting)
    cond = await _condition(kube, "big", "Provisioned")
    assert cond is not None and cond["status"] == "False"
    assert "CapacityPool wide (spec.parameters: " in cond["message"], cond["message"]
    assert "defaultStock" in cond["message"], cond["message"]
    # Past the arrival wait and several retries: still waiting, never failed.
    for _ in range(6):
        await clock.advance(20)
        await asyncio.sleep(0.1)
    assert await _condition(kube, "big", "Failed") is None
    cond = await _condition(kube, "big", "Provisioned")
    assert cond is not None and cond["reason"] == "PoolUnusable", cond

    await kube.merge_patch(CAPACITY_POOLS, "wide", {"spec": {"parameters": None}})

    async def provisioned() -> bool:
        await clock.advance(2)
        cond = await _condition(kube, "big", "Provisioned")
        return cond is not None and cond["status"] == "True"

    await _until(provisioned)
    assert "wide" not in controller.state.pool_registry.unusable_pools()


async def test_a_gang_the_refused_pool_could_not_hold_either_never_fits(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider],
) -> None:
    controller, clock, _ = running
    # Both pools name their racks b1-r1 ...: one rack holds 16 + 32 nodes at most.
    await _refused_pool(kube, controller, clock)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "huge", namespace="ns", pod_sets=[("workers", 60)]), namespace="ns")

    async def failed() -> bool:
        await clock.advance(1)
        return await _condition(kube, "huge", "Failed") is not None

    await _until(failed)
    cond = await _condition(kube, "huge", "Failed")
    assert cond is not None and cond["reason"] == "CapacityNeverFits", cond
    assert "wide" not in cond["message"], cond["message"]
