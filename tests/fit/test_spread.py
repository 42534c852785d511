"""DoNotSchedule topology spread among a pod set's own pods (controller.fit.spread)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.fit import (
    GangRequest,
    Mode,
    NoFit,
    Plan,
    PodSetRequest,
    PodShape,
    PoolDomain,
    PoolState,
    Snapshot,
    Spread,
    plan,
)
from controller.fit.placement import PodSetPlacer
from controller.fit.topology import Levels
from controller.fit.types import TopologyMode, TopologyRequest
from controller.fit.workspace import Workspace
from controller.inputs.snapshot import request_from_documents, snapshot_from_documents
from tests.builders import BLOCK, HOST, LEVELS, RACK, node

ZONE = "zone"


def cluster(draw: Any) -> list[Any]:
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        labels = {ZONE: f"z{draw(st.integers(0, 2))}"} if draw(st.integers(0, 5)) else {}
        nodes.append(node(f"n{i}", block="b0", rack=f"r{i % 2}", labels=labels,
                          cpu=4_000, free_cpu=draw(st.sampled_from([0, 1_000, 2_000, 4_000])),
                          schedulable=draw(st.integers(0, 6)) > 0))
    return nodes


def brute(nodes: list[Any], key: str, count: int, skew: int, min_domains: int) -> bool:
    """Is there any count per domain, within each domain's room, spread within maxSkew?"""
    eligible = sorted({n.labels[key] for n in nodes if key in n.labels})
    if not eligible:
        return False
    room = {v: sum(n.free["cpu"] // 1_000 for n in nodes
                   if n.schedulable and n.labels.get(key) == v) for v in eligible}
    for counts in itertools.product(*(range(room[v] + 1) for v in eligible)):
        if sum(counts) != count:
            continue
        low = 0 if len(eligible) < min_domains else min(counts)
        if max(counts) - low <= skew:
            return True
    return False


def domain_counts(result: Plan, snap: Snapshot, key: str) -> dict[str, int]:
    labels = {n.name: n.labels for n in snap.nodes}
    counts = {n.labels[key]: 0 for n in snap.nodes if key in n.labels}
    for a in result.assignments:
        value = labels[a.node][key] if a.node else (a.new_node.domain.get(key) if a.new_node
                                                    else None)
        if key == HOST and a.node is None:
            value = f"new-{a.new_node}"
        assert value is not None
        counts[value] = counts.get(value, 0) + a.pods
    return counts


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from([ZONE, HOST, RACK]), st.integers(1, 7), st.integers(1, 2),
       st.integers(1, 4))
def test_check_mode_fits_exactly_when_a_spread_count_exists(
    data: Any, key: str, count: int, skew: int, min_domains: int
) -> None:
    nodes = cluster(data.draw)
    snap = Snapshot(tuple(nodes), (), LEVELS)
    shape = PodShape({"cpu": 1_000}, spread=Spread(key, skew, min_domains))
    got = plan(GangRequest("ns/g", (PodSetRequest("w", count, shape),)), snap, Mode.CHECK)
    assert isinstance(got, Plan) == brute(nodes, key, count, skew, min_domains)
    if isinstance(got, Plan):
        counts = domain_counts(got, snap, key)
        low = 0 if len(counts) < min_domains else min(counts.values())
        assert max(counts.values()) - low <= skew
        assert sum(counts.values()) == count


@settings(max_examples=100, deadline=None)
@given(st.data(), st.sampled_from([HOST, RACK]), st.integers(1, 12), st.integers(1, 2))
def test_new_nodes_keep_the_spread(data: Any, key: str, count: int, skew: int) -> None:
    nodes = cluster(data.draw)
    domains = tuple(PoolDomain({BLOCK: "b0", RACK: f"r{r}"}, 3) for r in range(3))
    pool = PoolState("p", {}, (), {"cpu": 4_000}, domains, 9, 1.0)
    snap = Snapshot(tuple(nodes), (pool,), LEVELS)
    shape = PodShape({"cpu": 1_000}, spread=Spread(key, skew))
    got = plan(GangRequest("ns/g", (PodSetRequest("w", count, shape),)), snap, Mode.PROVISION)
    if isinstance(got, Plan):
        counts = domain_counts(got, snap, key)
        assert max(counts.values()) - min(counts.values()) <= skew
        assert sum(counts.values()) == count


