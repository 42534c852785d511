"""ProvisioningRequests end to end, as a user of the cluster sees them.

Each test submits PodTemplates and ProvisioningRequests through the API and asserts on
conditions, provisioningClassDetails, Nodes and Pods only, so it runs unchanged against
the sandbox and a kind cluster.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.commands import objects
from controller.kube import ApiError
from controller.kube.resources import (
    CAPACITY_POOLS,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
)
from e2e.conftest import Env, eventually

CHECK = "check-capacity.muster.dev"
ATOMIC = "atomic-provisioning.muster.dev"


async def test_fits_on_existing_nodes(env: Env) -> None:
    nodes = await env.existing_gpu_nodes(4, rack="b1-r2")
    await env.worker_template()
    await env.request("fits", [("workers", 4)], class_name=CHECK)

    cond = await env.wait_condition("fits", "Provisioned")
    assert cond["reason"] == "CapacityIsFound"
    pr = await env.get("fits")
    details = pr["status"]["provisioningClassDetails"]
    assert details[objects.RACK] == "b1-r2"
    assert details["muster.dev/topology-level"] == objects.RACK
    listing = await env.kube.list(NODES, label_selector=f"e2e.muster.dev/run={env.run}")
    assert sorted(n["metadata"]["name"] for n in listing["items"]) == sorted(nodes)


async def test_needs_provisioning_then_pods_consume_the_booking(env: Env) -> None:
    pool = await env.gpu_pool()
    worker = await env.worker_template()
    await env.request("train", [("workers", 6)], class_name=ATOMIC)

    cond = await env.wait_condition("train", "Provisioned")
    assert cond["reason"] == "CapacityIsProvisioned"
    new = await env.pool_nodes(pool)
    assert len(new) == 6
    racks = {n["metadata"]["labels"][objects.RACK] for n in new}
    assert len(racks) == 1, f"the gang was split across racks {racks}"
    details = (await env.get("train"))["status"]["provisioningClassDetails"]
    assert details[objects.RACK] == racks.pop()

    await env.pods_for("train", worker, 6)
    cond = await env.wait_condition("train", "BookingExpired")
    assert cond["reason"] == "CapacityBookingConsumed"
    assert await env.bound_pods() == 6


async def test_two_requests_never_count_the_same_free_capacity(env: Env) -> None:
    await env.existing_gpu_nodes(4)
    await env.worker_template()
    reasons = await env.compete(("first", "second"), [("workers", 3)], class_name=CHECK)
    # The loser keeps missing (and with e2e's short retry budget may already have failed).
    assert reasons[1] == "True/CapacityIsFound"
    assert reasons[0] in ("False/CapacityIsNotFound", "False/RetriesExhausted")


async def test_stock_out_is_retried_then_failed_without_leaking_nodes(env: Env) -> None:
    # The pool's declared limits allow the gang, but the provider has only 2 nodes in stock:
    # every attempt launches 2, rolls them back and fails.
    pool = await env.gpu_pool(parameters={"defaultStock": 2})
    await env.worker_template()
    await env.request("stockout", [("workers", 4)], class_name=ATOMIC)

    retrying = await env.wait_condition("stockout", "Provisioned", "False")
    assert retrying["reason"] in ("Provisioning", "AcquisitionFailed", "RetriesExhausted")
    failed = await env.wait_condition("stockout", "Failed", within=30)
    assert failed["reason"] == "RetriesExhausted"
    assert "could only launch 2 of 4" in failed["message"]
    assert await env.pool_nodes(pool) == []
    if env.provider is not None:
        acquires = [c for c in env.provider.calls if c.op == "acquire" and c.pool == pool]
        assert len(acquires) == env.config.retry.max_attempts
        assert {c.outcome for c in acquires} == {"CapacityUnavailable"}


@pytest.mark.parametrize(
    ("templates", "pod_sets", "kwargs", "reason", "words"),
    [
        pytest.param(
            [], [("absent", 2)], {}, "FailedToCreatePods", "PodTemplate",
            id="missing-pod-template",
        ),
        pytest.param(
            ["workers"], [("workers", 2)], {"parameters": {"noRetry": "maybe"}},
            "InvalidParameters", "noRetry must be true or false", id="unreadable-parameter",
        ),
        pytest.param(
            ["workers@galaxy"], [("workers", 2)], {}, "InvalidParameters", "galaxy",
            id="unknown-topology-level",
        ),
        pytest.param(
            ["workers"], [("workers", 40)], {}, "CapacityNeverFits", "never fit",
            id="larger-than-any-rack",
        ),
    ],
)
async def test_invalid_input_fails_with_a_precise_reason(
    env: Env,
    templates: list[str],
    pod_sets: list[tuple[str, int]],
    kwargs: dict[str, object],
    reason: str,
    words: str,
) -> None:
    await env.gpu_pool(blocks=1, racks_per_block=2, nodes_per_rack=16)
    for spec in templates:
        name, _, level = spec.partition("@")
        await env.worker_template(name, level=level or objects.RACK)
    if env.external and reason == "InvalidParameters" and "parameters" in kwargs:
        # The real tier installs config/admission: the API server refuses it at the door.
        with pytest.raises(ApiError) as refused:
            await env.request("bad", pod_sets, class_name=ATOMIC, **kwargs)
        assert refused.value.status == 422 and words in refused.value.body
        return
    await env.request("bad", pod_sets, class_name=ATOMIC, **kwargs)

    failed = await env.wait_condition("bad", "Failed")
    assert failed["reason"] == reason
    assert words in failed["message"]


@pytest.mark.parametrize(("spec", "reason", "words"), [
    pytest.param({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]},
                 "UnsupportedConstraint", "spec.volumes[0] (data)", id="pvc-volume"),
    pytest.param({"runtimeClassName": "gvisor"}, "UnsupportedConstraint",
                 "spec.runtimeClassName gvisor", id="runtime-class"),
])
async def test_constraints_muster_cannot_plan_or_the_api_would_refuse_fail(
    env: Env, spec: dict[str, object], reason: str, words: str,
) -> None:
    await env.gpu_pool(blocks=1, racks_per_block=2, nodes_per_rack=16)
    body = objects.pod_template("odd", namespace=env.namespace, requests={"cpu": "1"},
                                tolerations=[objects.GPU_TOLERATION])
    body["template"]["spec"].update(spec)
    await env.kube.create(POD_TEMPLATES, body, namespace=env.namespace)
    await env.request("odd", [("odd", 2)], class_name=ATOMIC)
    failed = await env.wait_condition("odd", "Failed")
    assert failed["reason"] == reason
    assert words in failed["message"]


async def test_booking_expires_and_unused_nodes_are_released(env: Env) -> None:
    pool = await env.gpu_pool()
    await env.worker_template()
    await env.request("idle", [("workers", 3)], class_name=ATOMIC)
    await env.wait_condition("idle", "Provisioned")
    assert len(await env.pool_nodes(pool)) == 3

    cond = await env.wait_condition(
        "idle", "BookingExpired", within=env.config.booking.duration_seconds + 10
    )
    assert cond["reason"] == "CapacityReservationTimeExpired"
    await eventually(lambda: _none_left(env, pool))


async def test_booked_nodes_vanishing_revokes_the_capacity(env: Env) -> None:
    pool = await env.gpu_pool()
    await env.worker_template()
    await env.request("revoked", [("workers", 2)], class_name=ATOMIC)
    await env.wait_condition("revoked", "Provisioned")
    victim = (await env.pool_nodes(pool))[0]["metadata"]["name"]

    await env.kube.delete(NODES, victim)

    # Noticed when the node goes, not when the booking is next due (its expiry).
    cond = await env.wait_condition("revoked", "CapacityRevoked",
                                    within=env.config.booking.duration_seconds / 2)
    assert victim in cond["message"]


UNUSABLE = {
    # how a booked existing node stops taking the gang's pods: (its patch, the words said)
    "tainted": ({"spec": {"taints": [objects.GPU_TAINT, {
        "key": "example.com/maintenance", "value": "now", "effect": "NoSchedule"}]}},
        "taint example.com/maintenance=now:NoSchedule not tolerated"),
    "evicting": ({"spec": {"taints": [objects.GPU_TAINT, {
        "key": "example.com/drain", "effect": "NoExecute"}]}},
        "taint example.com/drain:NoExecute not tolerated"),
    "cordoned": ({"spec": {"unschedulable": True}}, "cordoned"),
    "unlabelled": ({"metadata": {"labels": {"e2e.muster.dev/run": None}}},
                   "no longer match the node selector"),
}


@pytest.mark.parametrize("change", sorted(UNUSABLE))
async def test_a_booked_existing_node_that_becomes_unusable_revokes_the_capacity(
    env: Env, change: str
) -> None:
    """A node booked for a gang that gets a taint its pods do not tolerate, a cordon, or
    loses a label their nodeSelector needs, before the pods came: the pods could never be
    scheduled there, so the booking is revoked at once, naming the node and why."""
    nodes = await env.existing_gpu_nodes(2, rack="b1-r3")
    await env.worker_template()
    await env.request("spoilt", [("workers", 2)], class_name=CHECK)
    cond = await env.wait_condition("spoilt", "Provisioned")
    assert cond["reason"] == "CapacityIsFound"
    patch, words = UNUSABLE[change]
    await env.kube.merge_patch(NODES, nodes[0], patch)

    cond = await env.wait_condition("spoilt", "CapacityRevoked",
                                    within=env.config.booking.duration_seconds / 2)
    assert cond["reason"] == "BookedNodesUnusable", cond
    assert nodes[0] in cond["message"] and words in cond["message"], cond
    assert nodes[1] not in cond["message"], cond


async def test_deleting_a_request_releases_its_unused_nodes(env: Env) -> None:
    pool = await env.gpu_pool()
    await env.worker_template()
    await env.request("gone", [("workers", 2)], class_name=ATOMIC)
    await env.wait_condition("gone", "Provisioned")
    assert len(await env.pool_nodes(pool)) == 2

    await env.kube.delete(PROVISIONING_REQUESTS, "gone", namespace=env.namespace)

    await eventually(lambda: _none_left(env, pool))
    await eventually(lambda: _request_gone(env, "gone"))


async def test_gang_nodes_are_released_together_once_idle(env: Env) -> None:
    pool = await _gang_running_on_new_nodes(env, "job", 2)

    for i in range(2):
        await env.kube.delete(PODS, f"job-{i}", namespace=env.namespace)
    assert len(await env.pool_nodes(pool)) == 2  # still there: the idle TTL has not passed

    await eventually(lambda: _none_left(env, pool), within=env.config.acquisition.idle_ttl_seconds
                     + 10)


async def test_restart_mid_acquisition_neither_doubles_nor_leaks(env: Env) -> None:
    if env.restart is None or env.stop_controller is None or env.start_controller is None:
        pytest.skip("needs a controller this test can stop: --kubeconfig names a cluster "
                    "where Muster runs on its own")
    # Nodes take 2 s to become Ready, so the controller is stopped after the provider
    # created them but before the request was marked Provisioned.
    pool = await env.gpu_pool(parameters={"readyDelaySeconds": 2})
    await env.worker_template()
    await env.request("resume", [("workers", 4)], class_name=ATOMIC)
    await eventually(lambda: _has_nodes(env, pool, 4))
    pr = await env.get("resume")
    assert pr["metadata"]["annotations"]["muster.dev/phase"] == "Acquiring"
    await env.stop_controller()
    before = {n["metadata"]["name"]: n["metadata"]["uid"] for n in await env.pool_nodes(pool)}

    # A node from an interrupted earlier attempt of this request: an orphan to collect.
    from controller.api.capacitypool import CapacityPool
    from controller.kube.resources import CAPACITY_POOLS
    from providers.base import AcquireRequest
    from providers.fake import FakeProvider

    pool_obj = CapacityPool.model_validate(await env.kube.get(CAPACITY_POOLS, pool))
    stale = f"{pr['metadata']['uid']}-0-0"
    await FakeProvider(env.kube).acquire(AcquireRequest(
        key=stale, pool=pool_obj, count=1, domain={objects.BLOCK: "b2", objects.RACK: "b2-r4"},
        owner=f"{env.namespace}/resume", owner_uid=pr["metadata"]["uid"],
    ))
    await env.start_controller()

    cond = await env.wait_condition("resume", "Provisioned")
    assert cond["reason"] == "CapacityIsProvisioned"
    await eventually(lambda: _has_nodes(env, pool, 4, exactly=True))
    keys = {n["metadata"]["labels"]["muster.dev/acquisition-key"]
            for n in await env.pool_nodes(pool)}
    assert stale not in keys and len(keys) == 1
    # The restarted controller found the nodes under the same key instead of making new ones.
    after = {n["metadata"]["name"]: n["metadata"]["uid"] for n in await env.pool_nodes(pool)}
    assert after == before


async def _gang_running_on_new_nodes(env: Env, name: str, workers: int) -> str:
    """A pool, a gang provisioned from it and its pods bound (booking consumed)."""
    pool = await env.gpu_pool()
    worker = await env.worker_template()
    await env.request(name, [("workers", workers)], class_name=ATOMIC)
    await env.wait_condition(name, "Provisioned")
    await env.pods_for(name, worker, workers)
    await env.wait_condition(name, "BookingExpired")
    return pool


async def _none_left(env: Env, pool: str) -> bool:
    return not await env.pool_nodes(pool)


async def _has_nodes(env: Env, pool: str, count: int, *, exactly: bool = False) -> bool:
    have = len(await env.pool_nodes(pool))
    return have == count if exactly else have >= count


async def _request_gone(env: Env, name: str) -> bool:
    return await env.kube.get_or_none(
        PROVISIONING_REQUESTS, name, namespace=env.namespace
    ) is None


async def test_requests_of_other_classes_are_left_alone(env: Env) -> None:
    await env.existing_gpu_nodes(2)
    await env.worker_template()
    await env.request("foreign", [("workers", 1)], class_name="queued-provisioning.gke.io")
    await env.request("ours", [("workers", 1)], class_name=CHECK)

    await env.wait_condition("ours", "Provisioned")
    pr = await env.get("foreign")
    assert not (pr.get("status") or {}).get("conditions")
    assert "muster.dev/phase" not in (pr["metadata"].get("annotations") or {})


async def test_a_rack_out_of_stock_is_avoided_on_the_retry(env: Env) -> None:
    empty = {objects.BLOCK: "b1", objects.RACK: "b1-r1"}
    pool = await env.gpu_pool(blocks=1, racks_per_block=2,
                              parameters={"stock": [{"labels": empty, "nodes": 0}]})
    await env.worker_template()
    await env.request("moves", [("workers", 3)], class_name=ATOMIC)

    cond = await env.wait_condition("moves", "Provisioned")
    assert cond["reason"] == "CapacityIsProvisioned"
    racks = {n["metadata"]["labels"][objects.RACK] for n in await env.pool_nodes(pool)}
    assert racks == {"b1-r2"}
    if env.provider is not None:
        tried = [dict(c.domain)[objects.RACK] for c in env.provider_calls() if c.op == "acquire"]
        assert tried[-1] == "b1-r2" and set(tried[:-1]) <= {"b1-r1"}


async def test_a_deleted_pool_keeps_nodes_in_use_and_releases_them_when_idle(env: Env) -> None:
    pool = await _gang_running_on_new_nodes(env, "job", 2)
    nodes = sorted(n["metadata"]["name"] for n in await env.pool_nodes(pool))

    await env.kube.delete(CAPACITY_POOLS, pool)

    # Muster's finalizer holds the pool (and so the provider's settings) while its nodes
    # run the gang's pods; a new request can no longer get nodes from it.
    held = await env.kube.get(CAPACITY_POOLS, pool)
    assert held["metadata"].get("deletionTimestamp")
    assert "muster.dev/release-nodes" in held["metadata"]["finalizers"]
    await env.request("late", [("workers", 1)], class_name=ATOMIC)
    late = await env.wait_condition("late", "Provisioned", "False")
    assert late["reason"] != "CapacityIsProvisioned"
    assert sorted(n["metadata"]["name"] for n in await env.pool_nodes(pool)) == nodes

    for i in range(2):
        await env.kube.delete(PODS, f"job-{i}", namespace=env.namespace)
    await eventually(lambda: _none_left(env, pool), within=20, what="the pool's nodes to go")

    async def pool_gone() -> bool:
        return await env.kube.get_or_none(CAPACITY_POOLS, pool) is None

    await eventually(pool_gone, within=10, what="the pool to be deleted")


async def test_a_pool_deleted_while_an_acquisition_runs_is_kept_until_its_nodes_are_gone(
    env: Env,
) -> None:
    """The pool and the request are deleted while the provider is still creating the
    request's nodes (Kueue deletes and recreates its requests; a user tears down both): the
    pool's finalizer holds until those nodes exist and are released, so the provider's
    settings never go while nodes acquired through them are alive (a leak for good)."""
    pool = await env.gpu_pool(parameters={"latencySeconds": 2})
    await env.worker_template()
    await env.request("racing", [("workers", 2)], class_name=ATOMIC)

    async def acquiring() -> bool:
        got = await env.get("racing")
        return (got["metadata"].get("annotations") or {}).get("muster.dev/phase") == "Acquiring"

    await eventually(acquiring, within=30, what="Muster to start acquiring")
    await env.kube.delete(PROVISIONING_REQUESTS, "racing", namespace=env.namespace)
    await env.kube.delete(CAPACITY_POOLS, pool)

    async def pool_gone() -> bool:
        return await env.kube.get_or_none(CAPACITY_POOLS, pool) is None

    await eventually(pool_gone, within=30, what="the pool to be deleted")
    # The acquisition ran past the deletion; nothing it made may outlive the pool.
    loop = asyncio.get_running_loop()
    until = loop.time() + 4
    while loop.time() < until:
        left = [n["metadata"]["name"] for n in await env.pool_nodes(pool)]
        assert not left, f"nodes of deleted pool {pool} left behind: {left}"
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("change, reason", [
    ("delete", "PodTemplateDeleted"),
    ("edit", "PodTemplateChanged"),
])
async def test_booking_is_revoked_when_its_template_goes_or_changes(
    env: Env, change: str, reason: str
) -> None:
    pool = await env.gpu_pool()
    await env.worker_template()
    await env.request("stale", [("workers", 2)], class_name=ATOMIC)
    await env.wait_condition("stale", "Provisioned")
    assert len(await env.pool_nodes(pool)) == 2
    if change == "delete":
        await env.kube.delete(POD_TEMPLATES, "workers", namespace=env.namespace)
    else:
        await env.kube.merge_patch(POD_TEMPLATES, "workers", {"template": {"spec": {
            "nodeSelector": {"muster.dev/accelerator": "a100"}}}}, namespace=env.namespace)
    revoked = await env.wait_condition("stale", "CapacityRevoked",
                                       within=env.config.booking.duration_seconds / 2)
    assert revoked["reason"] == reason
    assert f"{env.namespace}/workers" in revoked["message"]
    assert "revoked (not re-planned)" in revoked["message"]
    await eventually(lambda: _none_left(env, pool))


async def test_booking_survives_an_unrelated_template_edit(env: Env) -> None:
    await env.gpu_pool()
    await env.worker_template()
    other = objects.pod_template("other", namespace=env.namespace, requests={"cpu": "1"})
    await env.kube.create(POD_TEMPLATES, other, namespace=env.namespace)
    await env.request("kept", [("workers", 1)], class_name=ATOMIC)
    await env.wait_condition("kept", "Provisioned")
    await env.kube.delete(POD_TEMPLATES, "other", namespace=env.namespace)
    # Relabelling the template (not its pods) plans the same: the booking stays.
    await env.kube.merge_patch(POD_TEMPLATES, "workers", {"metadata": {"labels": {"x": "y"}}},
                               namespace=env.namespace)
    await asyncio.sleep(0.5)  # the edits' notifications reconcile "kept" meanwhile
    pr = await env.get("kept")
    types = {c["type"] for c in (pr.get("status") or {}).get("conditions") or []}
    assert "CapacityRevoked" not in types


SLICES = {"kueue.x-k8s.io/podset-slice-required-topology": objects.RACK,
          "kueue.x-k8s.io/podset-slice-size": "4"}


async def test_slices_stay_whole_inside_the_required_block(env: Env) -> None:
    # Every rack of block b1 can take 3 more nodes (9 in the block), those of b2 4 each:
    # 8 workers in one block, in slices of 4 per rack, fit b1's room but no b1 rack holds a
    # slice, so b2 it is (planning the block alone chose b1 and split the slices 3 + 3 + 2).
    limits = {f"b{b}-r{r}": 3 if b == 1 else 4 for b in (1, 2) for r in range(1, 5)}
    pool = await env.gpu_pool(rack_limits=limits)
    worker = await env.worker_template(level=objects.BLOCK, annotations=SLICES)
    await env.request("sliced", [("workers", 8)], class_name=ATOMIC)

    cond = await env.wait_condition("sliced", "Provisioned")
    assert cond["reason"] == "CapacityIsProvisioned"
    new = await env.pool_nodes(pool)
    per_rack: dict[str, int] = {}
    for n in new:
        rack = n["metadata"]["labels"][objects.RACK]
        per_rack[rack] = per_rack.get(rack, 0) + 1
    assert sum(per_rack.values()) == 8 and all(v % 4 == 0 for v in per_rack.values()), per_rack
    assert {n["metadata"]["labels"][objects.BLOCK] for n in new} == {"b2"}
    details = (await env.get("sliced"))["status"]["provisioningClassDetails"]
    assert details[objects.BLOCK] == "b2"

    await env.pods_for("sliced", worker, 8)
    cond = await env.wait_condition("sliced", "BookingExpired")
    assert cond["reason"] == "CapacityBookingConsumed"
    assert await env.bound_pods() == 8


async def test_slices_no_rack_can_hold_never_fit(env: Env) -> None:
    await env.gpu_pool(rack_limits={f"b{b}-r{r}": 3 for b in (1, 2) for r in range(1, 5)})
    await env.worker_template(level=objects.BLOCK, annotations=SLICES)
    await env.request("unsliceable", [("workers", 8)], class_name=ATOMIC)

    cond = await env.wait_condition("unsliceable", "Failed")
    assert cond["reason"] == "CapacityNeverFits"
    assert "in slices of 4 pods, each within one rack" in cond["message"], cond["message"]
    assert "which holds 0 of the 2 slices" in cond["message"], cond["message"]


async def test_a_reserved_pool_is_used_first_and_never_past_its_reservation(env: Env) -> None:
    """Two pools serve the gangs: an on-demand one, cheaper, in racks of its own, and one
    drawing from a reservation of 4 nodes (one rack). The first gang (3 nodes, one rack)
    goes into the reservation although on demand is cheaper; the second (2 nodes), which
    the reservation's last free node cannot hold, is planned on demand: nothing is asked of
    the reserved pool for it."""
    reserved, ondemand = env.name("reserved"), env.name("ondemand")
    for name, price, parameters in (
        (reserved, 98.0, {"reservation": {"id": f"odcr-{env.run}", "nodes": 4}}),
        (ondemand, 50.0, {}),
    ):
        body = objects.gpu_pool(name, parameters=parameters, price=price, blocks=1,
                                racks_per_block=2)
        if name == ondemand:
            for domain in body["spec"]["topology"]["domains"]:
                domain["labels"] = {k: f"od-{v}" for k, v in domain["labels"].items()}
        body["spec"]["nodeTemplate"]["labels"].update(env.selector)
        await env.kube.create(CAPACITY_POOLS, body)
        env.cleanup.append(lambda n=name: env.kube.delete(CAPACITY_POOLS, n))  # type: ignore[misc]

    async def figures() -> dict[str, Any] | None:
        pool = await env.kube.get(CAPACITY_POOLS, reserved)
        rows = (pool.get("status") or {}).get("reservations") or []
        return rows[0] if rows else None

    row = await eventually(figures, within=20)
    assert (row["id"], row["reserved"], row["free"]) == (f"odcr-{env.run}", 4, 4)
    await env.worker_template()
    await env.request("first", [("workers", 3)], class_name=ATOMIC)
    await env.wait_condition("first", "Provisioned")
    assert len(await env.pool_nodes(reserved)) == 3
    assert await env.pool_nodes(ondemand) == []

    await env.request("second", [("workers", 2)], class_name=ATOMIC)
    await env.wait_condition("second", "Provisioned")
    assert len(await env.pool_nodes(ondemand)) == 2
    assert len(await env.pool_nodes(reserved)) == 3, "the reservation was not overbooked"
    if env.provider is not None:
        asked = [c for c in env.provider.calls if c.op == "acquire" and c.pool == reserved]
        assert len(asked) == 1, asked


async def test_a_reservation_too_small_for_the_gang_fails_without_a_launch(env: Env) -> None:
    pool = env.name("reserved")
    body = objects.gpu_pool(pool, parameters={"reservation": {"id": f"r-{env.run}", "nodes": 1}},
                            blocks=1, racks_per_block=1)
    body["spec"]["nodeTemplate"]["labels"].update(env.selector)
    await env.kube.create(CAPACITY_POOLS, body)
    env.cleanup.append(lambda: env.kube.delete(CAPACITY_POOLS, pool))

    async def figures() -> list[Any] | None:
        found = await env.kube.get(CAPACITY_POOLS, pool)
        return (found.get("status") or {}).get("reservations")

    await eventually(figures, within=20)
    await env.worker_template()
    await env.request("big", [("workers", 2)], class_name=ATOMIC)
    failed = await env.wait_condition("big", "Failed")
    assert failed["reason"] == "CapacityNeverFits"
    assert "can add 1 more nodes there (what the reservation it draws from has free)" in (
        failed["message"])
    assert await env.pool_nodes(pool) == []
    if env.provider is not None:
        assert [c for c in env.provider.calls if c.pool == pool] == []
