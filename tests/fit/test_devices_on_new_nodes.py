"""Devices on nodes that do not exist yet (CapacityPool node templates), booking, shared
claims, and the equivalence-class cache."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import controller.fit.devices as devices_mod
from controller.fit import Mode, NoFit, Plan, ReasonCode, apply_plan, plan
from controller.inputs.dra_templates import nvidia_gpu_node
from tests.dra_world import (
    CLASSES,
    NS,
    PCIE,
    build,
    claim_template,
    dra_node,
    exactly,
    gang_docs,
    pool_doc,
    run,
)

Doc = dict[str, Any]
PAIR = claim_template("pair", [exactly("gpu", "gpu.nvidia.com", 1), exactly("nic", "nic", 1)],
                      match=[(PCIE, ["gpu", "nic"])])
GPUS_ONLY = nvidia_gpu_node(gpus=8, nics=0, roots=4)
GPU_NIC = nvidia_gpu_node(gpus=8, nics=8, roots=4)


def test_claim_that_fits_only_a_pool_template_provisions_new_nodes() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPUS_ONLY), PAIR]
    request = gang_docs("g", [("w", 12, ["pair"])])
    pools = [pool_doc("gpu-nic", GPU_NIC, price=30.0), pool_doc("gpu-only", GPUS_ONLY,
                                                                 price=1.0)]
    check = run(cluster, request, pools, Mode.CHECK)
    assert isinstance(check, NoFit)
    got = run(cluster, request, pools, Mode.PROVISION)
    assert isinstance(got, Plan)
    # 8 pairs per new node: 2 nodes of the pool whose template has NICs (the cheaper pool's
    # nodes have no NIC, so they cannot hold a single pod).
    assert [(n.pool, n.count) for n in got.new_nodes] == [("gpu-nic", 2)]
    assert sorted(a.pods for a in got.assignments) == [4, 8]
    for a in got.assignments:
        assert a.node is None and a.new_node is not None
        assert len(a.devices) == a.pods
        for pod in a.devices:
            (claim,) = pod
            assert {r.driver for r in claim.results} == {"gpu.nvidia.com", "nic.example.com"}
            assert {r.pool for r in claim.results} == {""}  # named after the node, later


def test_existing_devices_are_used_before_new_nodes() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), PAIR]
    got = run(cluster, gang_docs("g", [("w", 10, ["pair"])]), [pool_doc("p", GPU_NIC)],
              Mode.PROVISION)
    assert isinstance(got, Plan)
    placed = {(a.node or "new"): a.pods for a in got.assignments}
    assert placed == {"n1": 8, "new": 2}
    assert sum(n.count for n in got.new_nodes) == 1


def test_claim_that_fits_nowhere_names_the_pool_template_failure() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPUS_ONLY), PAIR]
    got = run(cluster, gang_docs("g", [("w", 1, ["pair"])]), [pool_doc("p", GPUS_ONLY)],
              Mode.PROVISION)
    assert isinstance(got, NoFit)
    assert got.permanent
    text = got.reasons[-1].message
    assert "pool p: request nic of claim template pair: no node offers 1 device of class nic" \
        in text
    assert "1 without the devices its claims need" in text


def test_pool_template_with_partitions_provisions_for_mig_claims() -> None:
    from controller.inputs.dra_templates import nvidia_mig_node

    mig = claim_template("mig", [exactly("mig", "mig.nvidia.com", 1, selectors=[
        'device.attributes["gpu.nvidia.com"].profile == "3g.40gb"'])])
    cluster = [*CLASSES, *dra_node("n1", GPUS_ONLY), mig]
    got = run(cluster, gang_docs("g", [("w", 5, ["mig"])]),
              [pool_doc("mig", nvidia_mig_node(gpus=2))], Mode.PROVISION)
    assert isinstance(got, Plan)
    # 2 GPUs x 2 placements of 3g.40gb per new node: 5 pods need 2 nodes.
    assert [(n.pool, n.count) for n in got.new_nodes] == [("mig", 2)]


def test_apply_plan_books_devices() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), PAIR]
    gang, snap = build(cluster, gang_docs("g", [("w", 6, ["pair"])]))
    first = plan(gang, snap, Mode.CHECK)
    assert isinstance(first, Plan)
    booked = apply_plan(snap, first)
    assert len(booked.nodes[0].devices.shape.state.used) == 12  # 6 GPUs + 6 NICs
    again = plan(replace(gang, pod_sets=(replace(gang.pod_sets[0], count=3),)), booked,
                 Mode.CHECK)
    assert isinstance(again, NoFit)
    assert again.reasons[-1].best == 2


def test_allocated_claims_count_as_used_devices() -> None:
    taken = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "running", "namespace": "other"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": f"gpu-{i}"}
            for i in range(4)]}}},
    }
    two_per_root = claim_template("t", [exactly("gpu", "gpu.nvidia.com", 2),
                                        exactly("nic", "nic", 1)],
                                  match=[(PCIE, ["gpu", "nic"])])
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), taken, two_per_root]
    fits = run(cluster, gang_docs("g", [("w", 2, ["t"])]))
    assert isinstance(fits, Plan)
    used = {r.device for pod in fits.assignments[0].devices for c in pod for r in c.results}
    assert used.isdisjoint({f"gpu-{i}" for i in range(4)})
    assert isinstance(run(cluster, gang_docs("g", [("w", 3, ["t"])])), NoFit)


def _shared_claim(allocated_on: str | None) -> Doc:
    claim: Doc = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "shared", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com"}}]}},
    }
    if allocated_on:
        claim["status"] = {"allocation": {
            "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com",
                                     "pool": allocated_on, "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [allocated_on]}]}]},
        }}
    return claim


def _with_shared(docs: list[Doc]) -> list[Doc]:
    spec = docs[1]["template"]["spec"]
    spec["resourceClaims"] = [{"name": "s", "resourceClaimName": "shared"}]
    spec["containers"][0]["resources"]["claims"] = [{"name": "s"}]
    return docs


def test_allocated_shared_claim_pins_pods_to_its_node() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), *dra_node("n2", GPU_NIC),
               _shared_claim("n2")]
    got = run(cluster, _with_shared(gang_docs("g", [("w", 3, [])])))
    assert isinstance(got, Plan)
    assert [a.node for a in got.assignments] == ["n2"]


def test_unallocated_shared_claim_is_reported() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), _shared_claim(None)]
    got = run(cluster, _with_shared(gang_docs("g", [("w", 2, [])])))
    assert isinstance(got, NoFit)
    assert got.reasons[0].code is ReasonCode.INVALID
    assert "ResourceClaim team-a/shared is shared by the pods and not allocated yet" \
        in got.reasons[0].message


def _count_searches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    original = devices_mod._Search.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(devices_mod._Search, "__init__", counting)
    return calls


@pytest.mark.parametrize("nodes", [1, 40])
def test_identical_nodes_cost_one_search(monkeypatch: pytest.MonkeyPatch, nodes: int) -> None:
    cluster = [*CLASSES, PAIR]
    for i in range(nodes):
        cluster += dra_node(f"n{i:02d}", GPU_NIC)
    gang, snap = build(cluster, gang_docs("g", [("w", 8, ["pair"])]))
    # Every node publishes different GPU uuids, yet they share one device shape.
    assert len({id(n.devices.shape) for n in snap.nodes}) == 1
    calls = _count_searches(monkeypatch)
    assert isinstance(plan(gang, snap, Mode.CHECK), Plan)
    # 8 pods fit on a node, the 9th search fails: independent of the number of nodes.
    assert calls[0] == 9


def test_selector_reading_a_uuid_tells_nodes_apart() -> None:
    from controller.inputs.dra_templates import device_uuid

    wanted = device_uuid("n2", "gpu-3")
    pick = claim_template("pick", [exactly("gpu", "gpu.nvidia.com", 1, selectors=[
        f'device.attributes["gpu.nvidia.com"].uuid == "{wanted}"'])])
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), *dra_node("n2", GPU_NIC),
               *dra_node("n3", GPU_NIC), pick]
    got = run(cluster, gang_docs("g", [("w", 1, ["pick"])]))
    assert isinstance(got, Plan)
    (a,) = got.assignments
    assert a.node == "n2"
    assert [r.device for r in a.devices[0][0].results] == ["gpu-3"]
    assert isinstance(run(cluster, gang_docs("g", [("w", 2, ["pick"])])), NoFit)


def test_cpu_bounds_each_node_even_when_devices_are_identical() -> None:
    # Both nodes publish the same devices (one search), but the second has cpu for 2 pods.
    cluster = [*CLASSES, *dra_node("big", GPU_NIC), *dra_node("small", GPU_NIC, cpu="16"),
               PAIR]
    fits = run(cluster, gang_docs("g", [("w", 10, ["pair"])], cpu="8"))
    assert isinstance(fits, Plan)
    assert {a.node: a.pods for a in fits.assignments} == {"big": 8, "small": 2}
    assert isinstance(run(cluster, gang_docs("g", [("w", 11, ["pair"])], cpu="8")), NoFit)


def test_failure_says_when_matching_devices_are_taken() -> None:
    from controller.fit.devices import ClaimFitter

    taken = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "running", "namespace": "other"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": f"gpu-{i}"}
            for i in range(7)]}}},
    }
    two = claim_template("two", [exactly("gpu", "gpu.nvidia.com", 2)])
    gang, snap = build([*CLASSES, *dra_node("n1", GPU_NIC), taken, two],
                       gang_docs("g", [("w", 1, ["two"])]))
    got = ClaimFitter(gang.pod_sets[0].shape.claims).run(snap.nodes[0].devices, 1)
    assert got.failure == ("request gpu of claim template two: only 1 of the 8 devices "
                           "matching 2 devices of class gpu.nvidia.com are free")


def test_admin_access_uses_busy_devices_without_holding_them() -> None:
    busy = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "running", "namespace": "other"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": f"gpu-{i}"}
            for i in range(8)] + [
            {"request": "mon", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0",
             "adminAccess": True}]}}},
    }
    monitor = claim_template("monitor", [exactly("gpu", "gpu.nvidia.com", mode="All")])
    monitor["spec"]["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    plain = claim_template("plain", [exactly("gpu", "gpu.nvidia.com", 1)])
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), busy, monitor, plain]
    # Every GPU is taken, yet an admin claim for all of them fits, for several pods.
    got = run(cluster, gang_docs("g", [("w", 2, ["monitor"])]))
    assert isinstance(got, Plan)
    results = [r for pod in got.assignments[0].devices for c in pod for r in c.results]
    assert len(results) == 16 and all(r.admin_access for r in results)
    assert isinstance(run(cluster, gang_docs("g", [("w", 1, ["plain"])])), NoFit)
    # Without the running claim, admin pods and ordinary pods share the node.
    free = [*CLASSES, *dra_node("n1", GPU_NIC), monitor, plain]
    both = run(free, gang_docs("g", [("a", 1, ["monitor"]), ("b", 8, ["plain"])]))
    assert isinstance(both, Plan)