def test_a_full_eligible_node_caps_every_node_at_max_skew() -> None:
    nodes = (node("a", cpu=8_000, free_cpu=0), node("b", cpu=8_000), node("c", cpu=8_000))
    snap = Snapshot(nodes, (), LEVELS)

    def gang(n: int) -> GangRequest:
        return GangRequest("ns/g", (PodSetRequest(
            "w", n, PodShape({"cpu": 1_000}, spread=Spread(HOST, 1))),))

    assert isinstance(plan(gang(2), snap, Mode.CHECK), Plan)
    got = plan(gang(3), snap, Mode.CHECK)
    assert isinstance(got, NoFit)
    assert "spread over hostname (maxSkew 1)" in got.reasons[-1].message


def docs(spread: dict[str, Any], labels: dict[str, str], **extra: Any) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
         "metadata": {"name": "g", "namespace": "ns"},
         "spec": {"provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
                  "podSets": [{"podTemplateRef": {"name": "w"}, "count": 2}]}},
        {"kind": "PodTemplate", "metadata": {"name": "w", "namespace": "ns"},
         "template": {"metadata": {"labels": labels, **extra},
                      "spec": {"containers": [{"name": "c"}],
                               "topologySpreadConstraints": [spread]}}},
    ]


def test_the_boundary_builds_a_spread_or_a_key_requirement() -> None:
    tsc = {"maxSkew": 2, "topologyKey": RACK, "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"app": "w"}}, "minDomains": 3,
           "nodeTaintsPolicy": "Honor"}
    _, gang = request_from_documents(docs(tsc, {"app": "w"}), DEFAULT_LEVELS, [])
    assert gang.pod_sets[0].shape.spread == Spread(RACK, 2, 3, True, True, ())
    _, gang = request_from_documents(docs(tsc, {"app": "other"}), DEFAULT_LEVELS, [])
    shape = gang.pod_sets[0].shape
    assert shape.spread is None
    assert [(r.key, r.operator) for r in shape.affinity_terms[0].match_expressions] == [
        (RACK, "Exists")]


def test_spread_counts_running_pods() -> None:
    """Running pods of the namespace the selector matches count in their domain: with one in
    rack r1, two more pods (maxSkew 1) go one to r2 and then either rack, never both to r1."""
    tsc = {"maxSkew": 1, "topologyKey": RACK, "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"app": "w"}}}
    cluster: list[dict[str, Any]] = [
        {"kind": "Node", "metadata": {"name": n, "labels": {RACK: r, BLOCK: "b", HOST: n}},
         "status": {"allocatable": {"cpu": "8", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}]}}
        for n, r in (("a", "r1"), ("b", "r2"))]
    cluster.append({"kind": "Pod", "metadata": {"name": "x", "namespace": "ns",
                                                "labels": {"app": "w"}},
                    "status": {"phase": "Running"},
                    "spec": {"nodeName": "a", "containers": [{"name": "c"}]}})
    snap = snapshot_from_documents(cluster, levels=DEFAULT_LEVELS)
    request = docs(tsc, {"app": "w"})
    _, gang = request_from_documents(request, DEFAULT_LEVELS, cluster)
    assert gang.pod_sets[0].shape.spread is not None
    assert gang.pod_sets[0].shape.spread.running == (("a", 1),)
    got = plan(gang, snap, Mode.CHECK)
    assert isinstance(got, Plan)
    on = {a.node: a.pods for a in got.assignments}
    assert on.get("b", 0) >= 1 and on.get("a", 0) <= 1
    # Pods in other namespaces are not counted.
    cluster[-1]["metadata"]["namespace"] = "other"
    _, gang = request_from_documents(request, DEFAULT_LEVELS, cluster)
    assert gang.pod_sets[0].shape.spread is not None
    assert gang.pod_sets[0].shape.spread.running == ()


