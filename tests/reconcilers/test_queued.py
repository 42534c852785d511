"""Queued provisioning (``queued-provisioning.muster.dev``) and the run duration, end to end
on the API sandbox with the fake cloud: the gang waits in the cloud's queue (the fake pool's
``queue: true``) or in Muster's own, never ending RetriesExhausted on a stock-out; deleting
it leaves nothing; ``maxRunDurationSeconds`` after provisioning its nodes go and the booking
ends CapacityRevoked/RunDurationExpired."""

from __future__ import annotations

import asyncio
import functools
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller.commands import objects
from controller.common.clock import ManualClock
from controller.config import MusterConfig, RetryConfig
from controller.kube import KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    EVENTS,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PROVISIONING_REQUESTS,
)
from controller.operator import Controller
from providers.base import TransientProviderError
from providers.fake import TAG_POOL, FakeProvider
from tests.cluster_objects import starve
from tests.helpers import bounded, eventually

QUEUED = "queued-provisioning.muster.dev"
ATOMIC = "atomic-provisioning.muster.dev"
_until = functools.partial(eventually, within=10.0, step=0.02)


async def _condition(kube: KubeClient, name: str, type_: str) -> dict[str, Any] | None:
    pr = await kube.get_or_none(PROVISIONING_REQUESTS, name, namespace="ns")
    return next((c for c in ((pr or {}).get("status") or {}).get("conditions") or []
                 if c["type"] == type_), None)


async def _create(kube: KubeClient, name: str, parameters: dict[str, str] | None = None,
                  class_name: str = QUEUED) -> None:
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        name, namespace="ns", pod_sets=[("workers", 2)], class_name=class_name,
        parameters=parameters or {}), namespace="ns")


async def _nodes(kube: KubeClient) -> list[str]:
    listing = await kube.list(NODES, label_selector=f"{TAG_POOL}=gpu")
    return sorted(n["metadata"]["name"] for n in listing["items"])


def _refill(provider: FakeProvider) -> None:
    for b in (1, 2):
        for r in range(1, 5):
            provider.set_stock("gpu", {objects.BLOCK: f"b{b}", objects.RACK: f"b{b}-r{r}"}, 16)


async def _queue_pool(kube: KubeClient, controller: Controller) -> None:
    await kube.merge_patch(CAPACITY_POOLS, "gpu", {"spec": {"parameters": {"queue": True}}})

    async def seen() -> bool:
        pool = controller.state.pool_registry.pools().get("gpu")
        return pool is not None and pool.spec.parameters.get("queue") is True

    await _until(seen)


async def _reason(kube: KubeClient, name: str, reason: str) -> dict[str, Any] | None:
    cond = await _condition(kube, name, "Provisioned")
    return cond if cond is not None and cond["reason"] == reason else None


def _ops(provider: FakeProvider, op: str) -> list[str]:
    return [c.key for c in provider.calls if c.op == op]


