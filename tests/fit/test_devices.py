"""Device allocation through the whole engine: how many pods with ResourceClaims fit on a
node, computed by hand for each case, and which devices they get."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from controller.fit import NoFit, Plan, ReasonCode
from controller.inputs.dra_templates import NVIDIA_DRIVER, nvidia_gpu_node, nvidia_mig_node
from tests.dra_world import (
    CLASSES,
    NIC_DRIVER,
    PCIE,
    claim_template,
    dra_node,
    exactly,
    first_available,
    gang_docs,
    node,
    run,
)

Doc = dict[str, Any]
GPU_NIC = nvidia_gpu_node(gpus=8, nics=8, roots=4)
"""8 GPUs and 8 NICs over 4 PCIe roots: 2 GPUs and 2 NICs per root."""


def shared_gpu(memory: str = "80Gi", policy: Doc | None = None) -> list[Doc]:
    """One GPU whose memory can be shared by several claims (consumable capacity)."""
    cap: Doc = {"value": memory}
    if policy is not None:
        cap["requestPolicy"] = policy
    return [{"driver": NVIDIA_DRIVER, "devices": [{
        "name": "gpu-0",
        "allowMultipleAllocations": True,
        "attributes": {"type": {"string": "gpu"}},
        "capacity": {"memory": cap},
    }]}]


def pods_per_node(slices: Sequence[Doc], templates: Sequence[Doc], cpu: str = "1") -> int:
    """The most pods (each with one claim per template) the engine fits on one node."""
    cluster = [*CLASSES, *dra_node("n1", slices), *templates]
    names = [t["metadata"]["name"] for t in templates]
    best = 0
    for count in range(1, 20):
        got = run(cluster, gang_docs("g", [("w", count, names)], cpu=cpu))
        if not isinstance(got, Plan):
            break
        best = count
    return best


gpu_nic_root = claim_template(
    "gpu-nic", [exactly("gpu", "gpu.nvidia.com", 2), exactly("nic", "nic", 1)],
    match=[(PCIE, ["gpu", "nic"])],
)

CASES: list[tuple[str, list[Doc], list[Doc], int]] = [
    # 2 GPUs + 1 NIC on one root: one pod per root (each root has exactly 2 GPUs).
    ("2 gpu + 1 nic on one root", GPU_NIC, [gpu_nic_root], 4),
    ("1 gpu + 1 nic on one root", GPU_NIC, [claim_template(
        "t", [exactly("gpu", "gpu.nvidia.com", 1), exactly("nic", "nic", 1)],
        match=[(PCIE, ["gpu", "nic"])])], 8),
    # 3 GPUs never share a root.
    ("3 gpu + 1 nic on one root", GPU_NIC, [claim_template(
        "t", [exactly("gpu", "gpu.nvidia.com", 3), exactly("nic", "nic", 1)],
        match=[(PCIE, ["gpu", "nic"])])], 0),
    # Without the constraint, GPUs are the limit: 8 / 3.
    ("3 gpu + 1 nic anywhere", GPU_NIC, [claim_template(
        "t", [exactly("gpu", "gpu.nvidia.com", 3), exactly("nic", "nic", 1)])], 2),
    # Two claims per pod, each pairing on its own root: 8 GPUs / 2 per pod.
    ("two claims per pod", GPU_NIC, [
        claim_template("a", [exactly("gpu", "gpu.nvidia.com", 1), exactly("nic", "nic", 1)],
                       match=[(PCIE, ["gpu", "nic"])]),
        claim_template("b", [exactly("gpu", "gpu.nvidia.com", 1), exactly("nic", "nic", 1)],
                       match=[(PCIE, ["gpu", "nic"])]),
    ], 4),
    # 4 GPUs on 4 distinct roots: one GPU per root per pod, 2 GPUs per root.
    ("distinct roots x4", GPU_NIC, [claim_template(
        "t", [exactly("gpu", "gpu.nvidia.com", 4)], distinct=[(PCIE, ["gpu"])])], 2),
    ("distinct roots x5", GPU_NIC, [claim_template(
        "t", [exactly("gpu", "gpu.nvidia.com", 5)], distinct=[(PCIE, ["gpu"])])], 0),
    # allocationMode All takes every matching device.
    ("all gpus", GPU_NIC, [claim_template("t", [exactly("gpu", "gpu.nvidia.com", mode="All")])],
     1),
    ("all nics of one root", GPU_NIC, [claim_template("t", [exactly(
        "nic", "nic", mode="All",
        selectors=[f'device.attributes["{PCIE.split("/")[0]}"].pcieRoot == "pci0000:10"'])])],
     1),
    ("all of a class with no device", GPU_NIC,
     [claim_template("t", [exactly("mig", "mig.nvidia.com", mode="All")])], 0),
    # firstAvailable on 6 GPUs: 4, then 1, then 1 (the first choice no longer fits).
    ("first available 4 then 1", nvidia_gpu_node(gpus=6, nics=0, roots=2), [claim_template(
        "t", [first_available("gpu", ("four", "gpu.nvidia.com", 4),
                              ("one", "gpu.nvidia.com", 1))])], 3),
    # CEL on attributes, versions and quantities.
    ("selector on product", GPU_NIC, [claim_template("t", [exactly(
        "gpu", "gpu.nvidia.com", 1,
        selectors=['device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100")'])
    ])], 8),
    ("selector on memory", GPU_NIC, [claim_template("t", [exactly(
        "gpu", "gpu.nvidia.com", 1,
        selectors=['device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("96Gi")) >= 0'])
    ])], 0),
    ("selector on driver version", GPU_NIC, [claim_template("t", [exactly(
        "gpu", "gpu.nvidia.com", 1,
        selectors=['device.attributes["gpu.nvidia.com"].driverVersion'
                   '.isGreaterThan(semver("535.0.0"))'])])], 8),
    ("capacity request above the device", GPU_NIC, [claim_template("t", [exactly(
        "gpu", "gpu.nvidia.com", 1, capacity={"memory": "100Gi"})])], 0),
    # MIG partitions consume memory slices of their GPU (counters).
    ("mig 3g.40gb", nvidia_mig_node(1), [claim_template("t", [exactly(
        "mig", "mig.nvidia.com", 1,
        selectors=['device.attributes["gpu.nvidia.com"].profile == "3g.40gb"'])])], 2),
    ("mig 1g.10gb", nvidia_mig_node(1), [claim_template("t", [exactly(
        "mig", "mig.nvidia.com", 1,
        selectors=['device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'])])], 8),
    ("mig any profile then nothing", nvidia_mig_node(1), [claim_template("t", [exactly(
        "mig", "mig.nvidia.com", 1,
        selectors=['device.attributes["gpu.nvidia.com"].profile == "7g.80gb"'])])], 1),
    ("full gpu of a partitionable gpu", nvidia_mig_node(2),
     [claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1)])], 2),
    # Consumable capacity: shares of one GPU's memory.
    ("shares of 20Gi", shared_gpu(), [claim_template("t", [exactly(
        "gpu", "gpu.nvidia.com", 1, capacity={"memory": "20Gi"})])], 4),
    ("shares rounded up by step", shared_gpu(policy={
        "default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}),
     [claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1, capacity={"memory": "15Gi"})])],
     4),
    ("shares take the policy default", shared_gpu(policy={
        "default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}),
     [claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1)])], 8),
    ("shares from valid values", shared_gpu(policy={"validValues": ["20Gi", "40Gi"]}),
     [claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1, capacity={"memory": "30Gi"})])],
     2),
    ("share above the range max", shared_gpu(policy={
        "validRange": {"min": "10Gi", "max": "40Gi"}}),
     [claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1, capacity={"memory": "50Gi"})])],
     0),
    ("no request takes the whole shared device", shared_gpu(),
     [claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1)])], 1),
]


@pytest.mark.parametrize(("slices", "templates", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pods_per_node(slices: list[Doc], templates: list[Doc], expected: int) -> None:
    assert pods_per_node(slices, templates) == expected


def test_cpu_still_limits_pods_with_devices() -> None:
    # 8 GPU+NIC pairs, but 190 cpu / 60 = 3 pods.
    template = claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1),
                                    exactly("nic", "nic", 1)], match=[(PCIE, ["gpu", "nic"])])
    assert pods_per_node(GPU_NIC, [template], cpu="60") == 3


def test_allocations_pair_gpu_and_nic_on_the_same_root() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), gpu_nic_root]
    got = run(cluster, gang_docs("g", [("w", 4, ["gpu-nic"])]))
    assert isinstance(got, Plan)
    (a,) = got.assignments
    assert a.node == "n1" and a.pods == 4 and len(a.devices) == 4
    roots = {f"gpu-{i}": f"r{i // 2}" for i in range(8)} | {f"nic-{i}": f"r{i // 2}"
                                                             for i in range(8)}
    seen: set[str] = set()
    for pod in a.devices:
        (claim,) = pod
        assert claim.claim == "c0"
        assert sorted(r.request for r in claim.results) == ["gpu", "gpu", "nic"]
        assert len({roots[r.device] for r in claim.results}) == 1
        assert all(r.pool == "n1" for r in claim.results)
        names = {r.device for r in claim.results}
        assert not names & seen
        seen |= names


def test_first_available_reports_the_subrequest_chosen() -> None:
    cluster = [*CLASSES, *dra_node("n1", nvidia_gpu_node(gpus=6, nics=0, roots=2)),
               claim_template("t", [first_available("gpu", ("four", "gpu.nvidia.com", 4),
                                                    ("one", "gpu.nvidia.com", 1))])]
    got = run(cluster, gang_docs("g", [("w", 3, ["t"])]))
    assert isinstance(got, Plan)
    requests = sorted(r.request for pod in got.assignments[0].devices for c in pod
                      for r in c.results)
    assert requests == ["gpu/four"] * 4 + ["gpu/one"] * 2


def test_consumed_capacity_is_reported_for_shared_devices() -> None:
    cluster = [*CLASSES, *dra_node("n1", shared_gpu(policy={
        "validRange": {"min": "10Gi", "step": "10Gi"}})),
        claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1, capacity={"memory": "15Gi"})])]
    got = run(cluster, gang_docs("g", [("w", 2, ["t"])]))
    assert isinstance(got, Plan)
    consumed = [r.consumed_capacity for pod in got.assignments[0].devices for c in pod
                for r in c.results]
    assert consumed == [{f"{NVIDIA_DRIVER}/memory": 20 * 2**30}] * 2


def test_pods_spread_over_nodes_when_one_node_is_full() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), *dra_node("n2", GPU_NIC), gpu_nic_root]
    got = run(cluster, gang_docs("g", [("w", 6, ["gpu-nic"])]))
    assert isinstance(got, Plan)
    assert sorted(a.pods for a in got.assignments) == [2, 4]
    assert all(r.pool == a.node for a in got.assignments for pod in a.devices for c in pod
               for r in c.results)


def test_two_pod_sets_compete_for_the_same_devices() -> None:
    one = claim_template("one", [exactly("gpu", "gpu.nvidia.com", 1)])
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), gpu_nic_root, one]
    # 3 pods x (2 GPUs + NIC) leave 2 GPUs on root 3 for the second pod set.
    fits = run(cluster, gang_docs("g", [("a", 3, ["gpu-nic"]), ("b", 2, ["one"])]))
    assert isinstance(fits, Plan)
    used = [r.device for a in fits.assignments for pod in a.devices for c in pod
            for r in c.results if r.driver == NVIDIA_DRIVER]
    assert len(used) == len(set(used)) == 8
    too_many = run(cluster, gang_docs("g", [("a", 3, ["gpu-nic"]), ("b", 3, ["one"])]))
    assert isinstance(too_many, NoFit)


def test_device_taints_need_a_toleration() -> None:
    tainted = [{"driver": NVIDIA_DRIVER, "devices": [
        {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}},
         "taints": [{"key": "maintenance", "effect": "NoSchedule"}] if i == 0 else []}
        for i in range(2)]}]
    plain = claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1)])
    assert pods_per_node(tainted, [plain]) == 1
    tolerant = claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1)])
    tolerant["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": "maintenance", "operator": "Exists"}]
    assert pods_per_node(tainted, [tolerant]) == 2


def test_nofit_names_the_request_and_the_constraint() -> None:
    three = claim_template("train-gpus", [exactly("gpu", "gpu.nvidia.com", 3),
                                          exactly("nic", "nic", 1)],
                           match=[(PCIE, ["gpu", "nic"])])
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), three]
    got = run(cluster, gang_docs("g", [("w", 1, ["train-gpus"])]))
    assert isinstance(got, NoFit)
    text = " ".join(r.message for r in got.reasons)
    assert ("request gpu of claim template train-gpus: no node offers 3 devices of class "
            "gpu.nvidia.com with matching attribute resource.kubernetes.io/pcieRoot together "
            "with 1 nic") in text
    assert got.permanent  # even an empty cluster cannot hold it


def test_nofit_when_too_few_devices_match() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC),
               claim_template("t", [exactly("gpu", "gpu.nvidia.com", 9)])]
    got = run(cluster, gang_docs("g", [("w", 1, ["t"])]))
    assert isinstance(got, NoFit)
    assert "no node offers 9 devices of class gpu.nvidia.com (8 devices match its class and " \
           "selectors, 9 needed)" in got.reasons[-1].message


def test_nofit_when_devices_are_in_use() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), gpu_nic_root]
    got = run(cluster, gang_docs("g", [("w", 5, ["gpu-nic"])]))
    assert isinstance(got, NoFit)
    reason = got.reasons[-1]
    assert reason.code is ReasonCode.INSUFFICIENT_CAPACITY
    assert reason.needed == 5 and reason.best == 4
    # The need is stated once, in the NeverFits reason before (one node holds 4 at most).
    assert "claim template gpu-nic (2 devices of class gpu.nvidia.com + 1 device of class " \
           "nic, matching resource.kubernetes.io/pcieRoot)" in got.reasons[0].message
    assert reason.message == "now existing nodes have room for 4 (check mode: existing nodes only)"


def test_nodes_without_devices_are_explained() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC), node("cpu-only"),
               claim_template("t", [exactly("mig", "mig.nvidia.com", 1)])]
    got = run(cluster, gang_docs("g", [("w", 1, ["t"])]))
    assert isinstance(got, NoFit)
    message = got.reasons[-1].message
    assert "2 without the devices its claims need" in message
    assert "request mig of claim template t" in message


@pytest.mark.parametrize(
    ("extra", "template", "needle"),
    [
        ([{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
           "metadata": {"name": "broken"},
           "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]}}],
         claim_template("t", [exactly("gpu", "broken", 1)]),
         "DeviceClass broken: CEL selector 'device.driver ==': does not compile"),
        ([], claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1, selectors=[
            'device.attributes["gpu.nvidia.com"].missingAttribute == 1'])]),
         "ResourceClaimTemplate team-a/t request gpu: CEL selector "
         "'device.attributes[\"gpu.nvidia.com\"].missingAttribute == 1': evaluation failed"),
        ([], claim_template("t", [exactly("gpu", "gpu.nvidia.com", 1, selectors=[
            'device.driver'])]),
         "must evaluate to a bool"),
        ([], claim_template("t", [exactly("gpu", "no-such-class", 1)]),
         "DeviceClass no-such-class not found"),
    ],
    ids=["class does not compile", "runtime error", "not a bool", "unknown class"],
)
def test_invalid_claims_are_invalid_reasons_naming_the_object(
    extra: list[Doc], template: Doc, needle: str
) -> None:
    cluster = [*CLASSES, *extra, *dra_node("n1", GPU_NIC), template]
    got = run(cluster, gang_docs("g", [("w", 1, ["t"])]))
    assert isinstance(got, NoFit)
    assert [r.code for r in got.reasons] == [ReasonCode.INVALID]
    assert needle in got.reasons[0].message
    assert got.permanent


def test_missing_claim_template_is_invalid() -> None:
    cluster = [*CLASSES, *dra_node("n1", GPU_NIC)]
    got = run(cluster, gang_docs("g", [("w", 1, ["nowhere"])]))
    assert isinstance(got, NoFit)
    assert got.reasons[0].code is ReasonCode.INVALID
    assert "ResourceClaimTemplate team-a/nowhere not found" in got.reasons[0].message


def test_nic_driver_attribute_names_are_qualified_by_driver() -> None:
    fast = claim_template("t", [exactly("nic", "nic", 1, selectors=[
        f'device.attributes["{NIC_DRIVER}"].speedGbps >= 400'])])
    assert pods_per_node(GPU_NIC, [fast]) == 8


def test_the_search_budget_bounds_pathological_claims() -> None:
    from controller.fit.devices import ClaimFitter
    from tests.dra_world import build

    # 16 GPUs, 8 of them pairwise distinct on an attribute no two share... except that
    # only 4 roots exist: asking for 8 devices with distinct roots explores many subsets.
    slices = nvidia_gpu_node(gpus=16, nics=0, roots=4)
    cluster = [*CLASSES, *dra_node("n1", slices),
               claim_template("t", [exactly("gpu", "gpu.nvidia.com", 5)],
                              distinct=[(PCIE, ["gpu"])])]
    gang, snap = build(cluster, gang_docs("g", [("w", 1, ["t"])]))
    fitter = ClaimFitter(gang.pod_sets[0].shape.claims, budget=50)
    run_ = fitter.run(snap.nodes[0].devices, 1)
    assert not run_.pods
    assert run_.failure is not None and "gave up after 50 steps" in run_.failure
    # With the default budget the same search completes and says why it failed.
    full = ClaimFitter(gang.pod_sets[0].shape.claims).run(snap.nodes[0].devices, 1)
    assert full.failure is not None and "distinct attribute" in full.failure


@pytest.mark.parametrize(("scope", "fits"), [("gpu/big", True), ("gpu", False)])
def test_constraint_on_one_subrequest_leaves_the_others_free(scope: str, fits: bool) -> None:
    # GPUs on one PCIe root, NICs on another: a constrained pairing never fits.
    split = [
        {"driver": NVIDIA_DRIVER, "devices": [
            {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"},
                                               PCIE: {"string": "pci0000:10"}}}
            for i in range(2)]},
        {"driver": NIC_DRIVER, "devices": [
            {"name": "nic-0", "attributes": {PCIE: {"string": "pci0000:20"}}}]},
    ]
    template = claim_template(
        "t", [first_available("gpu", ("big", "gpu.nvidia.com", 2), ("small", "gpu.nvidia.com", 1)),
              exactly("nic", "nic", 1)],
        match=[(PCIE, [scope, "nic"])])
    got = run([*CLASSES, *dra_node("n1", split), template], gang_docs("g", [("w", 1, ["t"])]))
    assert isinstance(got, Plan) is fits
    if isinstance(got, Plan):
        results = got.assignments[0].devices[0][0].results
        assert sorted(r.request for r in results) == ["gpu/small", "nic"]


def test_a_claim_holds_at_most_32_devices() -> None:
    from controller.fit.devices import ClaimFitter
    from tests.dra_world import build

    many = nvidia_gpu_node(gpus=40, nics=0, roots=4)
    cluster = [*CLASSES, *dra_node("n1", many),
               claim_template("all", [exactly("gpu", "gpu.nvidia.com", mode="All")]),
               claim_template("32", [exactly("gpu", "gpu.nvidia.com", 32)]),
               claim_template("33", [exactly("gpu", "gpu.nvidia.com", 33)])]
    assert pods_per_node(many, [cluster[-2]]) == 1
    assert pods_per_node(many, [cluster[-1]]) == 0
    gang, snap = build(cluster, gang_docs("g", [("w", 1, ["all"])]))
    got = ClaimFitter(gang.pod_sets[0].shape.claims).run(snap.nodes[0].devices, 1)
    assert got.failure == ("request gpu of claim template all: allocationMode All matches 40 "
                           "devices, more than the 32 one claim can hold")
    gang, snap = build(cluster, gang_docs("g", [("w", 1, ["33"])]))
    got = ClaimFitter(gang.pod_sets[0].shape.claims).run(snap.nodes[0].devices, 1)
    assert got.failure == ("request gpu of claim template 33: asks for 33 devices, more than "
                           "the 32 one claim can hold")
