"""New nodes bought for several pod sets of a gang together (controller.fit.packing), and the
catalogue walk that picks the cheapest new capacity without sizing every pool."""

from __future__ import annotations

from controller.fit import (
    GangRequest,
    Mode,
    Plan,
    PodSetRequest,
    PodShape,
    PoolDomain,
    PoolState,
    Snapshot,
    TopologyMode,
    TopologyRequest,
    plan,
)

ZONE = "topology.kubernetes.io/zone"


def pool(name: str, cpu: int, price: float, zones: int = 1, max_nodes: int = 100) -> PoolState:
    domains = tuple(PoolDomain({ZONE: f"z{i}"}, max_nodes) for i in range(zones))
    return PoolState(
        name,
        {"type": name},
        (),
        {"cpu": cpu, "pods": 110},
        domains,
        max_nodes,
        price_per_node_hour=price,
    )


def pod_set(name: str, count: int, cpu: int, **topo: object) -> PodSetRequest:
    shape = PodShape({"cpu": cpu, "pods": 1})
    return PodSetRequest(name, count, shape, TopologyRequest(**topo))  # type: ignore[arg-type]


def planned(request: GangRequest, *pools: PoolState) -> Plan:
    got = plan(request, Snapshot((), tuple(pools), (ZONE,)), Mode.PROVISION)
    assert isinstance(got, Plan), got
    return got


def new_nodes(p: Plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in p.new_nodes:
        out[n.pool] = out.get(n.pool, 0) + n.count
    return out


def test_free_pod_sets_share_one_larger_node_when_that_is_cheaper() -> None:
    # Alone each pod set buys a small node (1.0) and the second cannot use the first's
    # leftover 500m: 2.0. One large node holds both for 1.5.
    gang = GangRequest("ns/g", (pod_set("a", 1, 1500), pod_set("b", 1, 1500)))
    got = planned(gang, pool("small", 2000, 1.0), pool("large", 4000, 1.5))
    assert new_nodes(got) == {"large": 1}
    assert got.cost_per_hour == 1.5
    assert {a.pod_set: a.pods for a in got.assignments} == {"a": 1, "b": 1}
    assert len({a.new_node.index for a in got.assignments if a.new_node}) == 1


def test_packing_never_costs_more_than_pod_sets_alone() -> None:
    # The large node costs more than two small ones: each pod set keeps its own node.
    gang = GangRequest("ns/g", (pod_set("a", 1, 1500), pod_set("b", 1, 1500)))
    got = planned(gang, pool("small", 2000, 1.0), pool("large", 4000, 2.5))
    assert new_nodes(got) == {"small": 2}
    assert got.cost_per_hour == 2.0


def test_a_pod_set_with_a_required_domain_uses_the_packed_node_like_any_free_capacity() -> None:
    # Alone: three small nodes (3.0). Only "a" and "c" (free to go anywhere) are sized
    # together, into one large node; "b", required within one zone, is placed like before
    # and takes the large node's room first, so "c" buys a small one: 2.5, still less.
    gang = GangRequest(
        "ns/g",
        (
            pod_set("a", 1, 1500),
            pod_set("b", 1, 1500, mode=TopologyMode.REQUIRED, level=ZONE),
            pod_set("c", 1, 1500),
        ),
    )
    got = planned(gang, pool("small", 2000, 1.0), pool("large", 4000, 1.5))
    assert got.cost_per_hour == 2.5
    assert new_nodes(got) == {"large": 1, "small": 1}
    placement = {p.pod_set: p for p in got.placements}
    assert placement["b"].level == ZONE and placement["b"].domain == "z0"


def test_cheapest_pool_is_found_without_sizing_dearer_ones() -> None:
    # Many pools; the cheapest that holds the pod wins, whatever order the pools are listed.
    pools = [pool(f"p{i:03d}", 1000 * (i + 1), 0.5 * (i + 1), zones=3) for i in range(200)]
    gang = GangRequest("ns/g", (pod_set("a", 1, 2500),))
    got = planned(gang, *reversed(pools))
    assert new_nodes(got) == {"p002": 1}
    assert got.cost_per_hour == 1.5
    # Forty pods: the cheapest single purchase, as sizing every pool would find.
    gang = GangRequest("ns/g", (pod_set("a", 40, 2500),))
    got = planned(gang, *pools)
    assert got.cost_per_hour == min(
        -(-40 // (1000 * (i + 1) // 2500)) * 0.5 * (i + 1) for i in range(2, 200)
    )


def test_packing_keeps_a_one_per_node_pod_set_one_per_node() -> None:
    # Alone: "anti" (one pod per node) buys two small nodes, "b" a large one: 3.5. Packed:
    # two large nodes, each with one "anti" pod and one of "b": 3.0.
    anti = PodSetRequest("anti", 2, PodShape({"cpu": 1500, "pods": 1}, max_per_node=1))
    gang = GangRequest("ns/g", (anti, pod_set("b", 2, 1500)))
    got = planned(gang, pool("small", 2000, 1.0), pool("large", 4000, 1.5))
    assert got.cost_per_hour == 3.0
    assert new_nodes(got) == {"large": 2}
    per_node: dict[int, list[str]] = {}
    for a in got.assignments:
        assert a.new_node is not None
        per_node.setdefault(a.new_node.index, []).extend([a.pod_set] * a.pods)
    assert sorted(map(sorted, per_node.values())) == [["anti", "b"], ["anti", "b"]]
