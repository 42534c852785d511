"""A waiting gang is planned again as soon as capacity it could use frees inside the cluster
(controller/state/wakeups.py), not only when its backoff timer fires.

The clock here is virtual and never advanced past the first backoff (10 s): a gang that
becomes Provisioned did so through a wake-up.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from controller.commands import objects
from controller.common.clock import ManualClock, RealClock
from controller.config import MusterConfig, RetryConfig
from controller.kube import KubeClient
from controller.kube.resources import CAPACITY_POOLS, NODES, PODS, PROVISIONING_REQUESTS
from controller.lifecycle import ATTEMPT_ANNOTATION
from controller.operator import Controller
from controller.state.wakeups import Wakeups
from providers.fake import FakeProvider
from tests.helpers import eventually

_until = functools.partial(eventually, within=10.0, step=0.02)


async def _condition(kube: KubeClient, name: str, type_: str = "Provisioned") -> dict[str, Any]:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return next(
        (c for c in (pr.get("status") or {}).get("conditions") or [] if c["type"] == type_), {}
    )


async def _request(kube: KubeClient, name: str, count: int) -> None:
    await kube.create(
        PROVISIONING_REQUESTS,
        objects.provisioning_request(name, namespace="ns", pod_sets=[("workers", count)]),
        namespace="ns",
    )


async def _reason(kube: KubeClient, name: str) -> str:
    return str((await _condition(kube, name)).get("reason") or "")


async def _provisioned(kube: KubeClient, name: str) -> bool:
    return (await _condition(kube, name)).get("status") == "True"


async def _small_pool(kube: KubeClient, max_nodes: int) -> None:
    await kube.merge_patch(CAPACITY_POOLS, "gpu", {"spec": {"maxNodes": max_nodes}})


async def _one_booked_one_waiting(kube: KubeClient, controller: Controller) -> None:
    """Gang "first" holds the whole pool (4 nodes); gang "second" (4) waits for it."""
    await _small_pool(kube, 4)
    await _until(lambda: _pool_max(controller, 4))
    await _request(kube, "first", 4)
    await _until(lambda: _provisioned(kube, "first"))
    await _request(kube, "second", 4)
    await _until(lambda: _is(kube, "second", "CapacityIsNotFound"))


async def _pool_max(controller: Controller, n: int) -> bool:
    pool = controller.state.pool_registry.pools().get("gpu")
    return pool is not None and pool.spec.max_nodes == n


async def _is(kube: KubeClient, name: str, reason: str) -> bool:
    return await _reason(kube, name) == reason


async def test_a_waiting_gang_gets_the_nodes_a_deleted_request_releases(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, _, _ = running
    await _one_booked_one_waiting(kube, controller)
    await kube.delete(PROVISIONING_REQUESTS, "first", namespace="ns")
    await _until(lambda: _provisioned(kube, "second"))
    assert controller.wakeups.rounds >= 1


async def test_a_waiting_gang_fits_once_its_pools_limit_is_raised(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, _, _ = running
    await _one_booked_one_waiting(kube, controller)
    await _small_pool(kube, 8)
    await _until(lambda: _provisioned(kube, "second"))
    assert await _provisioned(kube, "first")


async def test_a_waiting_gang_fits_once_pods_on_existing_nodes_finish(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """Nodes not from any pool, busy with other pods; the pool cannot add any: the gang
    fits on them the moment those pods are gone."""
    controller, _, _ = running
    await _small_pool(kube, 0)
    await _until(lambda: _pool_max(controller, 0))
    template = objects.pod_template(
        "busy",
        namespace="ns",
        requests={"cpu": "90", objects.GPU: "8"},
        tolerations=[objects.GPU_TOLERATION],
    )
    for i in range(2):
        await kube.create(
            NODES,
            objects.node(
                f"static-{i}",
                allocatable={"cpu": "96", objects.GPU: "8", "pods": "110"},
                labels={objects.BLOCK: "b1", objects.RACK: "b1-r1"},
            ),
        )
        pod = objects.consumer_pod(f"busy-{i}", request="none", template=template)
        pod["spec"]["nodeName"] = f"static-{i}"
        await kube.create(PODS, pod, namespace="ns")
    await _until(lambda: _nodes_busy(controller, 2))
    await _request(kube, "waiting", 2)
    await _until(lambda: _is(kube, "waiting", "CapacityIsNotFound"))
    for i in range(2):
        await kube.delete(PODS, f"busy-{i}", namespace="ns")
    await _until(lambda: _provisioned(kube, "waiting"))
    assert await _reason(kube, "waiting") == "CapacityIsFound"


async def _nodes_busy(controller: Controller, n: int) -> bool:
    return sum(controller.state.objects.pods_on(f"static-{i}") for i in range(n)) == n


@pytest.mark.parametrize(
    "muster_config",
    [MusterConfig(), MusterConfig(retry=RetryConfig(replan_order="arrival"))],
    ids=["backoff-order", "arrival-order"],
)
async def test_woken_gangs_are_planned_oldest_first_and_a_miss_writes_nothing(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """Two gangs wait for the same 4 nodes: the older gets them (in backoff order too: its
    timer is due first); the younger, woken too and still without a fit, keeps its attempt
    count and condition (no write)."""
    controller, _, _ = running
    await _one_booked_one_waiting(kube, controller)
    await _request(kube, "third", 4)
    await _until(lambda: _is(kube, "third", "CapacityIsNotFound"))
    before = await kube.get(PROVISIONING_REQUESTS, "third", namespace="ns")
    await kube.delete(PROVISIONING_REQUESTS, "first", namespace="ns")
    await _until(lambda: _provisioned(kube, "second"))
    await _until(lambda: _settled(controller))
    after = await kube.get(PROVISIONING_REQUESTS, "third", namespace="ns")
    assert not await _provisioned(kube, "third")
    assert after["metadata"]["annotations"][ATTEMPT_ANNOTATION] == "1"
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


async def _settled(controller: Controller) -> bool:
    """No wake-up round started for 0.3 s and nothing is being reconciled."""
    rounds = controller.wakeups.rounds
    await asyncio.sleep(0.3)
    return controller.wakeups.rounds == rounds and controller.queue.busy == 0


@pytest.mark.parametrize(
    "muster_config", [MusterConfig(retry=RetryConfig(replan_on_capacity_change=False))], ids=["off"]
)
async def test_without_wakeups_a_waiting_gang_waits_for_its_backoff(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, clock, _ = running
    await _one_booked_one_waiting(kube, controller)
    await kube.delete(PROVISIONING_REQUESTS, "first", namespace="ns")
    await _until(lambda: _no_pool_nodes(kube))
    await asyncio.sleep(0.5)
    assert not await _provisioned(kube, "second")
    await clock.advance(controller.config.retry.backoff(1))
    await _until(lambda: _provisioned(kube, "second"))
    assert controller.wakeups.rounds == 0


async def _no_pool_nodes(kube: KubeClient) -> bool:
    return not (await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]


async def test_a_churn_of_events_is_coalesced_and_rate_capped() -> None:
    woken: list[str] = []
    wakeups = Wakeups(
        clock=RealClock(),
        waiting=lambda: ["ns/a", "ns/b"],
        enqueue=woken.append,
        coalesce_seconds=0.01,
        max_per_second=5,
    )
    wakeups.start()
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.0
        while loop.time() < end:
            for _ in range(100):
                wakeups.poke("pod finished")
            # Every woken key is planned at once (the service claims it when reconciled).
            for key in ("ns/a", "ns/b"):
                wakeups.claim(key)
            await asyncio.sleep(0.001)
    finally:
        await wakeups.stop()
    # About 400,000 events in a second: at most 5 rounds a second, plus the one in flight.
    assert 1 <= wakeups.rounds <= 6, wakeups.rounds
    assert woken[:2] == ["ns/a", "ns/b"]


async def test_a_round_waits_for_the_previous_one_to_be_planned() -> None:
    woken: list[str] = []
    wakeups = Wakeups(
        clock=RealClock(),
        waiting=lambda: ["ns/a"],
        enqueue=woken.append,
        coalesce_seconds=0.0,
        max_per_second=1000,
    )
    wakeups.start()
    try:
        wakeups.poke("node deleted")
        await _until(lambda: _rounds(wakeups, 1))
        for _ in range(5):
            wakeups.poke("node deleted")
            await asyncio.sleep(0.02)
        assert wakeups.rounds == 1  # "ns/a" not planned yet
        assert wakeups.claim("ns/a")
        assert not wakeups.claim("ns/a")
        await _until(lambda: _rounds(wakeups, 2))
    finally:
        await wakeups.stop()


async def _rounds(wakeups: Wakeups, n: int) -> bool:
    return wakeups.rounds >= n


async def test_the_end_of_a_stock_out_window_wakes_the_waiting_on_the_injected_clock() -> None:
    from datetime import UTC, datetime, timedelta

    from controller.common.topology_defaults import DEFAULT_LEVELS
    from controller.state.cache import ClusterState

    clock = ManualClock(start=datetime(2026, 1, 1, tzinfo=UTC))
    woken: list[str] = []
    wakeups = Wakeups(clock=clock, waiting=lambda: ["ns/a"], enqueue=woken.append,
                      coalesce_seconds=0.0)
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.shortage_set = lambda until: wakeups.poke_at(until, "stock-out window ended")
    wakeups.start()
    try:
        state.mark_short("gpu", {objects.RACK: "b1-r1"}, available=0,
                         until=clock.now() + timedelta(seconds=60))
        await clock.advance(59)
        await asyncio.sleep(0.05)
        assert wakeups.rounds == 0
        await clock.advance(1)
        await _until(lambda: _rounds(wakeups, 1))
        assert woken == ["ns/a"]
    finally:
        await wakeups.stop()