def test_nodes_excluded_by_anti_affinity_still_count_as_domains() -> None:
    """nodeAffinityPolicy Honor reads the pod's node affinity only: a node the pods may not
    use because a running pod repels them (inter-pod anti-affinity) is still a domain with
    none of them, so it caps every other domain at maxSkew. Found by the scheduler oracle
    (case pc-2-0406): Muster had planned 2 + 3 pods on two nodes where the scheduler binds
    one per node."""
    tsc = {"maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"app": "w"}}}
    cluster: list[dict[str, Any]] = [
        {"kind": "Node", "metadata": {"name": n, "labels": {HOST: n}},
         "status": {"allocatable": {"cpu": "8", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}]}}
        for n in ("a", "b", "c")]
    cluster.append({"kind": "Pod", "metadata": {"name": "db", "namespace": "ns"},
                    "status": {"phase": "Running"},
                    "spec": {"nodeName": "c", "containers": [{"name": "c"}], "affinity": {
                        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                            {"labelSelector": {"matchLabels": {"app": "w"}},
                             "topologyKey": HOST}]}}}})
    snap = snapshot_from_documents(cluster, levels=DEFAULT_LEVELS)
    request = docs(tsc, {"app": "w"})
    for count, fits in ((2, True), (3, False)):
        request[0]["spec"]["podSets"][0]["count"] = count
        _, gang = request_from_documents(request, DEFAULT_LEVELS, cluster)
        assert isinstance(plan(gang, snap, Mode.CHECK), Plan if fits else NoFit), count


# ---------------------------------------------------------------------------- new capacity

ZONE_KEY = "topology.kubernetes.io/zone"


def zone_pool(zones: tuple[str, ...], *, per_zone: int = 9, taints: tuple[Any, ...] = (),
              name: str = "p", price: float = 1.0) -> PoolState:
    domains = tuple(PoolDomain({ZONE_KEY: z}, per_zone) for z in zones)
    return PoolState(name, {}, taints, {"cpu": 4_000, "pods": 110}, domains,
                     per_zone * len(zones), price)


def one(count: int, *spreads: Spread, **extra: Any) -> GangRequest:
    shape = PodShape({"cpu": 1_000}, spread=spreads[0], more_spreads=spreads[1:],
                     **extra)
    return GangRequest("ns/g", (PodSetRequest("w", count, shape),))


def per_value(got: Plan, snap: Snapshot, key: str) -> dict[str, int]:
    labels = {n.name: n.labels for n in snap.nodes}
    out: dict[str, int] = {}
    for a in got.assignments:
        if a.node is not None:
            value = labels[a.node][key]
        else:
            assert a.new_node is not None
            value = (f"new-{a.new_node.pool}-{a.new_node.index}-{sorted(a.new_node.domain.items())}"
                     if key == HOST else a.new_node.domain[key])
        out[value] = out.get(value, 0) + a.pods
    return out


def test_more_than_max_skew_per_zone_on_new_capacity() -> None:
    """9 pods, zone spread maxSkew 1, a pool in three zones: the scheduler places 3/3/3
    (Muster said NeverFits, planning at most maxSkew per zone on new nodes)."""
    snap = Snapshot((), (zone_pool(("z1", "z2", "z3")),), LEVELS)
    got = plan(one(9, Spread(ZONE_KEY, 1)), snap, Mode.PROVISION)
    assert isinstance(got, Plan), got
    assert per_value(got, snap, ZONE_KEY) == {"z1": 3, "z2": 3, "z3": 3}


def test_a_single_zone_pool_takes_every_pod() -> None:
    snap = Snapshot((), (zone_pool(("z1",)),), LEVELS)
    got = plan(one(9, Spread(ZONE_KEY, 1)), snap, Mode.PROVISION)
    assert isinstance(got, Plan), got
    assert per_value(got, snap, ZONE_KEY) == {"z1": 9}


