"""The collector releases what no booking protects: orphans now, idle gangs after the TTL."""

from __future__ import annotations

from typing import Any

from controller.acquire.collector import Collector
from controller.acquire.providers import ProviderSet
from controller.api.capacitypool import CapacityPool
from controller.clock import ManualClock
from controller.commands import objects
from controller.kube import KubeClient
from controller.kube.resources import CAPACITY_POOLS
from controller.state.bookings import (
    PHASE_ANNOTATION,
    PLAN_ANNOTATION,
    Booking,
    Group,
    Phase,
)
from controller.state.cache import CONSUME_ANNOTATION, ClusterState
from controller.topology_defaults import DEFAULT_LEVELS
from providers.base import AcquireRequest
from providers.kind import KindProvider
from providers.registry import ProviderContext
from tests.controller.builders import plan_on

R1 = {objects.BLOCK: "b1", objects.RACK: "b1-r1"}


def _request(name: str, uid: str, phase: Phase, key: str) -> dict[str, Any]:
    booking = Booking(plan_on([], new=1), attempt=1, groups=(Group(key, "gpu", R1, 1),))
    return {
        "metadata": {
            "name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1",
            "annotations": {PHASE_ANNOTATION: phase, PLAN_ANNOTATION: booking.to_annotation()},
        },
        "spec": {"provisioningClassName": "atomic-provisioning.muster.dev", "podSets": []},
    }


def _pod(name: str, node: str, request: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns",
                     "annotations": {CONSUME_ANNOTATION: request}},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


async def test_orphans_go_now_bookings_stay_idle_gangs_go_after_the_ttl(
    kube: KubeClient,
) -> None:
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu"))
    pool = CapacityPool.model_validate(objects.gpu_pool("gpu"))
    provider = KindProvider(kube)

    async def acquire(key: str, uid: str) -> str:
        got = await provider.acquire(AcquireRequest(key, pool, 1, R1, "ns/x", uid))
        return got[0].name

    await acquire("orphan-1-0", "gone-uid")
    await acquire("booked-1-0", "uid-b")
    used = await acquire("used-1-0", "uid-u")

    clock = ManualClock()
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([objects.gpu_pool("gpu")])
    state.upsert_request(_request("b", "uid-b", Phase.BOOKED, "booked-1-0"))
    state.upsert_request(_request("u", "uid-u", Phase.ENDED, "used-1-0"))
    state.upsert_pod(_pod("p0", used, "u"))
    providers = ProviderSet(ProviderContext(kube=kube), instances={"kind": provider})
    collector = Collector(
        state=state, providers=providers, idle_ttl=300, now=clock.now, in_flight=lambda: set(),
    )

    first = await collector.run_once()
    assert [(r.key, r.nodes) for r in first] == [("orphan-1-0", 1)]

    state.delete_pod("ns/p0")
    assert await collector.run_once() == []  # idle, but not for 300 s yet
    await clock.advance(299)
    assert await collector.run_once() == []
    await clock.advance(1)
    assert [r.key for r in await collector.run_once()] == ["used-1-0"]
    assert sorted(n.key for n in await provider.list(pool)) == ["booked-1-0"]
