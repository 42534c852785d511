"""Registration: placeholders never published; the observed domain is."""

from __future__ import annotations

from controller.acquire.registration import fresh_domain, observed_domain, placeholder
from controller.api.node import Node
from controller.commands import objects
from controller.fit.types import Mode, Plan, PodSetPlacement
from controller.reconcilers.provisioning.confirm import TOPOLOGY_DOMAIN_DETAIL, class_details
from controller.state.bookings import Group

FRESH = "muster-new-gpu-0"


def _plan() -> Plan:
    labels = {objects.BLOCK: FRESH, objects.RACK: FRESH}
    return Plan(request="ns/r", mode=Mode.PROVISION, assignments=(), new_nodes=(),
                placements=(PodSetPlacement("workers", objects.RACK, FRESH, 1, labels),),
                cost_per_hour=0.0)


def test_a_placeholder_domain_is_published_as_its_nodes_registered_it() -> None:
    group = Group("k1", "gpu", {objects.BLOCK: FRESH, objects.RACK: FRESH}, 2)
    nodes = [Node.model_validate(objects.node(f"n{i}", allocatable={"cpu": "1"}, labels={
        objects.BLOCK: "pg-7", objects.RACK: "pg-7-a"})) for i in range(2)]
    seen = observed_domain(group, nodes)
    details = class_details(_plan(), seen)
    assert details[objects.RACK] == "pg-7-a" and details[objects.BLOCK] == "pg-7"
    assert details[TOPOLOGY_DOMAIN_DETAIL] == "pg-7-a"
    assert not any(placeholder(v) or FRESH in v for v in details.values())


def test_an_unobserved_placeholder_is_never_published() -> None:
    details = class_details(_plan(), {})
    assert not any(FRESH in v for v in details.values())
    assert TOPOLOGY_DOMAIN_DETAIL not in details and objects.RACK not in details


def test_nodes_that_disagree_publish_nothing_and_fresh_values_are_per_acquisition() -> None:
    group = Group("k1", "gpu", {objects.RACK: FRESH}, 2)
    nodes = [Node.model_validate(objects.node(f"n{i}", allocatable={"cpu": "1"}, labels={
        objects.RACK: f"r{i}"})) for i in range(2)]
    assert observed_domain(group, nodes) == {}
    other = Group("k2", "gpu", {objects.RACK: FRESH}, 2)
    assert fresh_domain(group) != fresh_domain(other)
    assert not placeholder(fresh_domain(group))


def test_a_node_the_cloud_has_not_initialised_is_left_for_the_cloud_first() -> None:
    """Until the cloud-controller-manager lifted its taint, the node's zone and topology
    labels may be missing: Muster neither checks nor fills in the domain yet."""
    from controller.acquire.registration import CLOUD_UNINITIALIZED, awaiting_cloud

    body = objects.node("i-0a", allocatable={"cpu": "1"})
    body.setdefault("spec", {})["taints"] = [
        {"key": CLOUD_UNINITIALIZED, "value": "true", "effect": "NoSchedule"},
        {"key": "muster.dev/unregistered", "effect": "NoExecute"},
    ]
    assert awaiting_cloud(Node.model_validate(body))
    body["spec"]["taints"] = body["spec"]["taints"][1:]
    assert not awaiting_cloud(Node.model_validate(body))


def test_a_node_is_not_what_was_planned_until_its_devices_show() -> None:
    from controller.acquire.registration import missing_devices
    from controller.api.capacitypool import CapacityPool

    pool = CapacityPool.model_validate(objects.gpu_pool("gpu"))
    starting = Node.model_validate(objects.node("i-0a", allocatable={"cpu": "96"}))
    assert missing_devices(starting, pool) == [objects.GPU]
    ready = Node.model_validate(objects.node("i-0a", allocatable={"cpu": "96", objects.GPU: "8"}))
    assert missing_devices(ready, pool) == []


def test_a_gce_node_never_gets_another_clouds_topology() -> None:
    """Both clouds' levels configured: the planner's placeholder domain of a GCP pool spans
    EC2's network node layers too. Muster fills in a level the node lacks only where the
    pool's own cloud could report it; the GCE node gets no EC2 layer, and keeps the
    sub-block Compute reported."""
    from controller.acquire.registration import registration
    from controller.api.capacitypool import CapacityPool

    aws_layer = "topology.k8s.aws/network-node-layer-1"
    subblock = "cloud.google.com/gce-topology-subblock"
    block = "example.com/block"
    body = objects.gpu_pool("gpu")
    body["spec"]["provider"] = "gcp"
    pool = CapacityPool.model_validate(body)
    group = Group("k1", "gpu", {block: FRESH, aws_layer: FRESH, subblock: FRESH}, 1)
    node = Node.model_validate(objects.node("vm-0", allocatable={"cpu": "1"},
                                            labels={subblock: "sb-7"}))
    patch = registration(node, pool, group, owner="ns/r", owner_uid="u")
    assert isinstance(patch, dict)
    labels = patch["metadata"]["labels"]
    assert aws_layer not in labels, labels
    assert subblock not in labels, "the observed sub-block stays as Compute reported it"
    assert labels[block] == fresh_domain(group), "a level no cloud owns is the acquisition's"