def test_existing_zones_and_a_pool_in_a_third() -> None:
    """Existing nodes in z1 and z2 (room 2 each), a pool in z3: the spread needs the new
    zone as soon as the existing ones are full, and then fills it to within maxSkew."""
    nodes = tuple(node(f"n{z}", cpu=2_000, labels={ZONE_KEY: f"z{z}"}) for z in (1, 2))
    snap = Snapshot(nodes, (zone_pool(("z3",)),), LEVELS)
    for count, fits in ((4, True), (5, True), (7, True), (8, False)):
        got = plan(one(count, Spread(ZONE_KEY, 1)), snap, Mode.PROVISION)
        assert isinstance(got, Plan) is fits, (count, got)
        if isinstance(got, Plan):
            counts = per_value(got, snap, ZONE_KEY)
            assert max(counts.values()) - min(counts.values()) <= 1, counts
    # 8 pods: z1 and z2 hold 2 each for good, z3 would need 4.


def test_hostname_spread_over_existing_and_new_nodes() -> None:
    nodes = (node("a", cpu=4_000), node("b", cpu=4_000))
    pool = PoolState("p", {}, (), {"cpu": 4_000, "pods": 110}, (PoolDomain({}, 4),), 4, 1.0)
    snap = Snapshot(nodes, (pool,), LEVELS)
    got = plan(one(12, Spread(HOST, 1)), snap, Mode.PROVISION)
    assert isinstance(got, Plan), got
    counts = per_value(got, snap, HOST)
    assert sum(counts.values()) == 12 and max(counts.values()) - min(counts.values()) <= 1


def test_taints_policy_honor_ignores_domains_the_pods_do_not_tolerate() -> None:
    from controller.fit import Taint

    tainted = node("t", cpu=4_000, labels={ZONE_KEY: "z0"},
                   taints=(Taint("dedicated", "x", "NoSchedule"),))
    snap = Snapshot((tainted,), (zone_pool(("z1", "z2")),), LEVELS)
    honor = plan(one(6, Spread(ZONE_KEY, 1, honor_taints=True)), snap, Mode.PROVISION)
    assert isinstance(honor, Plan), honor
    assert per_value(honor, snap, ZONE_KEY) == {"z1": 3, "z2": 3}
    # By default the tainted zone is a domain with none of the pods: 1 per zone at most.
    ignore = plan(one(6, Spread(ZONE_KEY, 1)), snap, Mode.PROVISION)
    assert isinstance(ignore, NoFit)
    assert isinstance(plan(one(2, Spread(ZONE_KEY, 1)), snap, Mode.PROVISION), Plan)


def test_min_domains_caps_each_domain_while_fewer_exist() -> None:
    snap = Snapshot((), (zone_pool(("z1", "z2")),), LEVELS)
    assert isinstance(plan(one(4, Spread(ZONE_KEY, 1, 3)), snap, Mode.PROVISION), NoFit)
    assert isinstance(plan(one(2, Spread(ZONE_KEY, 1, 3)), snap, Mode.PROVISION), Plan)
    assert isinstance(plan(one(4, Spread(ZONE_KEY, 1)), snap, Mode.PROVISION), Plan)


def test_zone_and_hostname_on_one_pod_set() -> None:
    snap = Snapshot((), (zone_pool(("z1", "z2", "z3")),), LEVELS)
    got = plan(one(9, Spread(ZONE_KEY, 1), Spread(HOST, 1)), snap, Mode.PROVISION)
    assert isinstance(got, Plan), got
    assert per_value(got, snap, ZONE_KEY) == {"z1": 3, "z2": 3, "z3": 3}
    # Only new nodes are hostname domains: each holds within maxSkew of the others.
    per_node = [a.pods for a in got.assignments]
    assert max(per_node) - min(per_node) <= 1, per_node


