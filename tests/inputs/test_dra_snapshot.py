"""From DRA API objects to the engine's device inventory and claims."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from controller.api.capacitypool import CapacityPool
from controller.api.dra import DeviceClaim, DeviceClass, ResourceClaimTemplate, ResourceSlice
from controller.fit.cel import SemVer
from controller.inputs.dra_snapshot import DraCatalog, claim_shape, node_devices
from controller.inputs.dra_templates import (
    NVIDIA_DRIVER,
    device_uuid,
    nvidia_gpu_node,
    nvidia_mig_node,
    render_resource_slices,
)
from controller.inputs.snapshot import SnapshotError, snapshot_from_documents
from tests.dra_world import CLASSES, PCIE, dra_node, node, pool_doc, published

Doc = dict[str, Any]


def slice_doc(name: str, node_name: str, devices: list[Doc], *, pool: str | None = None,
              generation: int = 1, count: int = 1, driver: str = NVIDIA_DRIVER) -> Doc:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node_name,
                 "pool": {"name": pool or node_name, "generation": generation,
                          "resourceSliceCount": count},
                 "devices": devices},
    }


def gpu(name: str, **attrs: Any) -> Doc:
    return {"name": name, "attributes": {k: v for k, v in attrs.items()}}


def inventory(docs: list[Doc]) -> dict[str, Any]:
    return node_devices([ResourceSlice.model_validate(d) for d in docs])


def test_render_resource_slices_like_the_nvidia_driver() -> None:
    pool = CapacityPool.model_validate(pool_doc("p", nvidia_gpu_node()))
    slices = render_resource_slices(pool, "node-7")
    assert [s["spec"]["driver"] for s in slices] == [NVIDIA_DRIVER, "nic.example.com"]
    gpus = slices[0]["spec"]
    assert gpus["nodeName"] == "node-7"
    assert gpus["pool"] == {"name": "node-7", "generation": 1, "resourceSliceCount": 1}
    first = gpus["devices"][0]
    assert first["name"] == "gpu-0"
    attrs = first["attributes"]
    assert attrs["uuid"] == {"string": device_uuid("node-7", "gpu-0")}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["driverVersion"] == {"version": "550.54.15"}
    assert attrs[PCIE] == {"string": "pci0000:10"}
    assert first["capacity"] == {"memory": {"value": "80Gi"}}
    assert {d["attributes"][PCIE]["string"] for d in gpus["devices"]} == {
        "pci0000:10", "pci0000:20", "pci0000:30", "pci0000:40"}
    # The same node always gets the same uuids; another node gets others.
    assert render_resource_slices(pool, "node-7") == slices
    assert render_resource_slices(pool, "node-8")[0]["spec"]["devices"][0]["attributes"][
        "uuid"] != attrs["uuid"]
    for s in slices:
        ResourceSlice.model_validate(s)


def test_partitionable_template_publishes_counters_and_devices_in_separate_slices() -> None:
    pool = CapacityPool.model_validate(pool_doc("p", nvidia_mig_node(gpus=1)))
    slices = render_resource_slices(pool, "n1")
    assert [("sharedCounters" in s["spec"], "devices" in s["spec"]) for s in slices] == [
        (True, False), (False, True)]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    devs = inventory(slices)["n1"]
    counters = devs.shape.inventory.counters
    assert counters[(NVIDIA_DRIVER, 0, "gpu-0-counter-set")]["memorySlice7"] == 1


def test_attribute_names_are_qualified_and_typed() -> None:
    devs = inventory([slice_doc("s", "n1", [gpu(
        "gpu-0", index={"int": 0}, ok={"bool": True}, productName={"string": "H100"},
        driverVersion={"version": "550.54.15"}, **{PCIE: {"string": "pci0000:10"}})])])
    attrs = devs["n1"].shape.inventory.devices[0].attributes
    assert attrs == {
        f"{NVIDIA_DRIVER}/index": 0, f"{NVIDIA_DRIVER}/ok": True,
        f"{NVIDIA_DRIVER}/productName": "H100",
        f"{NVIDIA_DRIVER}/driverVersion": SemVer(550, 54, 15), PCIE: "pci0000:10"}


def test_only_the_newest_generation_of_a_complete_pool_counts() -> None:
    old = slice_doc("old", "n1", [gpu("gpu-0"), gpu("gpu-1")], generation=1)
    new = slice_doc("new", "n1", [gpu("gpu-0")], generation=2)
    half = slice_doc("half", "n2", [gpu("gpu-0")], count=2)
    devs = inventory([old, new, half])
    assert [d.name for d in devs["n1"].shape.inventory.devices] == ["gpu-0"]
    assert "n2" not in devs  # one of two slices seen: the pool is incomplete


def test_identity_attributes_do_not_split_identical_nodes() -> None:
    docs = [d for n in ("a", "b", "c") for d in published(n, nvidia_gpu_node())]
    devs = inventory(docs)
    shapes = {id(d.shape) for d in devs.values()}
    assert len(shapes) == 1
    inv = devs["a"].shape.inventory
    assert inv.identity_names == frozenset({f"{NVIDIA_DRIVER}/uuid"})
    assert devs["b"].attributes(0)[f"{NVIDIA_DRIVER}/uuid"] == device_uuid("b", "gpu-0")
    assert devs["a"].pools == ("a",)


def test_snapshot_from_documents_attaches_devices_and_pool_templates() -> None:
    cluster = [*CLASSES, *dra_node("n1", nvidia_gpu_node()), node("plain")]
    snap = snapshot_from_documents(cluster, [pool_doc("p", nvidia_gpu_node(nics=0))])
    by_name = {n.name: n for n in snap.nodes}
    assert len(by_name["n1"].devices.shape.inventory.devices) == 16
    assert by_name["plain"].devices is None
    (pool,) = snap.pools
    assert [d.name for d in pool.devices.shape.inventory.devices] == [
        f"gpu-{i}" for i in range(8)]


def test_bad_device_quantity_is_a_snapshot_error_naming_the_slice() -> None:
    bad = slice_doc("broken", "n1", [{"name": "gpu-0", "capacity": {"memory": {
        "value": "lots"}}}])
    with pytest.raises(SnapshotError) as err:
        snapshot_from_documents([node("n1"), bad])
    assert "ResourceSlice broken" in str(err.value)


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"requests": [{"name": "gpu"}]}, "exactly one of exactly, firstAvailable"),
        ({"requests": [{"name": "gpu", "exactly": {"deviceClassName": "c"}}],
          "constraints": [{"matchAttribute": "pcieRoot"}]}, "must be fully qualified"),
        ({"requests": [{"name": "gpu", "exactly": {"deviceClassName": "c"}}],
          "constraints": [{"requests": ["nic"], "matchAttribute": "a.b/c"}]},
         "unknown requests: nic"),
        ({"requests": [{"name": "gpu", "exactly": {"deviceClassName": "c",
                                                   "allocationMode": "All", "count": 2}}]},
         "count must not be set with allocationMode All"),
    ],
)
def test_malformed_claims_are_rejected(doc: Doc, needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        DeviceClaim.model_validate(doc)
    assert needle in str(err.value)


def test_claim_template_requests_become_claim_shapes() -> None:
    catalog = DraCatalog.of(classes=[DeviceClass.model_validate(c) for c in CLASSES])
    template = ResourceClaimTemplate.model_validate({
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"spec": {"devices": {
            "requests": [
                {"name": "gpu", "firstAvailable": [
                    {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2},
                    {"name": "small", "deviceClassName": "mig.nvidia.com"}]},
                {"name": "nic", "exactly": {"deviceClassName": "nic",
                                            "capacity": {"requests": {"bw": "10G"}}}},
            ],
            "constraints": [{"requests": ["gpu/big", "nic"], "matchAttribute": PCIE}],
        }}},
    })
    shape = claim_shape("c", "ResourceClaimTemplate ns/t", template.spec.spec.devices, catalog)
    assert shape.error is None
    gpu_req, nic_req = shape.requests
    assert [a.name for a in gpu_req.alternatives] == ["gpu/big", "gpu/small"]
    assert [a.count for a in gpu_req.alternatives] == [2, 1]
    assert [s.origin for s in gpu_req.alternatives[0].selectors] == [
        "DeviceClass gpu.nvidia.com"]
    assert nic_req.alternatives[0].capacity == {"bw": 10**10}
    assert shape.constraints[0].requests == ("gpu/big", "nic")
