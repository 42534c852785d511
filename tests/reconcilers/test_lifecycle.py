"""One request's whole life on the sandbox with virtual time (the clock is injected).

Ten minutes of booking and minutes of retry backoff pass in milliseconds: the controller
reads time only from its clock.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from controller.commands import objects
from controller.common.clock import ManualClock
from controller.config import MusterConfig, RetryConfig
from controller.kube import KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
)
from controller.operator import Controller
from providers.fake import FakeProvider
from tests.cluster_objects import gpu_node, starve
from tests.helpers import eventually


async def _condition(kube: KubeClient, name: str, type_: str) -> dict[str, Any] | None:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return next((c for c in (pr.get("status") or {}).get("conditions") or []
                 if c["type"] == type_), None)


# Virtual time makes every step here quick, so poll often and give up early.
_until = functools.partial(eventually, within=10.0, step=0.02)


async def test_booking_expires_after_ten_virtual_minutes(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    _, clock, _ = running
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "gang", namespace="ns", pod_sets=[("workers", 3)]), namespace="ns")

    async def provisioned() -> bool:
        cond = await _condition(kube, "gang", "Provisioned")
        return cond is not None and cond["status"] == "True"

    await _until(provisioned)
    assert len((await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]) == 3
    await clock.advance(599)
    await asyncio.sleep(0.2)
    assert await _condition(kube, "gang", "BookingExpired") is None

    await clock.advance(1)
    expired = await _until(lambda: _condition(kube, "gang", "BookingExpired"))
    assert expired["reason"] == "CapacityReservationTimeExpired"

    async def released() -> bool:
        listing = await kube.list(NODES, label_selector="muster.dev/pool=gpu")
        return not listing["items"]

    await _until(released)


async def _phase(kube: KubeClient, name: str) -> str | None:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return (pr["metadata"].get("annotations") or {}).get("muster.dev/phase")


async def test_the_phase_annotation_says_where_the_request_is(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    # Users read muster.dev/phase (kubectl get -o wide, the plugin): it must not say
    # Acquiring while the request is Provisioned=True.
    _, clock, _ = running
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "phased", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")
    cond = await _until(lambda: _condition(kube, "phased", "Provisioned"))
    await _until(lambda: _provisioned_true(kube, "phased"))

    async def booked() -> bool:
        return await _phase(kube, "phased") == "Booked"

    await _until(booked)
    await asyncio.sleep(0.1)
    assert await _phase(kube, "phased") == "Booked", cond
    await clock.advance(600)
    await _until(lambda: _condition(kube, "phased", "BookingExpired"))

    async def ended() -> bool:
        return await _phase(kube, "phased") == "Ended"

    await _until(ended)


async def _provisioned_true(kube: KubeClient, name: str) -> bool:
    cond = await _condition(kube, name, "Provisioned")
    return cond is not None and cond["status"] == "True"


# The default budget (720 attempts, about 12 h at the 60 s cap) is too many to step through;
# the schedule and the final Failed are the same with any budget.
@pytest.mark.parametrize(
    "muster_config", [MusterConfig(retry=RetryConfig(max_attempts=6))], ids=["6-attempts"]
)
async def test_stock_out_backs_off_on_the_clock_then_fails(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    controller, clock, provider = running
    starve(provider)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "starved", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")
    retry = controller.config.retry

    for attempt in range(1, retry.max_attempts):
        async def attempted(n: int = attempt) -> bool:
            return sum(1 for c in provider.calls if c.op == "acquire") >= n

        await _until(attempted)
        cond = await _until(lambda: _condition(kube, "starved", "Provisioned"))
        assert cond["status"] == "False"
        await asyncio.sleep(0.05)
        await clock.advance(retry.backoff(attempt))

    failed = await _until(lambda: _condition(kube, "starved", "Failed"))
    assert failed["reason"] == "RetriesExhausted"

    async def phase_failed() -> bool:
        return await _phase(kube, "starved") == "Failed"

    await _until(phase_failed)
    assert sum(1 for c in provider.calls if c.op == "acquire") == retry.max_attempts


async def test_conflict_storms_and_5xx_neither_double_nor_lose_capacity(
    server: Any, kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    _, clock, provider = running
    server.faults.drop_watches_every(3)
    for name in ("one", "two"):
        await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
            name, namespace="ns", pod_sets=[("workers", 3)]), namespace="ns")

    async def both_provisioned() -> bool:
        for name in ("one", "two"):
            cond = await _condition(kube, name, "Provisioned")
            if cond is None or cond["status"] != "True":
                return False
        return True

    server.faults.add_conflicts(0.3, resources="provisioningrequests")
    server.faults.add_errors(0.2, status=503, verbs="patch", resources="provisioningrequests")

    async def provisioned_as_time_passes() -> bool:
        await clock.advance(1)  # the controller's error backoff runs on the virtual clock
        return await both_provisioned()

    await _until(provisioned_as_time_passes, within=30)
    server.faults.clear()
    nodes = (await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]
    assert len(nodes) == 6
    keys = {n["metadata"]["labels"]["muster.dev/acquisition-key"] for n in nodes}
    assert len(keys) == 2
    assert {c.outcome for c in provider.calls if c.op == "acquire"} <= {"ok", "reused"}


async def _statuses(kube: KubeClient, name: str, seen: list[dict[str, str]]) -> None:
    """Append every Provisioned condition the request's watch shows."""

    def on_event(event: Any) -> None:
        if event.object["metadata"]["name"] != name:
            return
        for cond in (event.object.get("status") or {}).get("conditions") or []:
            if cond["type"] == "Provisioned":
                seen.append({"status": cond["status"], "reason": cond["reason"]})

    await kube.watch(PROVISIONING_REQUESTS, lambda _: None, on_event, namespace="ns")