def test_another_pod_sets_new_node_is_a_domain() -> None:
    """Pod set ``pinned`` needs a new node in z3; pod set ``w`` spreads over zones: the
    scheduler counts z3 (with none of w's pods), so w must take a share there too."""
    nodes = tuple(node(f"n{z}", cpu=8_000, labels={ZONE_KEY: f"z{z}"}) for z in (1, 2))
    snap = Snapshot(nodes, (zone_pool(("z3",)),), LEVELS)
    pinned = PodSetRequest("pinned", 1, PodShape({"cpu": 1_000},
                                                node_selector={ZONE_KEY: "z3"}))
    spread = PodSetRequest("w", 6, PodShape({"cpu": 1_000},
                                            spread=Spread(ZONE_KEY, 1)))
    for order in ((spread, pinned), (pinned, spread)):
        got = plan(GangRequest("ns/g", order), snap, Mode.PROVISION)
        assert isinstance(got, Plan), got
        w = [a for a in got.assignments if a.pod_set == "w"]
        counts: dict[str, int] = {}
        for a in w:
            value = a.domain.get(ZONE_KEY) or (a.new_node.domain[ZONE_KEY] if a.new_node
                                               else {n.name: n for n in nodes}[a.node or ""]
                                               .labels[ZONE_KEY])
            counts[value] = counts.get(value, 0) + a.pods
        assert sum(counts.values()) == 6 and max(counts.values()) - min(counts.values()) <= 1


def test_spread_counts_the_pods_of_another_pod_set() -> None:
    """Leader and workers share a label and a zone spread: together within maxSkew."""
    snap = Snapshot((), (zone_pool(("z1", "z2", "z3")),), LEVELS)
    leader = PodSetRequest("leader", 1, PodShape(
        {"cpu": 1_000}, spread=Spread(ZONE_KEY, 1, peers=("workers",))))
    workers = PodSetRequest("workers", 5, PodShape(
        {"cpu": 1_000}, spread=Spread(ZONE_KEY, 1, peers=("leader",))))
    got = plan(GangRequest("ns/g", (leader, workers)), snap, Mode.PROVISION)
    assert isinstance(got, Plan), got
    counts: dict[str, int] = {}
    for a in got.assignments:
        assert a.new_node is not None
        counts[a.new_node.domain[ZONE_KEY]] = counts.get(a.new_node.domain[ZONE_KEY], 0) + a.pods
    assert sum(counts.values()) == 6 and max(counts.values()) - min(counts.values()) <= 1


# ---------------------------------------------------------------------------- many pools


def catalogue_pools(count: int) -> tuple[PoolState, ...]:
    """``count`` pools of growing size (a cloud's instance types), each in three zones,
    priced by size plus a per-node overhead: bigger nodes are cheaper per pod."""
    zones = ("z1", "z2", "z3")
    return tuple(
        PoolState(f"it-{i}", {"it": str(i)}, (),
                  {"cpu": (i + 1) * 1_000 - 100, "memory": (i + 1) * 2**31, "pods": 10 * (i + 1)},
                  tuple(PoolDomain({ZONE_KEY: z}, 1_000) for z in zones), 3_000,
                  0.1 * (i + 1) + 0.2)
        for i in range(count)
    )


def held_over_plan(got: Plan, key: str) -> None:
    """Every pod set's spread over every domain the plan's nodes make (new nodes only)."""

    def domain(a: Any) -> object:
        new = a.new_node
        return (new.pool, new.index, tuple(sorted(new.domain.items()))) if key == HOST \
            else new.domain[key]

    domains = {domain(a) for a in got.assignments if a.new_node is not None}
    for name in {a.pod_set for a in got.assignments}:
        counts = dict.fromkeys(domains, 0)
        for a in got.assignments:
            if a.pod_set == name and a.new_node is not None:
                counts[domain(a)] += a.pods
        assert max(counts.values()) - min(counts.values()) <= 1, (name, counts)


def spread_gang(key: str, sizes: tuple[tuple[int, int, int], ...]) -> GangRequest:
    """One pod set per (pods, cpu m, memory MiB), each spread among its own pods."""
    return GangRequest("ns/mix", tuple(
        PodSetRequest(f"ps{i}", n, PodShape({"cpu": cpu, "memory": mem * 2**20, "pods": 1},
                                            spread=Spread(key, 1)))
        for i, (n, cpu, mem) in enumerate(sizes)))


