"""The fit engine's rules, one table row each, with hand-computed expectations.

Each row: a cluster (builders), a gang, a mode, and either the placement (pods per node,
new nodes per pool/domain, chosen domain) or the NoFit reason code and message fragment.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest

from controller.fit import (
    GangRequest,
    Mode,
    NoFit,
    Plan,
    ReasonCode,
    Snapshot,
    Taint,
    Toleration,
    plan,
)
from controller.fit.explain import shortfall
from controller.fit.passes import PlanningPass
from tests.builders import BLOCK, GPU, RACK, Cluster, Gang, PoolB, node, shape

CHECK, PROVISION = Mode.CHECK, Mode.PROVISION


@dataclass
class Expect:
    nodes: dict[str, int] = field(default_factory=dict)
    """pods per existing node, all pod sets together"""
    new: dict[str, int] = field(default_factory=dict)
    """new nodes per "pool@rack" (or "pool@block" / "pool@-")"""
    domain: dict[str, str | None] = field(default_factory=dict)
    """pod set -> chosen domain value (None when spread)"""
    cost: float | None = None


def summarize(result: Plan) -> Expect:
    nodes: dict[str, int] = {}
    for a in result.assignments:
        if a.node is not None:
            nodes[a.node] = nodes.get(a.node, 0) + a.pods
    new: dict[str, int] = {}
    for n in result.new_nodes:
        where = n.domain.get(RACK) or n.domain.get(BLOCK) or "-"
        new[f"{n.pool}@{where}"] = new.get(f"{n.pool}@{where}", 0) + n.count
    domain = {p.pod_set: p.domain for p in result.placements}
    return Expect(nodes, new, domain, result.cost_per_hour)


def two_racks() -> Cluster:
    # r0: 3 free hosts, r1: 2 free hosts (one busy), both in block b0; r2 in b1 with 4.
    return (
        Cluster()
        .rack("b0", "r0", hosts=3)
        .rack("b0", "r1", hosts=3, free=[8, 8, 0])
        .rack("b1", "r2", hosts=4)
    )


TOLERATE_GPU = (Toleration("gpu", "Exists"),)

FITS = [
    pytest.param(
        two_racks(), Gang().pod_set("w", 2, gpu=8, required="rack"), CHECK,
        Expect({"r1-h0": 1, "r1-h1": 1}, domain={"w": "r1"}),
        id="required-rack-best-fit-tightest-rack",
    ),
    pytest.param(
        two_racks(), Gang().pod_set("w", 3, gpu=8, required="rack"), CHECK,
        Expect({"r0-h0": 1, "r0-h1": 1, "r0-h2": 1}, domain={"w": "r0"}),
        id="required-rack-skips-rack-too-small",
    ),
    pytest.param(
        two_racks(), Gang().pod_set("w", 5, gpu=8, required="block"), CHECK,
        Expect({"r0-h0": 1, "r0-h1": 1, "r0-h2": 1, "r1-h0": 1, "r1-h1": 1}, domain={"w": "b0"}),
        id="required-block-exact",
    ),
    pytest.param(
        two_racks(), Gang().pod_set("w", 4, gpu=8, preferred="rack"), CHECK,
        Expect({"r2-h0": 1, "r2-h1": 1, "r2-h2": 1, "r2-h3": 1}, domain={"w": "r2"}),
        id="preferred-rack-one-rack-when-possible",
    ),
    pytest.param(
        Cluster().rack("b0", "r0", hosts=3).rack("b0", "r1", hosts=2).rack("b1", "r2", hosts=1),
        Gang().pod_set("w", 4, gpu=8, preferred="rack"), CHECK,
        Expect({"r0-h0": 1, "r0-h1": 1, "r0-h2": 1, "r1-h0": 1}, domain={"w": "b0"}),
        id="preferred-rack-climbs-to-block-fewest-racks",
    ),
    pytest.param(
        Cluster().rack("b0", "r0", hosts=2).rack("b1", "r1", hosts=2).rack("b2", "r2", hosts=1),
        Gang().pod_set("w", 3, gpu=8, preferred="rack"), CHECK,
        Expect({"r0-h0": 1, "r0-h1": 1, "r2-h0": 1}, domain={"w": None}),
        id="preferred-spreads-fewest-blocks-last-one-tightest",
    ),
    pytest.param(
        Cluster().add(node("big", gpus=8), node("small1", gpus=2), node("small2", gpus=2)),
        Gang().pod_set("w", 3, gpu=2), CHECK,
        Expect({"big": 3}, domain={"w": None}),
        id="no-topology-fewest-nodes",
    ),
    pytest.param(
        Cluster().add(node("big", gpus=8), node("small", gpus=2)),
        Gang().pod_set("w", 1, gpu=2), CHECK,
        Expect({"small": 1}),
        id="no-topology-best-fit-node",
    ),
    pytest.param(
        Cluster().add(node("a", schedulable=False), node("b", free_gpus=8)),
        Gang().pod_set("w", 1, gpu=8), CHECK,
        Expect({"b": 1}),
        id="unschedulable-never-used",
    ),
    pytest.param(
        Cluster().add(node("t", taints=(Taint("gpu", "x", "NoSchedule"),)), node("u")),
        Gang().pod_set("w", 1, gpu=1), CHECK,
        Expect({"u": 1}),
        id="untolerated-taint-avoided",
    ),
    pytest.param(
        Cluster().add(node("t", taints=(Taint("gpu", "x", "PreferNoSchedule"),))),
        Gang().pod_set("w", 1, gpu=1), CHECK,
        Expect({"t": 1}),
        id="prefer-no-schedule-usable",
    ),
    pytest.param(
        Cluster().add(node("a", labels={"zone": "x"}), node("b", labels={"zone": "y"})),
        Gang().pod_set("w", 1, pod_shape=shape(gpu=8, selector={"zone": "y"})), CHECK,
        Expect({"b": 1}),
        id="node-selector",
    ),
    pytest.param(
        Cluster().rack("b0", "r0", hosts=2),
        Gang().pod_set("w", 2, gpu=8, required="rack"), PROVISION,
        Expect({"r0-h0": 1, "r0-h1": 1}, cost=0.0),
        id="provision-uses-existing-before-new",
    ),
    pytest.param(
        Cluster().rack("b0", "r0", hosts=2).pool(PoolB("p").domain("b0", "r0", 4).price(2)),
        Gang().pod_set("w", 4, gpu=8, required="rack"), PROVISION,
        Expect({"r0-h0": 1, "r0-h1": 1}, {"p@r0": 2}, {"w": "r0"}, cost=4.0),
        id="existing-and-new-combine-in-one-domain",
    ),
    pytest.param(
        Cluster().rack("b0", "r0", hosts=1)
        .pool(PoolB("cheap").domain("b0", "r9", 4).price(1))
        .pool(PoolB("dear").domain("b0", "r0", 4).price(5)),
        Gang().pod_set("w", 3, gpu=8, required="rack"), PROVISION,
        Expect({}, {"cheap@r9": 3}, {"w": "r9"}, cost=3.0),
        id="cheapest-new-capacity-wins-over-partial-existing",
    ),
    pytest.param(
        Cluster().pool(PoolB("a").domain("b0", "r0", 8).price(3))
        .pool(PoolB("b").domain("b0", "r0", 8).price(2)),
        Gang().pod_set("w", 2, gpu=8, required="rack"), PROVISION,
        Expect({}, {"b@r0": 2}, cost=4.0),
        id="cheapest-pool-in-domain",
    ),
    pytest.param(
        Cluster().pool(PoolB("ondemand").domain("b0", "r0", 8).price(2))
        .pool(PoolB("odcr").domain("b0", "r1", 8).price(5).reserved()),
        Gang().pod_set("w", 2, gpu=8, required="rack"), PROVISION,
        Expect({}, {"odcr@r1": 2}, {"w": "r1"}, cost=10.0),
        id="reserved-pool-wins-over-cheaper-on-demand",
    ),
    pytest.param(
        Cluster().pool(PoolB("ondemand").domain("b0", "r0", 8).price(0))
        .pool(PoolB("odcr").domain("b0", "r0", 8).price(0).reserved()),
        Gang().pod_set("w", 2, gpu=8, required="rack"), PROVISION,
        Expect({}, {"odcr@r0": 2}, cost=0.0),
        id="reserved-pool-wins-a-price-tie",
    ),
    pytest.param(
        Cluster().pool(PoolB("ondemand").domain("b0", "r0", 8).price(2))
        .pool(PoolB("odcr").domain("b0", "r1", 2).price(5).reserved()),
        Gang().pod_set("w", 3, gpu=8, required="rack"), PROVISION,
        Expect({}, {"ondemand@r0": 3}, {"w": "r0"}, cost=6.0),
        id="reservation-too-small-for-the-gang-is-not-used-partly",
    ),
    pytest.param(
        Cluster().pool(PoolB("a").domain("b0", "r0", 2).price(1))
        .pool(PoolB("b").domain("b0", "r0", 8).price(2)),
        Gang().pod_set("w", 3, gpu=8, required="rack"), PROVISION,
        Expect({}, {"a@r0": 2, "b@r0": 1}, cost=4.0),
        id="domain-limit-spills-to-next-pool",
    ),
    pytest.param(
        Cluster().pool(PoolB("a").domain("b0", "r0", 8).domain("b0", "r1", 8).max_new(3)),
        Gang().pod_set("w", 3, gpu=8, required="block"), PROVISION,
        Expect({}, {"a@r0": 3}),
        id="pool-wide-limit-respected",
    ),
    pytest.param(
        Cluster().pool(PoolB("a", gpus=8).domain("b0", "r0", 4).price(8))
        .pool(PoolB("small", gpus=1).domain("b0", "r0", 4).price(1.5)),
        Gang().pod_set("w", 1, gpu=1, required="rack"), PROVISION,
        Expect({}, {"small@r0": 1}, cost=1.5),
        id="one-pod-buys-the-cheapest-node-not-cheapest-per-pod",
    ),
    pytest.param(
        Cluster().pool(PoolB("tainted").domain("b0", "r0", 4).taint("gpu").price(1))
        .pool(PoolB("plain").domain("b0", "r1", 4).price(2)),
        Gang().pod_set("w", 1, gpu=8, required="rack"), PROVISION,
        Expect({}, {"plain@r1": 1}),
        id="pool-template-taints-honoured",
    ),
    pytest.param(
        Cluster().pool(PoolB("tainted").domain("b0", "r0", 4).taint("gpu").price(1))
        .pool(PoolB("plain").domain("b0", "r1", 4).price(2)),
        Gang().pod_set("w", 1, pod_shape=shape(gpu=8, tolerations=TOLERATE_GPU),
                       required="rack"), PROVISION,
        Expect({}, {"tainted@r0": 1}),
        id="tolerated-pool-taint",
    ),
    pytest.param(
        Cluster().pool(PoolB("a").domain("b0", "r0", 4).price(1))
        .pool(PoolB("b").domain("b1", "r1", 4).price(2)),
        Gang().pod_set("w", 1, pod_shape=shape(gpu=8, selector={BLOCK: "b1"})), PROVISION,
        Expect({}, {"b@r1": 1}),
        id="selector-matches-pool-domain-labels",
    ),
    pytest.param(
        Cluster().pool(PoolB("a").labels(tier="spot").domain("b0", "r0", 4).price(1))
        .pool(PoolB("b").labels(tier="ondemand").domain("b0", "r0", 4).price(2)),
        Gang().pod_set("w", 1, pod_shape=shape(gpu=8, selector={"tier": "ondemand"})),
        PROVISION,
        Expect({}, {"b@r0": 1}),
        id="selector-matches-pool-template-labels",
    ),
    pytest.param(
        Cluster().add(node("n1", gpus=8)),
        Gang().pod_set("a", 1, gpu=4).pod_set("b", 1, gpu=4), CHECK,
        Expect({"n1": 2}),
        id="pod-sets-share-a-node",
    ),
    pytest.param(
        Cluster().pool(PoolB("p").anywhere(4).price(1)),
        Gang().pod_set("a", 1, gpu=4).pod_set("b", 1, gpu=4), PROVISION,
        Expect({}, {"p@-": 1}, cost=1.0),
        id="pod-sets-share-a-new-node",
    ),
    pytest.param(
        Cluster().add(node("n1", gpus=8), node("n2", gpus=8)),
        Gang().pod_set("w", 1, gpu=4, required="hostname").pod_set("x", 2, gpu=4,
                                                                       required="hostname"),
        CHECK,
        Expect({"n1": 1, "n2": 2}),
        id="required-hostname-means-one-node-per-pod-set",
    ),
    pytest.param(
        Cluster().add(node("n1", gpus=8, labels={"kind": "a"}), node("n2", gpus=4)),
        Gang().pod_set("any", 1, gpu=4).pod_set(
            "only-a", 1, pod_shape=shape(gpu=8, selector={"kind": "a"})), CHECK,
        Expect({"n1": 1, "n2": 1}),
        id="second-order-tried-when-first-fails",
    ),
]


@pytest.mark.parametrize(("cluster", "gang", "mode", "expected"), FITS)
def test_fits(cluster: Cluster, gang: Gang, mode: Mode, expected: Expect) -> None:
    result = plan(gang.build(), cluster.snapshot(), mode)
    assert isinstance(result, Plan), result
    got = summarize(result)
    assert got.nodes == expected.nodes
    assert got.new == expected.new
    for pod_set, value in expected.domain.items():
        assert got.domain[pod_set] == value
    if expected.cost is not None:
        assert got.cost == pytest.approx(expected.cost)


NOFITS = [
    pytest.param(
        Cluster().rack("b0", "r0", hosts=3).rack("b0", "r1", hosts=3, free=[8, 8, 0])
        .rack("b1", "r2", hosts=4, free=[8, 0, 8, 8]),
        Gang().pod_set("w", 4, gpu=8, required="rack"), CHECK,
        ReasonCode.TOPOLOGY, "needs 4 pods x 8 nvidia.com/gpu within one value of rack; the best "
        "is rack r0 (block b0) with room for 3",
        id="required-rack-split-capacity",
    ),
    pytest.param(
        two_racks(), Gang().pod_set("w", 5, gpu=8, required="rack"), CHECK,
        ReasonCode.NEVER_FITS, "the best is rack r2 (block b1) with room for 4",
        id="required-rack-larger-than-any-rack",
    ),
    pytest.param(
        Cluster().rack("b0", "r3", hosts=4, free=[8, 8, 8, 0])
        .pool(PoolB("p5").domain("b0", "r3", 2, max_nodes=8)),
        Gang().pod_set("workers", 6, gpu=8, required="rack"), PROVISION,
        ReasonCode.TOPOLOGY,
        "pod set workers needs 6 pods x 8 nvidia.com/gpu within one value of rack; the best is "
        "rack r3 (block b0) with room for 3; pool p5 can add 2 more nodes there (its domain "
        "limit is 8)",
        id="issue-example-message",
    ),
    pytest.param(
        Cluster().rack("b0", "r0", hosts=2).pool(PoolB("p").domain("b0", "r0", 4)),
        Gang().pod_set("w", 3, gpu=8, required="rack"), CHECK,
        ReasonCode.TOPOLOGY, "check mode: existing nodes only",
        id="check-mode-ignores-pools",
    ),
    pytest.param(
        Cluster().add(node("a", labels={"zone": "z"}, taints=(Taint("gpu", "x", "NoExecute"),)),
                      node("b", schedulable=False), node("c", labels={"zone": "q"})),
        Gang().pod_set("w", 1, pod_shape=shape(gpu=8, selector={"zone": "z"})), CHECK,
        ReasonCode.NEVER_FITS, "needs 1 pod x 8 nvidia.com/gpu; no node has room for one: 1 "
        "unschedulable or NotReady; 1 outside its nodeSelector zone=z; 1 with untolerated "
        "taints (gpu=x:NoExecute)",
        id="nothing-matches",
    ),
    pytest.param(
        Cluster().add(node("a", gpus=8, free_gpus=4)),
        Gang().pod_set("w", 2, gpu=8), CHECK,
        ReasonCode.NEVER_FITS, "can never fit",
        id="never-fits-even-empty",
    ),
    pytest.param(
        Cluster().add(node("a", gpus=8, free_gpus=4), node("b", gpus=8, free_gpus=0)),
        Gang().pod_set("w", 2, gpu=8), CHECK,
        ReasonCode.INSUFFICIENT_CAPACITY, "existing nodes have room for 0",
        id="busy-now-not-permanent",
    ),
    pytest.param(
        Cluster().pool(PoolB("p").domain("b0", "r0", 8).max_new(2)),
        Gang().pod_set("w", 3, gpu=8), PROVISION,
        ReasonCode.NEVER_FITS, "pool p can add 2 more nodes",
        id="pool-wide-limit-makes-it-never-fit",
    ),
    pytest.param(
        Cluster().pool(replace(PoolB("p").domain("b0", "r0", 8).max_new(1).reserved().build(),
                               reserved_busy=3)),
        Gang().pod_set("w", 3, gpu=8), PROVISION,
        ReasonCode.POOL_LIMIT,
        "pool p can add 1 more nodes (what the reservation it draws from has free)",
        id="a-reservation-busy-now-is-not-never",
    ),
    pytest.param(
        Cluster().add(node("n1", gpus=8)),
        Gang().pod_set("a", 1, gpu=8).pod_set("b", 1, gpu=1), CHECK,
        ReasonCode.NEVER_FITS, "pod set b needs 1 pod x 1 nvidia.com/gpu; existing nodes have "
        "room for 0; no pool can add matching nodes (after placing pod set a)",
        id="gang-all-or-nothing",
    ),
    pytest.param(
        Cluster().add(node("n1")), Gang().pod_set("w", 0, gpu=1), CHECK,
        ReasonCode.INVALID, "count 0 < 1", id="invalid-count",
    ),
    pytest.param(
        Cluster().add(node("n1")), Gang().pod_set("w", 1, gpu=1, required="zone"), CHECK,
        ReasonCode.INVALID, "unknown topology level zone", id="invalid-level",
    ),
    pytest.param(
        Cluster().add(node("n1")), Gang().pod_set("w", 1, gpu=1).pod_set("w", 1, gpu=1), CHECK,
        ReasonCode.INVALID, "repeats", id="invalid-duplicate-pod-set",
    ),
]


@pytest.mark.parametrize(("cluster", "gang", "mode", "code", "message"), NOFITS)
def test_nofit(cluster: Cluster, gang: Gang, mode: Mode, code: ReasonCode, message: str) -> None:
    result = plan(gang.build(), cluster.snapshot(), mode)
    assert isinstance(result, NoFit), result
    codes = [r.code for r in result.reasons]
    assert code in codes
    text = " | ".join(r.message for r in result.reasons)
    assert message in text
    assert result.permanent is (code in (ReasonCode.NEVER_FITS, ReasonCode.INVALID))


def test_a_never_fits_headline_agrees_with_its_detail() -> None:
    # Rack r0 has 6 hosts, 5 of them busy now: today it holds 1 of 8, empty it holds 6 of 8.
    # The request fails as NeverFits, whose detail says "room for 6"; the headline must too.
    snap = Cluster().rack("b0", "r0", hosts=6, free=[8, 0, 0, 0, 0, 0]).snapshot()
    result = plan(Gang().pod_set("w", 8, gpu=8, required="rack").build(), snap, CHECK)
    assert isinstance(result, NoFit) and result.permanent
    assert "the best is rack r0 (block b0) with room for 6" in result.reasons[0].message
    headline = shortfall(result)
    assert headline.startswith("Pod set w is short by 2 pod(s) even in an empty cluster: it "
                               "must fit within one rack and the closest rack, b0/r0, can "
                               "hold 6 of 8."), headline


def test_nofit_places_nothing_partially() -> None:
    # Pod set "a" alone fits; the gang does not, so nothing at all is planned.
    snap = Cluster().add(node("n1", gpus=8)).snapshot()
    result = plan(Gang().pod_set("a", 1, gpu=8).pod_set("b", 1, gpu=8).build(), snap, CHECK)
    assert isinstance(result, NoFit)
    assert result.reasons[-1].pod_set in ("a", "b")


def _shuffled(snap: Snapshot, seed: int) -> Snapshot:
    nodes = list(snap.nodes)
    random.Random(seed).shuffle(nodes)
    return replace(snap, nodes=tuple(nodes))


@pytest.mark.parametrize("mode", [CHECK, PROVISION])
def test_deterministic_whatever_the_node_order(mode: Mode) -> None:
    cluster = (
        Cluster().rack("b0", "r0", hosts=6, free=[8, 4, 8, 0, 8, 8])
        .rack("b0", "r1", hosts=6, free=[8, 8, 2, 8, 8, 8]).rack("b1", "r2", hosts=5)
        .pool(PoolB("p").domain("b0", "r1", 4).domain("b1", "r2", 4).price(2))
    )
    gang: GangRequest = (
        Gang().pod_set("w", 9, gpu=8, preferred="rack").pod_set("l", 3, gpu=2).build()
    )
    snap = cluster.snapshot()
    first = plan(gang, snap, mode)
    for seed in range(5):
        assert plan(gang, _shuffled(snap, seed), mode) == first


def test_taint_on_pool_node_blocks_only_untolerating_sets() -> None:
    snap = Cluster().pool(PoolB("p").anywhere(2).taint("gpu", effect="NoExecute")).snapshot()
    blocked = plan(Gang().pod_set("w", 1, gpu=1).build(), snap, PROVISION)
    assert isinstance(blocked, NoFit)
    ok = plan(
        Gang().pod_set("w", 1, pod_shape=shape(gpu=1, tolerations=TOLERATE_GPU)).build(),
        snap, PROVISION,
    )
    assert isinstance(ok, Plan)


def test_plan_reports_levels_and_requests_for_booking() -> None:
    snap = Cluster().rack("b0", "r0", hosts=2).snapshot()
    result = plan(Gang().pod_set("w", 2, gpu=8, required="rack").build(), snap, CHECK)
    assert isinstance(result, Plan)
    (placement,) = result.placements
    assert placement.level == RACK
    assert placement.domain_labels == {BLOCK: "b0", RACK: "r0"}
    assert all(a.requests == {GPU: 8} for a in result.assignments)
    assert result.fits_existing


def test_a_run_is_not_planned_onto_capacity_that_ends_before_it() -> None:
    """A Capacity Block ending in an hour holds a 30-minute run, not a two-hour one: the
    cheaper block is skipped for the longer run and the on-demand pool takes it."""
    block = replace(PoolB("block").domain("b0", "r0", 4).price(1).build(), open_seconds=3600.0)
    snap = Cluster().pool(block).pool(PoolB("od").domain("b0", "r1", 4).price(5)).snapshot()
    gang = Gang().pod_set("w", 2, gpu=8, required="rack").build()

    short = plan(replace(gang, run_seconds=1800.0), snap, Mode.PROVISION)
    assert isinstance(short, Plan)
    assert {n.pool for n in short.new_nodes} == {"block"}
    long = plan(replace(gang, run_seconds=7200.0), snap, Mode.PROVISION)
    assert isinstance(long, Plan)
    assert {n.pool for n in long.new_nodes} == {"od"}
    unbounded = plan(gang, snap, Mode.PROVISION)
    assert isinstance(unbounded, Plan) and {n.pool for n in unbounded.new_nodes} == {"block"}
    # The planner's sequential passes read the same bound.
    planning = PlanningPass(snap)
    got = planning.plan(replace(gang, run_seconds=7200.0), Mode.PROVISION)
    assert isinstance(got, Plan) and {n.pool for n in got.new_nodes} == {"od"}
