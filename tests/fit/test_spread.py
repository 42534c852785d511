"""DoNotSchedule topology spread among a pod set's own pods (controller.fit.spread)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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
from controller.snapshot import request_from_documents, snapshot_from_documents
from controller.topology_defaults import DEFAULT_LEVELS
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


def test_spread_around_running_pods_is_refused() -> None:
    tsc = {"maxSkew": 1, "topologyKey": RACK, "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"app": "w"}}}
    running = [{"kind": "Node", "metadata": {"name": "a", "labels": {RACK: "r"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
               {"kind": "Pod", "metadata": {"name": "x", "namespace": "ns",
                                            "labels": {"app": "w"}},
                "spec": {"nodeName": "a", "containers": [{"name": "c"}]}}]
    _, gang = request_from_documents(docs(tsc, {"app": "w"}), DEFAULT_LEVELS, running)
    assert "spreading around running pods" in gang.pod_sets[0].shape.unsupported[0]


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