def test_spread_pod_sets_of_one_gang_over_many_three_zone_pools() -> None:
    """Several zone-spread pod sets, pools in three zones: the cheapest plan of a pod set
    alone packs it into one zone, which another pod set's nodes in the other zones then
    break (Muster said NeverFits on every order); spreads that later nodes cannot break
    plan."""
    snap = Snapshot((), catalogue_pools(40), LEVELS)
    gang = spread_gang(ZONE_KEY, ((3, 1_500, 1_024), (1, 1_000, 100), (1, 1_500, 4_096),
                                  (1, 500, 1_024), (2, 500, 512)))
    got = plan(gang, snap, Mode.PROVISION)
    assert isinstance(got, Plan), got
    held_over_plan(got, ZONE_KEY)


def test_hostname_spread_pod_sets_of_one_gang() -> None:
    """The same with hostname spreads: every node another pod set adds is a domain with
    none of this pod set's pods, so each new node holds at most maxSkew of them."""
    snap = Snapshot((), catalogue_pools(40), LEVELS)
    gang = spread_gang(HOST, ((11, 1_500, 1_024), (9, 1_000, 100), (8, 500, 512)))
    got = plan(gang, snap, Mode.PROVISION)
    assert isinstance(got, Plan), got
    held_over_plan(got, HOST)


def test_a_large_hostname_spread_on_big_nodes() -> None:
    """1,000 pods, hostname spread, nodes of up to 399 pods: even counts exist (4 nodes of
    250) far below the per-node levels just under the largest node's (Muster tried only
    32 of those and said NeverFits)."""
    snap = Snapshot((), catalogue_pools(400), LEVELS)
    got = plan(one(1_000, Spread(HOST, 1)), snap, Mode.PROVISION)
    assert isinstance(got, Plan), got
    held_over_plan(got, HOST)


# ---------------------------------------------------------------------------- packed spreads


def two_sizes(zones: int = 3) -> tuple[PoolState, ...]:
    """A 1-pod node at 0.3 and an 8-pod node at 1.0, in ``zones`` zones."""
    def make(name: str, cpu: int, price: float) -> PoolState:
        domains = tuple(PoolDomain({ZONE_KEY: f"z{i}"}, 100) for i in range(zones))
        return PoolState(name, {"type": name}, (), {"cpu": cpu, "pods": 110}, domains, 100,
                         price)
    return make("small", 1_000, 0.3), make("big", 8_000, 1.0)


def scheduler_admits(got: Plan, gang: GangRequest, key: str) -> bool:
    """The reference scheduler (tests/fit/reference_scheduler.py) places every pod of the gang
    on the plan's new nodes, one pod after another, under its PodTopologySpread filter."""
    from tests.fit.reference_scheduler import gang_fits

    pools = {"small": 1_000, "big": 8_000}
    nodes = []
    seen: set[tuple[str, int, str]] = set()
    for a in got.assignments:
        assert a.new_node is not None
        ident = (a.new_node.pool, a.new_node.index, a.new_node.domain[ZONE_KEY])
        if ident in seen:
            continue
        seen.add(ident)
        name = "-".join(map(str, ident))
        nodes.append({
            "metadata": {"name": name, "labels": {HOST: name, ZONE_KEY: ident[2]}},
            "status": {"allocatable": {"cpu": f"{pools[ident[0]]}m", "pods": "110"}},
        })
    pods = [
        {"metadata": {"name": f"{ps.name}-{i}", "namespace": "ns", "labels": {"app": ps.name}},
         "spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}],
                  "topologySpreadConstraints": [{
                      "maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
                      "labelSelector": {"matchLabels": {"app": ps.name}}}]}}
        for ps in gang.pod_sets for i in range(ps.count)
    ]
    return gang_fits(nodes, [], pods) is True


