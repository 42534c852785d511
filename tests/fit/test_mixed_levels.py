"""One level hierarchy over nodes of two clouds: each node is read for the levels it has.

The configured levels put GCE's block above EC2's network node layer (both under the
zone). A GCE node carries the zone and a block, never a network node layer; an EC2 node the
zone and its network node layers, never a block. A gang requiring the network node layer
is served by EC2 nodes sharing one (the kube-scheduler matches the node's labels, not the
levels above the one required); a node without the required level never serves it.
"""

from __future__ import annotations

import pytest

from controller.fit import Mode, NodeState, NoFit, Plan, PoolDomain, PoolState, ReasonCode, plan
from controller.fit.topology import Levels
from tests.builders import GPU, HOST, Cluster, Gang, node

ZONE = "topology.kubernetes.io/zone"
GCE_BLOCK = "cloud.google.com/gce-topology-block"
NN3 = "topology.k8s.aws/network-node-layer-3"
LEVELS = (ZONE, GCE_BLOCK, NN3, HOST)


def aws(name: str, zone: str, nn3: str, free: int = 8) -> NodeState:
    return node(name, labels={ZONE: zone, NN3: nn3}, free_gpus=free)


def gce(name: str, zone: str, block: str, free: int = 8) -> NodeState:
    return node(name, labels={ZONE: zone, GCE_BLOCK: block}, free_gpus=free)


def mixed() -> Cluster:
    return Cluster().add(
        aws("ip-1", "us-east-1a", "nn-a"), aws("ip-2", "us-east-1a", "nn-a"),
        aws("ip-3", "us-east-1a", "nn-b"),
        gce("gke-1", "us-central1-a", "blk-1"), gce("gke-2", "us-central1-a", "blk-1"),
        gce("gke-3", "us-central1-a", "blk-1"),
    )


def placed(result: Plan | NoFit) -> dict[str, int]:
    assert isinstance(result, Plan), result
    return {a.node: a.pods for a in result.assignments if a.node is not None}


def test_ec2_nodes_serve_a_gang_requiring_their_network_node_layer() -> None:
    result = plan(Gang().pod_set("w", 2, gpu=8, required=NN3).build(),
                  mixed().snapshot(LEVELS), Mode.CHECK)
    assert placed(result) == {"ip-1": 1, "ip-2": 1}
    assert isinstance(result, Plan)
    [where] = result.placements
    assert where.domain == "nn-a"
    # Published as a nodeSelector: only the labels the nodes carry, never the absent block.
    assert where.domain_labels == {ZONE: "us-east-1a", NN3: "nn-a"}


def test_gce_nodes_still_serve_a_gang_requiring_their_block() -> None:
    result = plan(Gang().pod_set("w", 3, gpu=8, required=GCE_BLOCK).build(),
                  mixed().snapshot(LEVELS), Mode.CHECK)
    assert placed(result) == {"gke-1": 1, "gke-2": 1, "gke-3": 1}


def test_a_node_without_the_required_level_never_serves_it() -> None:
    """Three free GCE nodes and one EC2 node per layer value: a 3-pod gang requiring the
    network node layer has no domain (the GCE nodes, without one, are not a domain)."""
    cluster = Cluster().add(
        aws("ip-1", "us-east-1a", "nn-a"), aws("ip-3", "us-east-1a", "nn-b"),
        gce("gke-1", "us-central1-a", "blk-1"), gce("gke-2", "us-central1-a", "blk-1"),
        gce("gke-3", "us-central1-a", "blk-1"),
    )
    result = plan(Gang().pod_set("w", 3, gpu=8, required=NN3).build(),
                  cluster.snapshot(LEVELS), Mode.CHECK)
    assert isinstance(result, NoFit), result
    assert {r.code for r in result.reasons} & {ReasonCode.TOPOLOGY, ReasonCode.NEVER_FITS}
    assert "~" not in " ".join(r.message for r in result.reasons)


def test_a_pool_domain_without_the_higher_level_is_bought_into() -> None:
    """An EC2 pool's declared domain names the zone and the network node layer (no GCE
    block): a gang requiring the layer is planned onto new nodes there."""
    pool = PoolState("p5", {}, (), {GPU: 8, "cpu": 64_000},
                     (PoolDomain({ZONE: "us-east-1a", NN3: "nn-c"}, 4),), 4, 1.0)
    result = plan(Gang().pod_set("w", 4, gpu=8, required=NN3).build(),
                  Cluster().pool(pool).snapshot(LEVELS), Mode.PROVISION)
    assert isinstance(result, Plan), result
    assert [(n.pool, n.count, n.domain) for n in result.new_nodes] == [
        ("p5", 4, {ZONE: "us-east-1a", NN3: "nn-c"})]


@pytest.mark.parametrize(("labels", "path"), [
    ({ZONE: "z", GCE_BLOCK: "b", NN3: "n"}, ("z", "b", "n")),
    ({ZONE: "z", GCE_BLOCK: "b"}, ("z", "b")),
    ({ZONE: "z"}, ("z",)),
    ({}, ()),
])
def test_a_node_with_every_level_or_a_top_run_of_them_reads_as_before(
    labels: dict[str, str], path: tuple[str, ...],
) -> None:
    assert Levels.of(LEVELS).path(labels) == path


def test_a_pool_without_declared_domains_plans_only_the_levels_its_cloud_reports() -> None:
    """An EC2 pool whose acquisitions each make a fresh domain at the network node layer:
    its placeholder domains carry no GCE block (its nodes never would), so the gang is
    planned there and nothing published names a level the nodes lack."""
    from controller.api.capacitypool import CapacityPool
    from controller.inputs.snapshot import pool_state

    aws_pool = CapacityPool.model_validate({"metadata": {"name": "p5"}, "spec": {
        "provider": "aws", "maxNodes": 8,
        "nodeTemplate": {"allocatable": {GPU: "8", "cpu": "64"}},
        "topology": {"level": NN3, "maxNodesPerDomain": 4},
    }})
    state = pool_state(aws_pool, [], LEVELS)
    assert state.domains and all(set(d.labels) == {ZONE, NN3} for d in state.domains)
    result = plan(Gang().pod_set("w", 4, gpu=8, required=NN3).build(),
                  mixed().pool(state).snapshot(LEVELS), Mode.PROVISION)
    assert isinstance(result, Plan), result
    [new] = result.new_nodes
    assert (new.pool, new.count, set(new.domain)) == ("p5", 4, {ZONE, NN3})
