"""The fit-engine strategies: they really ask ``controller.fit.plan``, and the reduced
snapshot they show it never changes whether a job fits."""

from __future__ import annotations

import random

from controller.fit import GangRequest, Mode, NodeState, NoFit, Plan, Snapshot, plan
from controller.fit.types import PodSetRequest, TopologyMode, TopologyRequest
from controller.simulate.engine import SimNode
from controller.simulate.strategies import BLOCK_LABEL, RACK_LABEL, GangFit, make
from tests.simulate.helpers import H, config, trace


def test_muster_asks_the_fit_engine_for_a_rack_then_a_block() -> None:
    seen: list[tuple[str, TopologyMode, str | None]] = []

    def spy(request: GangRequest, snapshot: Snapshot, mode: Mode) -> Plan | NoFit:
        ps = request.pod_sets[0]
        seen.append((request.name, ps.topology.mode, ps.topology.level))
        return plan(request, snapshot, mode)

    # 7 + 7 nodes in stock: the 8-node gang fits no rack, so the engine is asked twice.
    jobs = trace((0, H, 64), (10, H, 1))
    result = make("muster", jobs, config(initial_stock=(7, 7)), planner=spy).run()
    assert result.started == 2
    assert seen == [
        ("job-0", TopologyMode.REQUIRED, RACK_LABEL),
        ("job-0", TopologyMode.REQUIRED, BLOCK_LABEL),
        ("job-1", TopologyMode.REQUIRED, RACK_LABEL),
    ]


def test_pod_by_pod_does_not_use_the_fit_engine() -> None:
    def forbidden(request: GangRequest, snapshot: Snapshot, mode: Mode) -> Plan | NoFit:
        raise AssertionError("pod-by-pod called the fit engine")

    result = make("pod-by-pod", trace((0, H, 32), (5, H, 1)), config(), planner=forbidden).run()
    assert (result.started, result.fit_calls) == (2, 0)


def _random_cluster(seed: int) -> GangFit:
    rng = random.Random(seed)
    cfg = config(blocks=2, racks_per_block=3, nodes_per_rack=6, initial_stock=None,
                 quota_gpus=8 * rng.randint(8, 36))
    sim = GangFit(trace(), cfg, topology=True)
    for _ in range(rng.randint(0, 24)):
        rack = rng.randrange(6)
        granted = sim.cloud.acquire_atomic([(rack, 1)])
        if granted is None:
            continue  # no stock there or no quota left
        node = sim.add_node(rack, granted[0][1])
        sim._set_free(node, rng.choice([0, 0, 1, 3, 4, 7, 8, 8]))
    return sim


def _state(sim: GangFit, node: SimNode) -> NodeState:
    return NodeState(
        name=node.name,
        labels=sim.rack_labels[node.rack],
        taints=(),
        allocatable={"nvidia.com/gpu": 8},
        free={"nvidia.com/gpu": node.free},
        pool="gpu-nodes",
    )


def test_reduced_snapshot_decides_like_the_full_one() -> None:
    outcomes = {True: 0, False: 0}
    for seed in range(40):
        sim = _random_cluster(seed)
        rng = random.Random(1000 + seed)
        every_node = tuple(_state(sim, n) for n in sim.nodes.values())
        for _ in range(6):
            pods, gpus = rng.choice(
                [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 8), (4, 8), (7, 8)]
            )
            reduced = sim._snapshot(pods, gpus)
            full = Snapshot(nodes=every_node, pools=reduced.pools, levels=reduced.levels)
            for level in (RACK_LABEL, BLOCK_LABEL):
                topology = TopologyRequest(TopologyMode.REQUIRED, level)
                request = GangRequest(
                    "g", (PodSetRequest("w", pods, sim._shape(gpus), topology),)
                )
                got_reduced = plan(request, reduced, Mode.PROVISION)
                got_full = plan(request, full, Mode.PROVISION)
                fits = isinstance(got_full, Plan)
                assert isinstance(got_reduced, Plan) == fits, (seed, pods, gpus, level)
                outcomes[fits] += 1
                if isinstance(got_reduced, Plan) and isinstance(got_full, Plan):
                    # Existing capacity first in both views: the same number of new nodes.
                    assert sum(n.count for n in got_reduced.new_nodes) == sum(
                        n.count for n in got_full.new_nodes
                    )
    assert outcomes[True] > 50 and outcomes[False] > 50  # both kinds of case were exercised