def test_hostname_spread_pod_sets_share_nodes_of_many_pods() -> None:
    """Three pod sets, each spread over the hostname among its own pods (maxSkew 1), on new
    nodes only: every node of the plan is a domain of each, and the scheduler admits any
    number of a pod set's pods on a node while the counts differ by at most maxSkew. So two
    8-pod nodes holding 3/3, 2/2 and 2/2 (2.0 an hour) is a plan; Muster placed each pod set
    cautiously at one pod a node (14 small nodes, 4.2 an hour)."""
    gang = GangRequest("ns/g", tuple(
        PodSetRequest(n, c, PodShape({"cpu": 1_000, "pods": 1}, spread=Spread(HOST, 1)))
        for n, c in (("a", 6), ("b", 4), ("c", 4))))
    got = plan(gang, Snapshot((), two_sizes(), (ZONE_KEY, HOST)), Mode.PROVISION)
    assert isinstance(got, Plan), got
    assert got.cost_per_hour == 2.0
    assert sorted(a.pods for a in got.assignments) == [2, 2, 2, 2, 3, 3]
    held_over_plan(got, HOST)
    assert scheduler_admits(got, gang, HOST)


def test_zone_spread_pod_sets_on_one_node_of_one_zone() -> None:
    """Zone spreads among each pod set's own pods, an empty cluster: a zone is a domain only
    once a node is there, so one 8-pod node in one zone holds all seven pods (1.0 an hour)
    where opening every zone for each pod set bought seven 1-pod nodes (2.1)."""
    gang = GangRequest("ns/g", tuple(
        PodSetRequest(n, c, PodShape({"cpu": 1_000, "pods": 1}, spread=Spread(ZONE_KEY, 1)))
        for n, c in (("a", 3), ("b", 2), ("c", 2))))
    got = plan(gang, Snapshot((), two_sizes(), (ZONE_KEY, HOST)), Mode.PROVISION)
    assert isinstance(got, Plan), got
    assert [(n.pool, n.count) for n in got.new_nodes] == [("big", 1)]
    assert scheduler_admits(got, gang, ZONE_KEY)


# ---------------------------------------------------------------------------- catalogue size


def sized_refs(monkeypatch: Any, pools: int, gang: GangRequest) -> int:
    """(pool, domain)s sized (``PodSetPlacer.batch_of``) while planning ``gang`` against a
    fresh catalogue of ``pools`` three-zone pools (nothing kept from an earlier plan)."""
    sized = 0
    batch_of = PodSetPlacer.batch_of

    def counted(self: PodSetPlacer, ref: Any) -> Any:
        nonlocal sized
        sized += 1
        return batch_of(self, ref)

    monkeypatch.setattr(PodSetPlacer, "batch_of", counted)
    got = plan(gang, Snapshot((), catalogue_pools(pools), LEVELS), Mode.PROVISION)
    assert isinstance(got, Plan), got
    monkeypatch.undo()
    return sized


def test_a_small_spread_sizes_as_many_pools_whatever_the_catalogue(monkeypatch: Any) -> None:
    """A one-pod spread, zone or hostname, sizes the same few (pool, domain)s against 400
    pools as against 40 (it once sized every one of them to find the roomiest node, so its
    plan took ten times as long), and plans the same."""
    for spread in (Spread(HOST, 1), Spread(ZONE_KEY, 1)):
        gang = one(1, spread)
        assert sized_refs(monkeypatch, 400, gang) == sized_refs(monkeypatch, 40, gang) <= 12
        small = plan(gang, Snapshot((), catalogue_pools(40), LEVELS), Mode.PROVISION)
        large = plan(gang, Snapshot((), catalogue_pools(400), LEVELS), Mode.PROVISION)
        assert isinstance(small, Plan) and isinstance(large, Plan)
        assert large.new_nodes == small.new_nodes


