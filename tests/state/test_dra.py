"""The controller's DRA cache and the device part of bookings."""

from __future__ import annotations

from typing import Any

import pytest

from controller.fit import Mode, Plan, plan
from controller.fit.dra_types import ClaimAllocation, DeviceResult
from controller.fit.types import Assignment, NewNodeSlot
from controller.inputs.dra_templates import nvidia_gpu_node
from controller.kube import ApiError
from controller.kube.resources import (
    DEVICE_CLASSES,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from controller.state.bookings import (
    Booking,
    Group,
    effective_plan,
    plan_from_json,
    plan_to_json,
)
from controller.state.cache import ClusterState
from controller.state.dra import DraState
from controller.state.feeds import Feeds
from tests.dra_world import CLASSES, PCIE, build, claim_template, dra_node, exactly, gang_docs

PAIR = claim_template("pair", [exactly("gpu", "gpu.nvidia.com", 1), exactly("nic", "nic", 1)],
                      match=[(PCIE, ["gpu", "nic"])])


def test_dra_state_follows_watch_events() -> None:
    state = DraState()
    slices = [d for d in dra_node("n1", nvidia_gpu_node()) if d["kind"] == "ResourceSlice"]
    state.replace("resourceslices", slices)
    state.replace("deviceclasses", CLASSES)
    state.upsert("resourceclaimtemplates", PAIR)
    catalog = state.catalog()
    assert len(catalog.slices) == 2 and set(catalog.classes) >= {"gpu.nvidia.com", "nic"}
    assert ("team-a", "pair") in catalog.templates
    assert state.catalog() is catalog  # cached until something changes
    state.delete("resourceclaimtemplates", "team-a/pair")
    assert ("team-a", "pair") not in state.catalog().templates
    # An object that does not validate is left out, not fatal.
    state.upsert("deviceclasses", {"kind": "DeviceClass", "metadata": {"name": "bad"},
                                   "spec": {"selectors": [{"cel": {}}]}})
    assert "bad" not in state.catalog().classes


def test_bookings_keep_device_allocations() -> None:
    cluster = [*CLASSES, *dra_node("n1", nvidia_gpu_node()), PAIR]
    gang, snap = build(cluster, gang_docs("g", [("w", 3, ["pair"])]))
    got = plan(gang, snap, Mode.CHECK)
    assert isinstance(got, Plan)
    again = plan_from_json(plan_to_json(got))
    assert again.assignments[0].devices == got.assignments[0].devices


def test_a_new_nodes_allocations_take_its_name_once_it_exists() -> None:
    pod = (ClaimAllocation("c0", (DeviceResult("gpu", "gpu.nvidia.com", "", "gpu-0"),)),)
    other = (ClaimAllocation("c0", (DeviceResult("gpu", "gpu.nvidia.com", "", "gpu-1"),)),)
    slot = NewNodeSlot("p", {}, 0)
    booked = Plan("ns/r", Mode.PROVISION, (Assignment("w", 2, new_node=slot,
                                                      devices=(pod, other)),), (), (), 0.0)
    group = Group(key="k", pool="p", domain={}, count=1, nodes=("node-a",))
    booking = Booking.from_annotation(
        Booking(plan=booked, attempt=1, groups=(group,)).to_annotation()
    )
    held = effective_plan(booking, existing={"node-a": True}, scheduled_on={"node-a": 1})
    (a,) = held.assignments
    assert a.node == "node-a" and a.pods == 1
    # One pod is bound (its claim holds gpu-0 now); the booking keeps the other's device.
    assert [r.device for pod in a.devices for c in pod for r in c.results] == ["gpu-1"]
    assert {r.pool for pod in a.devices for c in pod for r in c.results} == {"node-a"}


class _NoDra:
    """A KubeClient stand-in for an API server without resource.k8s.io/v1."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.watched: list[str] = []

    async def list(self, res: Any, **_: Any) -> dict[str, Any]:
        raise ApiError(self.status, "NotFound" if self.status == 404 else "Forbidden")

    async def watch(self, res: Any, *_: Any) -> None:
        self.watched.append(res.plural)


@pytest.mark.parametrize("status", [404, 403])
async def test_missing_dra_api_means_no_devices_not_a_stuck_start(status: int) -> None:
    state = ClusterState(levels=("kubernetes.io/hostname",))
    kube = _NoDra(status)
    feeds = Feeds(kube, state)  # type: ignore[arg-type]
    for res in (RESOURCE_SLICES, RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES, DEVICE_CLASSES):
        await feeds._watch_dra(res)
    assert kube.watched == []
    assert all(event.is_set() for event in state.dra.synced.values())
