"""PlanningPass: many gangs on one snapshot give exactly what plan + apply_plan in turn give."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controller.fit import (
    GangRequest,
    Mode,
    NodeState,
    Plan,
    PlanningPass,
    PodSetRequest,
    PoolState,
    Snapshot,
    TopologyMode,
    TopologyRequest,
    apply_plan,
    plan,
)
from controller.state.bookings import merge_plans
from tests.builders import LEVELS, Cluster, PoolB, level, shape
from tests.fit.test_properties import SETTINGS, nodes, pod_sets, pools


@st.composite
def gangs(draw: st.DrawFn) -> list[tuple[GangRequest, Mode, bool]]:
    """A sequence of gangs drawn from a few templates (so equal gangs repeat, as in a burst),
    each with a mode and whether its plan is booked (False: refused, e.g. by a budget)."""
    templates: list[tuple[PodSetRequest, ...]] = []
    for t in range(draw(st.integers(1, 3))):
        sets = [draw(pod_sets(f"t{t}a"))]
        if draw(st.booleans()):
            sets.append(draw(pod_sets(f"t{t}b")))
        templates.append(tuple(sets))
    out = []
    for i in range(draw(st.integers(1, 8))):
        sets = draw(st.sampled_from(templates))
        mode = draw(st.sampled_from([Mode.PROVISION, Mode.PROVISION, Mode.CHECK]))
        out.append((GangRequest(f"ns/g{i}", sets), mode, draw(st.integers(0, 4)) > 0))
    return out


def _sequential(
    snap: Snapshot, sequence: list[tuple[GangRequest, Mode, bool]]
) -> list[object]:
    results: list[object] = []
    for gang, mode, book in sequence:
        result = plan(gang, snap, mode)
        results.append(result)
        if book and isinstance(result, Plan):
            snap = apply_plan(snap, result)
    return results


@SETTINGS
@given(nodes(), pools(), gangs())
def test_pass_plans_exactly_like_plan_then_apply(
    node_states: tuple[NodeState, ...],
    pool_states: tuple[PoolState, ...],
    sequence: list[tuple[GangRequest, Mode, bool]],
) -> None:
    snap = Snapshot(node_states, pool_states, LEVELS)
    expected = _sequential(snap, sequence)
    planning = PlanningPass(snap)
    for (gang, mode, book), want in zip(sequence, expected, strict=True):
        got = planning.plan(gang, mode)
        assert got == want, gang.name
        if book and isinstance(got, Plan):
            planning.commit(got)


def test_a_burst_of_equal_gangs_reuses_the_workspace_and_books_each_capacity_once() -> None:
    # Two racks with 3 free GPUs on each host; the pool adds 8-GPU nodes in either rack.
    cluster = (
        Cluster()
        .rack("b0", "r0", hosts=2, free=[3, 3])
        .rack("b0", "r1", hosts=2, free=[3, 3])
        .pool(PoolB("p").domain("b0", "r0", 10).domain("b0", "r1", 10).max_new(15))
    )
    snap = cluster.snapshot()
    workers = PodSetRequest("w", 6, shape(gpu=1),
                            TopologyRequest(TopologyMode.REQUIRED, level("rack")))
    planning = PlanningPass(snap)
    placed: list[Plan] = []
    for i in range(12):
        got = planning.plan(GangRequest(f"ns/g{i}", (workers,)), Mode.PROVISION)
        if not isinstance(got, Plan):
            break
        planning.commit(got)
        placed.append(got)
    assert planning.reused == len(placed) - 1 >= 10
    # Existing GPUs are handed out once: 12 free GPUs, so at most 12 pods on old nodes.
    on_existing = sum(a.pods for p in placed for a in p.assignments if a.node is not None)
    assert on_existing == 12
    # New nodes never exceed the pool's limit, and each plan numbers its own slots from 0.
    assert sum(n.count for p in placed for n in p.new_nodes) <= 15
    for p in placed:
        indexes = [a.new_node.index for a in p.assignments if a.new_node is not None]
        assert not indexes or min(indexes) == 0


@SETTINGS
@given(nodes(), pools(), gangs(), st.data())
def test_apply_plan_with_a_memo_equals_without(
    node_states: tuple[NodeState, ...],
    pool_states: tuple[PoolState, ...],
    sequence: list[tuple[GangRequest, Mode, bool]],
    data: st.DataObject,
) -> None:
    # The cache applies every booking on each pass with one memo kept between passes, while
    # nodes change (a pod lands: a new NodeState) and bookings come and go.
    from dataclasses import replace

    from controller.fit.capacity import BookedMemo

    snap = Snapshot(node_states, pool_states, LEVELS)
    plans = [r for r in _sequential(snap, sequence) if isinstance(r, Plan)]
    memo: BookedMemo = {}
    for _ in range(3):
        chosen = data.draw(st.lists(st.sampled_from(plans), max_size=4)) if plans else []
        if snap.nodes and data.draw(st.booleans()):
            i = data.draw(st.integers(0, len(snap.nodes) - 1))
            node = snap.nodes[i]
            changed = replace(node, free={k: v - 1 for k, v in node.free.items()})
            snap = replace(snap, nodes=(*snap.nodes[:i], changed, *snap.nodes[i + 1:]))
        merged = merge_plans(chosen)
        if merged is None:
            continue
        assert apply_plan(snap, merged, memo=memo) == apply_plan(snap, merged)