def test_the_roomiest_new_node_skips_pools_the_plan_has_used_up() -> None:
    """How many pods a new node holds at most (the top per-node level of a hostname spread)
    is read from the roomiest pool that can still add a node: once the plan has taken the
    roomiest pool's last node, the next one's."""
    pools = tuple(
        PoolState(f"p{i}", {}, (), {"cpu": 1_000 * size, "pods": 110},
                  (PoolDomain({ZONE_KEY: "z1"}, 1),), 1, 1.0 * size)
        for i, size in enumerate((2, 8, 4))
    )
    shape = PodShape({"cpu": 1_000}, spread=Spread(HOST, 1))
    ps = PodSetRequest("w", 20, shape)
    ws = Workspace((), pools, Levels.of(LEVELS), [shape])
    placer = PodSetPlacer(ws, ps, Mode.PROVISION)
    assert placer.most_per_node(20) == 8 == max(b.per_node for b in placer.batches)
    assert placer.most_per_node(5) == 5
    roomiest = next(r for r in ws.index.refs if r.pool.name == "p1")
    ws.add_nodes(roomiest, [0], {})
    placer = PodSetPlacer(ws, ps, Mode.PROVISION)
    assert placer.most_per_node(20) == 4 == max(b.per_node for b in placer.batches)
    assert PodSetPlacer(ws, ps, Mode.CHECK).most_per_node(20) == 0


def test_a_required_zone_prices_one_zone_when_every_zone_offers_the_same(
    monkeypatch: Any,
) -> None:
    """A pod required in one zone, pools offering the same nodes in three zones: the first
    zone is priced and the others, whose cheapest node cannot beat it, are not; where a
    later zone's nodes are cheaper it is priced and chosen."""
    def required(count: int) -> GangRequest:
        return GangRequest("ns/g", (PodSetRequest(
            "w", count, PodShape({"cpu": 1_000, "pods": 1}),
            TopologyRequest(TopologyMode.REQUIRED, ZONE_KEY)),))

    priced: list[Any] = []
    scan = PodSetPlacer._scan

    def counted(self: PodSetPlacer, refs: Any, need: int, cap: int | None = None) -> Any:
        priced.append(refs[0].labels[ZONE_KEY])
        return scan(self, refs, need, cap)

    monkeypatch.setattr(PodSetPlacer, "_scan", counted)
    levels = (ZONE_KEY, HOST)
    got = plan(required(1), Snapshot((), catalogue_pools(40), levels), Mode.PROVISION)
    assert isinstance(got, Plan), got
    assert priced == ["z1"]
    assert {a.new_node.domain[ZONE_KEY] for a in got.assignments if a.new_node} == {"z1"}

    priced.clear()
    dear = zone_pool(("z1",), name="dear", price=2.0)
    cheap = zone_pool(("z2",), name="cheap", price=1.0)
    got = plan(required(1), Snapshot((), (dear, cheap), levels), Mode.PROVISION)
    assert isinstance(got, Plan), got
    assert priced == ["z1", "z2"]
    assert [(n.pool, n.count) for n in got.new_nodes] == [("cheap", 1)]


def test_a_pools_new_capacity_is_its_own_whatever_an_earlier_plan_took() -> None:
    """The new capacity every (pool, domain) offers a shape is kept with the pools for later
    plans; a plan that had already taken nodes of a pool when it first asked left that pool
    short for every later plan (a pool of 5 nodes seen with 2)."""
    zone_levels = Levels.of((ZONE_KEY, HOST))
    pools = (zone_pool(("z1",), per_zone=5, name="a"), zone_pool(("z1",), per_zone=5, name="b"))
    shape = PodShape({"cpu": 1_000})
    ps = PodSetRequest("w", 3, shape)

    first = Workspace((), pools, zone_levels, [shape])
    first.add_nodes(first.index.refs[0], [0, 0, 0], {})
    seen = PodSetPlacer(first, ps, Mode.PROVISION).batches
    assert [(b.ref.pool.name, b.nodes) for b in seen] == [("a", 2), ("b", 5)]

    later = Workspace((), pools, zone_levels, [shape])
    later.add_nodes(later.index.refs[1], [0], {})
    seen = PodSetPlacer(later, ps, Mode.PROVISION).batches
    assert [(b.ref.pool.name, b.nodes) for b in seen] == [("a", 5), ("b", 4)]