def _provisioned_in(seen: list[dict[str, str]]) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return any(s["status"] == "True" for s in seen)

    return probe


async def test_a_quick_acquisition_goes_straight_to_provisioned(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    seen: list[dict[str, str]] = []
    watcher = asyncio.create_task(_statuses(kube, "quick", seen))
    try:
        await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
            "quick", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")
        await _until(_provisioned_in(seen))
    finally:
        watcher.cancel()
    # No clock time passed during the acquisition: no intermediate Provisioning write.
    assert {s["reason"] for s in seen} == {"CapacityIsProvisioned"}


async def test_a_slow_acquisition_is_announced_as_provisioning(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    _, clock, provider = running
    provider.acquire_latency_seconds = 1.0  # real seconds: the provider is still working
    seen: list[dict[str, str]] = []
    watcher = asyncio.create_task(_statuses(kube, "slow", seen))
    try:
        await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
            "slow", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")

        async def acquiring() -> bool:
            pr = await kube.get(PROVISIONING_REQUESTS, "slow", namespace="ns")
            return pr["metadata"].get("annotations", {}).get("muster.dev/phase") == "Acquiring"

        await _until(acquiring)
        await clock.advance(1.0)  # announce_after_seconds of virtual time
        announced = await _until(lambda: _condition(kube, "slow", "Provisioned"))
        assert (announced["status"], announced["reason"]) == ("False", "Provisioning")
        assert "Acquiring 2 node(s)" in announced["message"]
        await _until(_provisioned_in(seen))
    finally:
        watcher.cancel()
    assert seen[0]["reason"] == "Provisioning"
    assert seen[-1] == {"status": "True", "reason": "CapacityIsProvisioned"}


async def test_check_capacity_requests_of_another_processor_instance_are_left_alone(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    # Muster runs without classes.processor_instance: like cluster-autoscaler without
    # --check-capacity-processor-instance, it serves only requests naming no instance.
    for name, params in (("theirs", {"processorInstance": "team-b"}), ("ours", {})):
        await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
            name, namespace="ns", pod_sets=[("workers", 1)],
            class_name="check-capacity.muster.dev", parameters=params), namespace="ns")
    ours = await _until(lambda: _condition(kube, "ours", "Provisioned"))
    assert ours["reason"] in ("CapacityIsNotFound", "CapacityIsFound")
    theirs = await kube.get(PROVISIONING_REQUESTS, "theirs", namespace="ns")
    assert not (theirs.get("status") or {}).get("conditions")
    assert "muster.dev/phase" not in (theirs["metadata"].get("annotations") or {})


async def test_nodes_slow_to_become_ready_are_announced_as_provisioning(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    # A cloud answers at once, then the instances boot: the wait for Ready is part of the
    # acquisition the user is told about.
    controller, clock, _ = running
    await kube.merge_patch(CAPACITY_POOLS, "gpu",
                           {"spec": {"parameters": {"readyDelaySeconds": 1.0}}})

    async def pool_updated() -> bool:
        pool = controller.state.pool_registry.pools().get("gpu")
        return pool is not None and "readyDelaySeconds" in pool.spec.parameters

    await _until(pool_updated)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "booting", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")

    async def registered() -> bool:
        listing = await kube.list(NODES, label_selector="muster.dev/pool=gpu")
        return len(listing["items"]) == 2

    await _until(registered)
    await clock.advance(1.0)
    announced = await _until(lambda: _condition(kube, "booting", "Provisioned"))
    assert (announced["status"], announced["reason"]) == ("False", "Provisioning")

    async def provisioned() -> bool:
        cond = await _condition(kube, "booting", "Provisioned")
        return cond is not None and cond["status"] == "True"

    await _until(provisioned)


async def test_a_gang_larger_than_every_rack_limit_never_fits_even_beside_existing_nodes(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    # Every rack may hold 2 nodes; one rack already has 2 (booked by another request). A gang
    # of 3 in one rack can never fit: it must say so at once, not burn every retry.
    controller, clock, provider = running
    pool = objects.gpu_pool("gpu")
    for domain in pool["spec"]["topology"]["domains"]:
        domain["maxNodes"] = 2
    await kube.merge_patch(CAPACITY_POOLS, "gpu", {"spec": {"topology": pool["spec"]["topology"]}})

    async def limited() -> bool:
        found = controller.state.pool_registry.pools().get("gpu")
        return found is not None and found.spec.topology is not None and all(
            d.max_nodes == 2 for d in found.spec.topology.domains)

    await _until(limited)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "small", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")
    await _until(lambda: _condition(kube, "small", "Provisioned"))
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "big", namespace="ns", pod_sets=[("workers", 3)]), namespace="ns")

    async def failed_after_the_arrival_wait() -> dict[str, Any] | None:
        await clock.advance(1)  # no retry: only retry.arrival_wait_seconds for late pools
        return await _condition(kube, "big", "Failed")

    failed = await _until(failed_after_the_arrival_wait)
    assert failed["reason"] == "CapacityNeverFits", failed["message"]
    assert "Attempt" not in failed["message"], "decided on the first plan, no retry burnt"
    assert len([c for c in provider.calls if c.op == "acquire"]) == 1  # the small one's


async def test_pods_consuming_the_booking_elsewhere_end_it_and_free_the_new_nodes(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Kueue TAS without the rack nodeSelector (or the scheduler) may run the gang on other
    # free nodes: the booking is consumed, the message says where, the decision log says
    # so, and the new nodes the pods left unused go at once instead of after the idle TTL.
    caplog.set_level(logging.INFO, logger="muster.decisions")
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "gang", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")

    async def provisioned() -> bool:
        cond = await _condition(kube, "gang", "Provisioned")
        return cond is not None and cond["status"] == "True"

    await _until(provisioned)
    assert len((await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]) == 2
    template = await kube.get(POD_TEMPLATES, "workers", namespace="ns")
    for i in range(2):
        await kube.create(NODES, gpu_node(f"other-{i}", rack="b9-r9"))
        pod = objects.consumer_pod(f"w-{i}", request="gang", template=template)
        pod["spec"]["nodeName"] = f"other-{i}"
        await kube.create(PODS, pod, namespace="ns")

    ended = await _until(lambda: _condition(kube, "gang", "BookingExpired"))
    assert ended["reason"] == "CapacityBookingConsumed"
    assert "2 of them run outside the booked nodes (on other-0, other-1)" in ended["message"]
    (end,) = [r.__dict__["muster_fields"] for r in caplog.records
              if r.name == "muster.decisions" and r.__dict__["muster_fields"]["decision"] == "end"]
    assert end == {"decision": "end", "request": "ns/gang", "condition": "BookingExpired",
                   "reason": "CapacityBookingConsumed", "scheduled": 2, "of": 2,
                   "elsewhere": 2}, end

    async def released() -> bool:
        listing = await kube.list(NODES, label_selector="muster.dev/pool=gpu")
        return not listing["items"]

    await _until(released)  # no clock advance: not the idle TTL


async def test_nodes_that_never_become_ready_fail_the_request_after_a_small_budget(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """Nodes that never become Ready (a broken image) are paid for until the ready timeout,
    then released; that is retried only ``retry.max_unready_acquisitions`` times, not
    ``retry.max_attempts`` (720 waits for capacity, which cost nothing)."""
    controller, clock, provider = running
    await kube.merge_patch(CAPACITY_POOLS, "gpu",
                           {"spec": {"parameters": {"readyDelaySeconds": 3600.0}}})

    async def pool_updated() -> bool:
        pool = controller.state.pool_registry.pools().get("gpu")
        return pool is not None and "readyDelaySeconds" in pool.spec.parameters

    await _until(pool_updated)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "broken", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")

    async def failed() -> dict[str, Any] | None:
        await clock.advance(60)  # past the ready timeout (900 s) and each retry's backoff
        return await _condition(kube, "broken", "Failed")

    cond = await eventually(failed, within=30.0, step=0.05)
    limit = controller.config.retry.max_unready_acquisitions
    assert cond["reason"] == "RetriesExhausted", cond
    assert f"{limit} acquisition(s) gave nodes that were not Ready" in cond["message"], cond
    assert len([c for c in provider.calls if c.op == "acquire"]) == limit
    assert limit < controller.config.retry.max_attempts

    async def released() -> bool:
        return not (await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]

    await _until(released)


async def test_machines_that_never_register_are_released_and_said_so(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """Machines whose kubelet never registers a Node (a broken bootstrap) are known only by
    the providerIDs the provider launched: at the ready timeout the condition names them as
    never registered, they are terminated, and the retry gets registered nodes."""
    controller, clock, provider = running
    provider.never_register_next(pool="gpu")
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "silent", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")

    async def not_ready() -> dict[str, Any] | None:
        await clock.advance(60)
        cond = await _condition(kube, "silent", "Provisioned")
        return cond if cond is not None and cond["reason"] == "NodesNotReady" else None

    cond = await eventually(not_ready, within=30.0, step=0.05)
    assert cond["message"].count("never registered") == 2, cond
    assert "kind://gpu/" in cond["message"], cond
    releases = [c for c in provider.calls if c.op == "release"]
    assert [c.count for c in releases] == [2]
    assert await provider.list(controller.state.pool_registry.pools()["gpu"]) == []

    async def provisioned() -> bool:
        await clock.advance(60)
        cond = await _condition(kube, "silent", "Provisioned")
        return cond is not None and cond["status"] == "True"

    await eventually(provisioned, within=30.0, step=0.05)
    nodes = (await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]
    assert len(nodes) == 2
    assert all(not any(t["key"] == "muster.dev/unregistered" for t in n["spec"]["taints"])
               for n in nodes)


async def test_a_node_whose_provider_id_matches_no_acquisition_is_never_touched(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """A Node registering behind Muster's startup taint with a providerID no acquisition
    launched (another tool's machine, a stale bootstrap) is neither adopted (labelled,
    untainted, booked) nor deleted, while Muster provisions and releases around it."""
    _, clock, _ = running
    stranger = gpu_node("stranger", rack="b1-r1")
    stranger["spec"]["providerID"] = "kind://gpu/not-ours/0"
    stranger["spec"]["taints"] = [{"key": "muster.dev/unregistered", "effect": "NoExecute"}]
    await kube.create(NODES, stranger)
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "gang", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")

    async def provisioned() -> bool:
        cond = await _condition(kube, "gang", "Provisioned")
        return cond is not None and cond["status"] == "True"

    await _until(provisioned)
    await kube.delete(PROVISIONING_REQUESTS, "gang", namespace="ns")

    async def released() -> bool:
        await clock.advance(60)
        return not (await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]

    await eventually(released, within=30.0, step=0.05)
    node = await kube.get(NODES, "stranger")
    assert "muster.dev/pool" not in node["metadata"]["labels"]
    assert node["spec"]["taints"] == stranger["spec"]["taints"]


async def test_a_crash_between_launch_and_registration_is_resumed_from_tags(
    kube: KubeClient,
) -> None:
    """Muster died after the provider launched a gang's machines and before it registered
    their Nodes (they carry only what the kubelet gave them, behind the startup taint). The
    restarted Muster resumes the persisted plan, finds the machines by the cloud's tags
    under the same key (nothing launched again), registers them and confirms."""
    from datetime import UTC, datetime

    from controller.acquire.keys import groups_for
    from controller.api.capacitypool import CapacityPool
    from controller.lifecycle import ATTEMPT_ANNOTATION, PHASE_ANNOTATION, PLAN_ANNOTATION
    from controller.state.bookings import Booking
    from providers.base import AcquireRequest
    from tests.cluster_objects import plan_on

    await kube.create(NAMESPACES, {"metadata": {"name": "ns"}})
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu"))
    await kube.create(POD_TEMPLATES, objects.pod_template(
        "workers", namespace="ns", requests={"cpu": "90", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
    ), namespace="ns")
    created = await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "gang", namespace="ns", pod_sets=[("workers", 2)],
        class_name="not-yet.example.com"), namespace="ns")
    uid = created["metadata"]["uid"]
    plan = plan_on([], new=2, pool="gpu", rack="b1-r1")
    booking = Booking(plan, attempt=1, groups=groups_for(plan, owner_uid=uid, attempt=1))
    group = booking.groups[0]
    # The launch that happened before the crash.
    first = FakeProvider(kube, heartbeat_seconds=3600)
    pool = CapacityPool.model_validate(await kube.get(CAPACITY_POOLS, "gpu"))
    launched = await first.acquire(AcquireRequest(
        key=group.key, pool=pool, count=2, domain=dict(group.domain), owner="ns/gang",
        owner_uid=uid))
    await kube.merge_patch(PROVISIONING_REQUESTS, "gang", {
        "metadata": {"annotations": {PLAN_ANNOTATION: booking.to_annotation(),
                                     ATTEMPT_ANNOTATION: "1", PHASE_ANNOTATION: "Acquiring"},
                     "finalizers": ["muster.dev/release-nodes"]},
        "spec": {"provisioningClassName": "atomic-provisioning.muster.dev"},
    }, namespace="ns")

    provider = FakeProvider(kube, heartbeat_seconds=3600)
    clock = ManualClock(start=datetime.now(UTC))
    controller = Controller(kube=kube, config=MusterConfig(), clock=clock,
                            providers={"kind": provider})
    await controller.start()
    try:
        async def provisioned() -> bool:
            cond = await _condition(kube, "gang", "Provisioned")
            return cond is not None and cond["status"] == "True"

        await _until(provisioned)
    finally:
        await controller.stop()
    assert [c.outcome for c in provider.calls if c.op == "acquire"] == ["reused"]
    nodes = (await kube.list(NODES, label_selector=f"muster.dev/acquisition-key={group.key}"))
    assert sorted(n["spec"]["providerID"] for n in nodes["items"]) == sorted(
        n.provider_id for n in launched)
    assert all(not any(t["key"] == "muster.dev/unregistered" for t in n["spec"]["taints"])
               for n in nodes["items"])
    pr = await kube.get(PROVISIONING_REQUESTS, "gang", namespace="ns")
    persisted = Booking.from_annotation(pr["metadata"]["annotations"][PLAN_ANNOTATION])
    assert persisted.groups[0].provider_ids == tuple(sorted(n.provider_id for n in launched))


async def test_nodes_registered_outside_the_planned_domain_fail_the_attempt(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """The cloud put the gang's machines in another rack than planned: never a false
    Provisioned. Muster releases them, plans again away from that rack, and confirms only
    nodes registered where they were planned."""
    _, clock, provider = running
    provider.misplace_next({objects.RACK: "b9-r9"}, pool="gpu")
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "gang", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")

    async def provisioned() -> dict[str, Any] | None:
        await clock.advance(30)
        cond = await _condition(kube, "gang", "Provisioned")
        return cond if cond is not None and cond["status"] == "True" else None

    await eventually(provisioned, within=30.0, step=0.05)
    acquires = [c for c in provider.calls if c.op == "acquire"]
    releases = [c for c in provider.calls if c.op == "release"]
    assert len(acquires) == 2 and [c.key for c in releases] == [acquires[0].key]
    pr = await kube.get(PROVISIONING_REQUESTS, "gang", namespace="ns")
    rack = pr["status"]["provisioningClassDetails"][objects.RACK]
    nodes = (await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]
    assert len(nodes) == 2 and {n["metadata"]["labels"][objects.RACK] for n in nodes} == {rack}
    assert rack != "b9-r9"


async def _fresh_pool(kube: KubeClient) -> None:
    """The "gpu" pool without declared domains, room for one gang domain: every acquisition
    is a domain of its own (a placeholder the cloud resolves)."""
    await kube.json_patch(CAPACITY_POOLS, "gpu", [
        {"op": "replace", "path": "/spec/topology",
         "value": {"level": objects.RACK, "maxNodesPerDomain": 8}},
        {"op": "replace", "path": "/spec/maxNodes", "value": 8},
    ])


@pytest.mark.parametrize("muster_config", [MusterConfig(retry=RetryConfig(
    max_attempts=3, initial_backoff_seconds=0.2, max_backoff_seconds=60))], ids=["3-attempts"])
async def test_a_stock_out_in_a_fresh_domain_backs_off_and_asks_the_cloud_again(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """A placeholder domain is no place the cloud ran out in: a stock-out there is not
    remembered as a short domain (which left the pool nothing to plan, so every remaining
    attempt failed without a cloud call); the request backs off and the cloud is asked
    again."""
    from providers.base import CapacityUnavailable

    _, clock, provider = running
    await _fresh_pool(kube)
    await asyncio.sleep(0.2)
    provider.fail_next(CapacityUnavailable("no stock (injected)", available=0), pool="gpu")
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "gang", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")

    async def settled() -> dict[str, Any] | None:
        await clock.advance(1)
        for type_ in ("Provisioned", "Failed"):
            cond = await _condition(kube, "gang", type_)
            if cond is not None and cond["status"] == "True":
                return cond
        return None

    cond = await eventually(settled, within=30.0, step=0.05)
    assert cond["type"] == "Provisioned", cond
    assert len([c for c in provider.calls if c.op == "acquire"]) == 2
    assert "muster-new-" not in cond["message"], "the Provisioned message names the place"


async def test_a_pools_registration_budget_bounds_the_wait_for_its_machines(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """The pool's spec.registrationTimeoutSeconds, not the controller's 900 s default, is how
    long its machines may take to register: at 120 virtual seconds the unregistered ones are
    released and the condition names the pool's budget."""
    _, clock, provider = running
    await kube.merge_patch(CAPACITY_POOLS, "gpu", {"spec": {"registrationTimeoutSeconds": 90}})
    await asyncio.sleep(0.2)
    provider.never_register_next(pool="gpu")
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "silent", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")
    await _until(lambda: _launched(provider))
    await asyncio.sleep(0.2)
    await clock.advance(120)
    cond = await _until(lambda: _not_ready(kube, "silent"))
    assert "within 90s" in cond["message"], cond
    assert "registrationTimeoutSeconds" in cond["message"], cond
    assert [c.count for c in provider.calls if c.op == "release"] == [2]


async def _launched(provider: FakeProvider) -> bool:
    return any(c.op == "acquire" for c in provider.calls)


async def _not_ready(kube: KubeClient, name: str) -> dict[str, Any] | None:
    cond = await _condition(kube, name, "Provisioned")
    return cond if cond is not None and cond["reason"] == "NodesNotReady" else None


async def test_a_deleted_pool_waits_for_machines_that_never_registered(
    kube: KubeClient, running: tuple[Controller, ManualClock, FakeProvider]
) -> None:
    """A machine the cloud runs for a pool but whose Node never registered (so nothing
    labels it with the pool) still holds the deleted pool's finalizer: only the pool's
    settings can release it. The collector releases it as an orphan, then the pool goes."""
    from providers.base import AcquireRequest

    controller, clock, provider = running
    pool = controller.state.pool_registry.pools()["gpu"]
    provider.never_register_next(pool="gpu")
    await provider.acquire(AcquireRequest(
        key="stray-0", pool=pool, count=1, domain={objects.BLOCK: "b1", objects.RACK: "b1-r1"},
        owner="ns/gone", owner_uid="gone-uid"))
    assert [n.key for n in await provider.list(pool)] == ["stray-0"]
    await kube.delete(CAPACITY_POOLS, "gpu")
    for _ in range(5):  # several finalizer passes: the pool stays while the cloud holds it
        await asyncio.sleep(0.1)
        held = await kube.get_or_none(CAPACITY_POOLS, "gpu")
        assert held is not None and "muster.dev/release-nodes" in held["metadata"]["finalizers"]

    async def gone() -> bool:
        await clock.advance(controller.config.acquisition.orphan_grace_seconds)
        return await kube.get_or_none(CAPACITY_POOLS, "gpu") is None

    await eventually(gone, within=30.0, step=0.05)
    assert [c.key for c in provider.calls if c.op == "release"] == ["stray-0"]
    assert await provider.list(pool) == []