async def test_a_queued_gang_is_provisioned_when_the_queue_grants_it_then_its_run_ends(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, clock, provider = running
    await _queue_pool(kube, controller)
    starve(provider)
    await _create(kube, "queued", {"maxRunDurationSeconds": "300"})

    cond = await _until(lambda: _reason(kube, "queued", "QueuedForCapacity"))
    assert cond["status"] == "False"
    assert "Queued for capacity since " in cond["message"]
    assert "2 node(s) in the cloud's queue" in cond["message"]
    assert "state WAITING, no estimate from the cloud" in cond["message"]
    assert "each to run 300s once granted" in cond["message"]
    [key] = _ops(provider, "enqueue")
    assert _ops(provider, "acquire") == [] and await _nodes(kube) == []

    # Polls while the stock is out change nothing: still one queued request, no nodes.
    await clock.advance(controller.config.acquisition.queue_poll_seconds)
    await asyncio.sleep(0.2)
    assert _ops(provider, "enqueue") == [key] and await _nodes(kube) == []
    assert await _condition(kube, "queued", "Failed") is None

    _refill(provider)
    await clock.advance(controller.config.acquisition.queue_poll_seconds)

    async def provisioned() -> dict[str, Any] | None:
        got = await _condition(kube, "queued", "Provisioned")
        return got if got is not None and got["status"] == "True" else None

    granted_at = clock.now()
    await _until(provisioned)
    assert _ops(provider, "grant") == [key]
    # The cloud's run clock starts at the grant and was given the registration budget on
    # top of the run, so the end it reports comes after Muster's own (300 s after
    # Provisioned): the run ends RunDurationExpired, not with the nodes vanishing.
    pr = await kube.get(PROVISIONING_REQUESTS, "queued", namespace="ns")
    through = json.loads(pr["metadata"]["annotations"]["muster.dev/queued-through"])
    budget = controller.config.acquisition.node_ready_timeout_seconds
    assert datetime.fromisoformat(through[key]["ends"]) == granted_at + timedelta(
        seconds=300 + budget)
    # The acquisition adopted what the queue granted: nothing launched anew.
    assert [c.outcome for c in provider.calls if c.op == "acquire"] == ["reused"]
    assert len(await _nodes(kube)) == 2

    # The run lasts 300 s from Provisioned=True (under the 600 s booking).
    await clock.advance(299)
    await asyncio.sleep(0.2)
    assert await _condition(kube, "queued", "CapacityRevoked") is None
    assert len(await _nodes(kube)) == 2
    await clock.advance(1)
    revoked = await _until(lambda: _condition(kube, "queued", "CapacityRevoked"))
    assert revoked["status"] == "True" and revoked["reason"] == "RunDurationExpired"
    assert "maxRunDurationSeconds" in revoked["message"]

    async def gone() -> bool:
        return await _nodes(kube) == []

    await _until(gone)
    assert await _condition(kube, "queued", "BookingExpired") is None


async def test_deleting_a_queued_request_cancels_it_and_leaves_nothing(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, clock, provider = running
    await _queue_pool(kube, controller)
    starve(provider)
    await _create(kube, "withdrawn")
    await _until(lambda: _reason(kube, "withdrawn", "QueuedForCapacity"))
    [key] = _ops(provider, "enqueue")

    await kube.delete(PROVISIONING_REQUESTS, "withdrawn", namespace="ns")

    async def deleted() -> bool:
        return await kube.get_or_none(PROVISIONING_REQUESTS, "withdrawn", namespace="ns") is None

    await _until(deleted)
    assert _ops(provider, "cancel") == [key]
    # Stock back: the cancelled request is not in the queue, so nothing is granted.
    _refill(provider)
    await clock.advance(controller.config.acquisition.queue_poll_seconds * 3)
    await asyncio.sleep(0.3)
    assert _ops(provider, "grant") == [] and await _nodes(kube) == []
    assert await provider.queued(controller.state.pool_registry.pools()["gpu"], key) is None


async def test_deleting_a_granted_request_before_it_is_booked_releases_the_grant(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """The queue granted (nodes exist under the key) but Muster has not adopted them yet:
    deletion releases them too."""
    controller, _, provider = running
    await _queue_pool(kube, controller)
    starve(provider)
    await _create(kube, "late")
    await _until(lambda: _reason(kube, "late", "QueuedForCapacity"))
    [key] = _ops(provider, "enqueue")
    _refill(provider)
    pool = controller.state.pool_registry.pools()["gpu"]
    granted = await provider.queued(pool, key)  # the cloud grants before Muster looks
    assert granted is not None and granted.outcome == "granted"
    assert len(await _nodes(kube)) == 2

    await kube.delete(PROVISIONING_REQUESTS, "late", namespace="ns")

    async def nothing_left() -> bool:
        return (await _nodes(kube) == [] and await kube.get_or_none(
            PROVISIONING_REQUESTS, "late", namespace="ns") is None)

    await _until(nothing_left)


@pytest.mark.parametrize(
    "muster_config", [MusterConfig(retry=RetryConfig(max_attempts=3))], ids=["3-attempts"]
)
async def test_a_stock_out_in_musters_own_queue_never_ends_retries_exhausted(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """A pool without a cloud queue: the queued class waits in Muster's own queue well past
    retry.max_attempts, while an atomic request beside it fails RetriesExhausted; when the
    stock comes back the queued gang is provisioned."""
    controller, clock, provider = running
    starve(provider)
    await _create(kube, "patient")
    await _create(kube, "atomic", class_name=ATOMIC)
    retry = controller.config.retry

    for _ in range(retry.max_attempts * 3):
        await _until(lambda: _reason(kube, "patient", "QueuedForCapacity"))
        await asyncio.sleep(0.05)
        await clock.advance(retry.max_backoff_seconds)
    failed = await _until(lambda: _condition(kube, "atomic", "Failed"))
    assert failed["reason"] == "RetriesExhausted"
    assert await _condition(kube, "patient", "Failed") is None
    cond = await _reason(kube, "patient", "QueuedForCapacity")
    assert cond is not None and "waits in Muster's own" in cond["message"]
    pr = await kube.get(PROVISIONING_REQUESTS, "patient", namespace="ns")
    assert int(pr["metadata"]["annotations"]["muster.dev/attempt"]) > retry.max_attempts
    assert "muster.dev/queued-since" in pr["metadata"]["annotations"]

    _refill(provider)
    await clock.advance(retry.max_backoff_seconds)

    async def provisioned() -> bool:
        got = await _condition(kube, "patient", "Provisioned")
        return got is not None and got["status"] == "True"

    await _until(provisioned)
    assert len(await _nodes(kube)) == 2


async def test_the_fake_queue_parameter_must_be_a_boolean(kube: KubeClient) -> None:
    from controller.api.capacitypool import CapacityPool
    from providers.base import ProviderConfigError

    provider = FakeProvider(kube, heartbeat_seconds=0)
    good = CapacityPool.model_validate(objects.gpu_pool("q", parameters={"queue": True}))
    await provider.validate(good)
    assert provider.queues(good)
    bad = CapacityPool.model_validate(objects.gpu_pool("q", parameters={"queue": "yes"}))
    with pytest.raises(ProviderConfigError, match=r"parameters\.queue must be true or false"):
        await provider.validate(bad)


async def test_a_run_longer_than_the_capacity_block_is_not_planned_onto_it(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """The pool draws from a block ending in an hour: a 30-minute run is provisioned there;
    a two-hour one is not planned onto it (it waits, queued)."""
    from datetime import timedelta

    from controller.common.conditions import rfc3339

    controller, clock, _ = running
    end = clock.now() + timedelta(hours=1)
    await kube.merge_patch(CAPACITY_POOLS, "gpu", {"spec": {"parameters": {
        "reservation": {"id": "blk-1", "nodes": 16, "end": rfc3339(end)}}}})

    async def bounded() -> bool:
        pools = controller.state.snapshot(now=clock.now()).pools
        return any(p.name == "gpu" and p.open_seconds is not None for p in pools)

    for _ in range(50):
        if await bounded():
            break
        await clock.advance(60)  # the pool status' reservation refresh
        await asyncio.sleep(0.05)
    assert await bounded()

    await _create(kube, "long", {"maxRunDurationSeconds": "7200"})
    cond = await _until(lambda: _reason(kube, "long", "QueuedForCapacity"))
    assert "waits in Muster's own" in cond["message"]
    await _create(kube, "short", {"maxRunDurationSeconds": "1800"})

    async def provisioned() -> bool:
        got = await _condition(kube, "short", "Provisioned")
        return got is not None and got["status"] == "True"

    await _until(provisioned)
    assert (await _condition(kube, "long", "Provisioned") or {}).get("status") == "False"


async def test_deleting_the_pool_of_a_queued_gang_cancels_it_before_the_pool_goes(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """The pool goes while the gang waits in its cloud queue: the queued request is
    cancelled (the first cancel the cloud refuses keeps the pool, held by Muster's
    finalizer, until a later one succeeds), the request fails CapacityPoolDeleted, nothing
    is granted afterwards, and only then does the pool go."""
    controller, clock, provider = running
    await _queue_pool(kube, controller)
    starve(provider)
    await _create(kube, "orphaned")
    await _until(lambda: _reason(kube, "orphaned", "QueuedForCapacity"))
    [key] = _ops(provider, "enqueue")
    pool = controller.state.pool_registry.pools()["gpu"]
    provider.refuse_cancels("gpu", TransientProviderError("cancel throttled (injected)"))

    await kube.delete(CAPACITY_POOLS, "gpu")

    async def refused() -> dict[str, Any] | None:
        cond = await _reason(kube, "orphaned", "QueuedForCapacity")
        return cond if cond is not None and "refused to cancel" in cond["message"] else None

    cond = await _until(refused)
    assert "cancel throttled (injected)" in cond["message"]
    # The cloud still holds the gang, so the pool (and its provider settings) stays,
    # whatever the polls in between.
    for _ in range(3):
        await clock.advance(controller.config.acquisition.queue_poll_seconds)
        await asyncio.sleep(0.1)
    assert (await provider.queued(pool, key)) is not None
    held = await kube.get(CAPACITY_POOLS, "gpu")
    assert held["metadata"].get("deletionTimestamp")
    assert "muster.dev/release-nodes" in held["metadata"]["finalizers"]
    assert await _condition(kube, "orphaned", "Failed") is None
    assert _ops(provider, "cancel") == []

    provider.refuse_cancels("gpu", None)
    await clock.advance(controller.config.acquisition.queue_poll_seconds)
    failed = await _until(lambda: _condition(kube, "orphaned", "Failed"))
    assert failed["reason"] == "CapacityPoolDeleted"
    assert "CapacityPool gpu was deleted while the gang waited" in failed["message"]
    assert f"{key}: queued request queue/{key} was taken out of the queue" in failed["message"]
    assert _ops(provider, "cancel") == [key]
    assert await provider.queued(pool, key) is None

    async def pool_gone() -> bool:
        return await kube.get_or_none(CAPACITY_POOLS, "gpu") is None

    await _until(pool_gone)
    # Stock back: nothing was left in the queue to grant.
    _refill(provider)
    await asyncio.sleep(0.2)
    assert _ops(provider, "grant") == [] and await _nodes(kube) == []


async def test_a_pool_whose_provider_changes_under_a_queued_gang_cancels_through_the_old_one(
    kube: KubeClient,
) -> None:
    """The pool's provider is switched while the gang waits in the old provider's queue:
    the queued request is cancelled through the provider (and parameters) that queued it,
    not left there, and the gang is planned again and queued through the new one."""
    await kube.create(NAMESPACES, {"metadata": {"name": "ns"}})
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu", parameters={"queue": True}))
    await kube.create(POD_TEMPLATES, objects.pod_template(
        "workers", namespace="ns", requests={"cpu": "90", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
    ), namespace="ns")
    clock = ManualClock(start=datetime.now(UTC))
    old = FakeProvider(kube, heartbeat_seconds=3600)
    new = FakeProvider(kube, heartbeat_seconds=3600)
    starve(old)
    starve(new)
    controller = Controller(kube=kube, config=MusterConfig(), clock=clock,
                            providers={"kind": old, "other": new})
    await bounded(controller.start(), 60, "the controller to start")
    try:
        await _create(kube, "moved")
        await _until(lambda: _reason(kube, "moved", "QueuedForCapacity"))
        [key] = _ops(old, "enqueue")
        pr = await kube.get(PROVISIONING_REQUESTS, "moved", namespace="ns")
        assert json.loads(pr["metadata"]["annotations"]["muster.dev/queued-through"]) == {
            key: {"provider": "kind", "parameters": {"queue": True}}}

        await kube.merge_patch(CAPACITY_POOLS, "gpu", {"spec": {"provider": "other"}})

        async def switched() -> bool:
            return controller.state.pool_registry.pools()["gpu"].spec.provider == "other"

        await _until(switched)
        await clock.advance(controller.config.acquisition.queue_poll_seconds)

        async def requeued() -> list[str]:
            await clock.advance(1)
            return _ops(new, "enqueue")

        await _until(requeued)
        assert _ops(old, "cancel") == [key]
        assert await old.queued(controller.state.pool_registry.pools()["gpu"], key) is None
        events = await kube.list(EVENTS, namespace="ns")
        said = [e["message"] for e in events["items"] if e.get("reason") == "AcquisitionFailed"]
        assert any("CapacityPool gpu's provider changed from kind to other" in m
                   and "cancelled through the provider that queued it" in m for m in said), said
        await _until(lambda: _reason(kube, "moved", "QueuedForCapacity"))
    finally:
        await bounded(controller.stop(), 60, "the controller to stop")


async def test_a_deleted_request_whose_cancel_the_cloud_refuses_stays_until_it_succeeds(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """Once the request is gone nothing would cancel its queued request: while the cloud
    refuses the cancel the request keeps its finalizer, and goes once a retry succeeds."""
    controller, clock, provider = running
    await _queue_pool(kube, controller)
    starve(provider)
    await _create(kube, "stuck")
    await _until(lambda: _reason(kube, "stuck", "QueuedForCapacity"))
    [key] = _ops(provider, "enqueue")
    provider.refuse_cancels("gpu", TransientProviderError("cancel throttled (injected)"))

    await kube.delete(PROVISIONING_REQUESTS, "stuck", namespace="ns")
    for _ in range(2):
        await clock.advance(controller.config.acquisition.queue_poll_seconds)
        await asyncio.sleep(0.2)
    held = await kube.get_or_none(PROVISIONING_REQUESTS, "stuck", namespace="ns")
    assert held is not None and held["metadata"].get("deletionTimestamp")
    assert await provider.queued(controller.state.pool_registry.pools()["gpu"], key) is not None

    provider.refuse_cancels("gpu", None)
    await clock.advance(controller.config.acquisition.queue_poll_seconds)

    async def deleted() -> bool:
        return await kube.get_or_none(PROVISIONING_REQUESTS, "stuck", namespace="ns") is None

    await _until(deleted)
    assert _ops(provider, "cancel") == [key]
    assert await provider.queued(controller.state.pool_registry.pools()["gpu"], key) is None
