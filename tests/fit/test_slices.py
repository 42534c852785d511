"""Kueue TAS slices in the fit engine (controller/fit/slices.py): every slice of
``slice_size`` pods whole in one domain of the slice level, together with the pod set's own
required or preferred level above it. The engine never reports a fit whose slices cannot be
kept whole; in check mode it is exact against a brute count (slices are identical, so a
rack holds ``room // size`` of them), with and without pools the plans keep every slice whole.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.fit import Mode, NoFit, Plan, plan
from tests.builders import BLOCK, GPU, RACK, Cluster, Gang, PoolB, node


def _pods_per(result: Plan, key: str) -> Counter[str]:
    per: Counter[str] = Counter()
    for a in result.assignments:
        per[a.domain.get(key, "?")] += a.pods
    return per


def _whole(result: Plan, size: int, key: str = RACK) -> bool:
    return all(n % size == 0 for n in _pods_per(result, key).values())


def test_a_block_with_room_but_no_rack_for_a_slice_does_not_fit() -> None:
    # Block b1 has room for 6 pods, 3 per rack: 4 pods fit the block, but a 4-pod slice fits
    # no rack. The old engine planned the block and left the slice to be split.
    cluster = Cluster().rack("b1", "r1", hosts=3).rack("b1", "r2", hosts=3)
    gang = Gang().pod_set("w", 4, gpu=8, required="block", slices=("rack", 4)).build()
    result = plan(gang, cluster.snapshot(), Mode.CHECK)
    assert isinstance(result, NoFit)
    assert [r.message for r in result.reasons] == [
        "gang ns/gang can never fit, even with every node empty and usable and every pool at "
        "its maximum: pod set w needs 4 pods x 8 nvidia.com/gpu within one value of block in "
        "slices of 4 pods, each within one rack; the best is block b1, which holds 0 of the 1 "
        "slices on existing nodes; no pool can add matching nodes",
        "now the best is block b1, which holds 0 of the 1 slices on existing nodes (check "
        "mode: existing nodes only)"]
    # Slices of 2 fit: 2 + 2 in the two racks of the block.
    gang = Gang().pod_set("w", 4, gpu=8, required="block", slices=("rack", 2)).build()
    result = plan(gang, cluster.snapshot(), Mode.CHECK)
    assert isinstance(result, Plan)
    assert _whole(result, 2) and {p.domain for p in result.placements} == {"b1"}


def test_the_block_whose_racks_hold_the_slices_is_chosen() -> None:
    cluster = (Cluster().rack("b1", "r1", hosts=3).rack("b1", "r2", hosts=3)
               .rack("b2", "r3", hosts=4).rack("b2", "r4", hosts=1))
    gang = Gang().pod_set("w", 4, gpu=8, required="block", slices=("rack", 4)).build()
    result = plan(gang, cluster.snapshot(), Mode.CHECK)
    assert isinstance(result, Plan)
    assert result.placements[0].domain == "b2"
    assert _pods_per(result, RACK) == {"r3": 4}


def test_new_nodes_are_bought_so_that_every_slice_is_whole_in_one_block() -> None:
    # b1/r1 has 3 free pods; each rack can add 2 nodes. 8 pods in slices of 4 within one
    # block: r1 takes 3 existing + 1 new, r2 4... but r2 can add only 2: b1 holds 1 + ...
    pool = (PoolB("p").domain("b1", "r1", 2).domain("b1", "r2", 2)
            .domain("b2", "r3", 4).domain("b2", "r4", 4).price(1))
    cluster = Cluster().rack("b1", "r1", hosts=3).rack("b1", "r2", hosts=0).pool(pool)
    gang = Gang().pod_set("w", 8, gpu=8, required="block", slices=("rack", 4)).build()
    result = plan(gang, cluster.snapshot(), Mode.PROVISION)
    assert isinstance(result, Plan)
    assert _whole(result, 4)
    # b1: r1 3+1 new = one slice, r2 2 new = none; so b2 with 8 new nodes, or b1 with r1
    # (3 existing + 1 new) and... r2 cannot hold 4: b2 it is.
    assert result.placements[0].domain == "b2"
    assert sum(n.count for n in result.new_nodes) == 8


def test_existing_leftovers_are_topped_up_to_whole_slices() -> None:
    pool = PoolB("p").domain("b1", "r1", 4).domain("b1", "r2", 4).price(1)
    cluster = Cluster().rack("b1", "r1", hosts=3).rack("b1", "r2", hosts=3).pool(pool)
    gang = Gang().pod_set("w", 8, gpu=8, required="block", slices=("rack", 4)).build()
    result = plan(gang, cluster.snapshot(), Mode.PROVISION)
    assert isinstance(result, Plan)
    assert _pods_per(result, RACK) == {"r1": 4, "r2": 4}
    assert sum(n.count for n in result.new_nodes) == 2


def test_preferred_block_keeps_the_slices_in_one_block_when_one_holds_them() -> None:
    # b1 has the most room (6 in one rack + 2) but only one 4-pod slice; b2 holds two.
    cluster = (Cluster().rack("b1", "r1", hosts=6).rack("b1", "r2", hosts=2)
               .rack("b2", "r3", hosts=4).rack("b2", "r4", hosts=4))
    gang = Gang().pod_set("w", 8, gpu=8, preferred="block", slices=("rack", 4)).build()
    result = plan(gang, cluster.snapshot(), Mode.CHECK)
    assert isinstance(result, Plan)
    assert result.placements[0].domain == "b2" and _whole(result, 4)
    # No block holds three slices: they spread, each still whole.
    gang = Gang().pod_set("w", 12, gpu=8, preferred="block", slices=("rack", 4)).build()
    result = plan(gang, cluster.snapshot(), Mode.CHECK)
    assert isinstance(result, Plan)
    assert _whole(result, 4) and len(_pods_per(result, BLOCK)) == 2


def test_slices_on_one_node_each() -> None:
    # Nodes of 3 GPUs hold one 2-pod slice each (not 3 pods of two slices).
    cluster = Cluster().add(*(node(f"n{i}", block="b", rack="r", gpus=3) for i in range(3)))
    gang = Gang().pod_set("w", 6, gpu=1, slices=("hostname", 2)).build()
    result = plan(gang, cluster.snapshot(), Mode.CHECK)
    assert isinstance(result, Plan)
    assert sorted(a.pods for a in result.assignments) == [2, 2, 2]
    gang = Gang().pod_set("w", 8, gpu=1, slices=("hostname", 2)).build()
    assert isinstance(plan(gang, cluster.snapshot(), Mode.CHECK), NoFit)
    # New nodes of 3 GPUs hold one slice each too.
    cluster.pool(PoolB("p", gpus=3).domain("b", "r", 4))
    result = plan(gang, cluster.snapshot(), Mode.PROVISION)
    assert isinstance(result, Plan)
    assert all(a.pods == 2 for a in result.assignments)
    assert sum(n.count for n in result.new_nodes) == 1


def test_a_requirement_at_the_slice_level_is_a_plain_requirement() -> None:
    cluster = Cluster().rack("b1", "r1", hosts=4)
    gang = Gang().pod_set("w", 4, gpu=8, required="rack", slices=("rack", 2)).build()
    result = plan(gang, cluster.snapshot(), Mode.CHECK)
    assert isinstance(result, Plan) and result.placements[0].domain == "r1"


# --------------------------------------------------------------------------- properties

racks_st = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5)), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(racks=racks_st, size=st.integers(1, 4), slices=st.integers(1, 4),
       outer=st.sampled_from(["required", "preferred", "none"]))
def test_check_mode_is_exact_and_keeps_every_slice_whole(
    racks: list[tuple[int, int]], size: int, slices: int, outer: str,
) -> None:
    """``racks``: (block, free one-pod nodes) per rack."""
    cluster = Cluster()
    room: dict[int, list[int]] = {}
    for i, (block, hosts) in enumerate(racks):
        cluster.rack(f"b{block}", f"r{i}", hosts=hosts)
        room.setdefault(block, []).append(hosts // size)
    kw = {"required": {"required": "block"}, "preferred": {"preferred": "block"}}.get(outer, {})
    gang = Gang().pod_set("w", size * slices, gpu=8, slices=("rack", size), **kw).build()
    result = plan(gang, cluster.snapshot(), Mode.CHECK)
    if outer == "required":
        possible = any(sum(r) >= slices for r in room.values())
    else:
        possible = sum(sum(r) for r in room.values()) >= slices
    assert isinstance(result, Plan) == possible, result
    if isinstance(result, Plan):
        assert _whole(result, size)
        if outer == "required":
            assert len(_pods_per(result, BLOCK)) == 1
        if outer == "preferred" and any(sum(r) >= slices for r in room.values()):
            assert len(_pods_per(result, BLOCK)) == 1


@settings(max_examples=100, deadline=None)
@given(racks=racks_st, new=st.lists(st.integers(0, 4), min_size=6, max_size=6),
       size=st.integers(1, 4), slices=st.integers(1, 4),
       outer=st.sampled_from(["required", "preferred", "none"]))
def test_provision_mode_keeps_every_slice_whole_and_is_exact(
    racks: list[tuple[int, int]], new: list[int], size: int, slices: int, outer: str,
) -> None:
    pool = PoolB("p").price(1)
    cluster = Cluster()
    room: dict[int, list[int]] = {}
    for i, (block, hosts) in enumerate(racks):
        cluster.rack(f"b{block}", f"r{i}", hosts=hosts)
        pool.domain(f"b{block}", f"r{i}", new[i])
        room.setdefault(block, []).append((hosts + new[i]) // size)
    cluster.pool(pool)
    kw = {"required": {"required": "block"}, "preferred": {"preferred": "block"}}.get(outer, {})
    gang = Gang().pod_set("w", size * slices, gpu=8, slices=("rack", size), **kw).build()
    result = plan(gang, cluster.snapshot(), Mode.PROVISION)
    if outer == "required":
        possible = any(sum(r) >= slices for r in room.values())
    else:
        possible = sum(sum(r) for r in room.values()) >= slices
    assert isinstance(result, Plan) == possible, result
    if isinstance(result, Plan):
        assert _whole(result, size)
        if outer == "required":
            assert len(_pods_per(result, BLOCK)) == 1
        bought = Counter[str]()
        for n in result.new_nodes:
            bought[n.domain[RACK]] += n.count
        for i, _ in enumerate(racks):
            assert bought[f"r{i}"] <= new[i]
    assert GPU
