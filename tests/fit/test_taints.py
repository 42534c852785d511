"""Condition and cordon taints versus lasting ones (controller.fit.taints), and what the
engine and the snapshot builder make of them."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from controller.api.node import Node
from controller.fit import GangRequest, Mode, NoFit, Plan, PodSetRequest, PodShape, plan
from controller.fit.taints import (
    CONDITION_TAINTS,
    NOT_READY,
    UNREACHABLE,
    UNSCHEDULABLE,
    effective_taints,
    lasting_taints,
    transient,
)
from controller.fit.types import Snapshot, Taint, Toleration
from controller.inputs.snapshot import build_snapshot
from tests.builders import GPU, LEVELS, node

GPU_TAINT = Taint(GPU, "present", "NoSchedule")


def k8s_node(name: str, *, ready: str | None = "True", taints: list[dict[str, str]] | None = None,
             unschedulable: bool = False) -> Node:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"allocatable": {"cpu": "8", GPU: "8", "pods": "110"},
                   "conditions": conditions},
    }
    return Node.model_validate(body)


def test_ready_node_loses_its_not_ready_taint() -> None:
    taints = (Taint(NOT_READY, "", "NoSchedule"), Taint(NOT_READY, "", "NoExecute"), GPU_TAINT)
    assert effective_taints(taints, {"Ready": "True"}) == (GPU_TAINT,)


def test_not_ready_node_keeps_it_and_gains_it() -> None:
    assert effective_taints((), {"Ready": "False"}) == (Taint(NOT_READY, "", "NoSchedule"),)
    assert effective_taints((), {"Ready": "Unknown"}) == (Taint(UNREACHABLE, "", "NoSchedule"),)
    kept = (Taint(NOT_READY, "", "NoSchedule"),)
    assert effective_taints(kept, {"Ready": "False"}) == kept


def test_unreported_condition_keeps_the_taint() -> None:
    kept = (Taint("node.kubernetes.io/disk-pressure", "", "NoSchedule"),)
    assert effective_taints(kept, {"Ready": "True"}) == kept
    assert effective_taints(kept, {"Ready": "True", "DiskPressure": "False"}) == ()


def test_cordon_is_the_unschedulable_taint() -> None:
    cordon = Taint(UNSCHEDULABLE, "", "NoSchedule")
    assert effective_taints((), {}, unschedulable=True) == (cordon,)
    assert effective_taints((cordon,), {}, unschedulable=False) == ()


def test_lasting_taints_keep_only_permanent_ones() -> None:
    taints = (Taint(NOT_READY, "", "NoSchedule"), GPU_TAINT, Taint(UNSCHEDULABLE, "", "NoSchedule"))
    assert lasting_taints(taints) == (GPU_TAINT,)
    plain = (GPU_TAINT,)
    assert lasting_taints(plain) is plain


@given(st.lists(st.sampled_from([*CONDITION_TAINTS, UNSCHEDULABLE, GPU, "dedicated"]),
                max_size=6),
       st.dictionaries(st.sampled_from(sorted({c for c, _ in CONDITION_TAINTS.values()})),
                       st.sampled_from(["True", "False", "Unknown"])),
       st.booleans())
def test_effective_taints_follow_the_conditions(
    keys: list[str], conditions: dict[str, str], cordoned: bool
) -> None:
    taints = tuple(Taint(k, "", "NoSchedule") for k in keys)
    got = effective_taints(taints, conditions, unschedulable=cordoned)
    # Lasting taints are never dropped or added.
    assert [t for t in got if not transient(t)] == [t for t in taints if not transient(t)]
    for key, (ctype, bad) in CONDITION_TAINTS.items():
        status = conditions.get(ctype)
        present = any(t.key == key for t in got)
        if status == bad:
            assert present
        elif status is not None:
            assert not present
        else:
            assert present == (key in keys)
    assert any(t.key == UNSCHEDULABLE for t in got) == cordoned


def gang(tolerations: tuple[Toleration, ...] = ()) -> GangRequest:
    shape = PodShape({GPU: 8}, tolerations=(Toleration(GPU, "Exists"), *tolerations))
    return GangRequest("ns/g", (PodSetRequest("w", 1, shape),))


def test_snapshot_of_a_fresh_ready_node_is_usable() -> None:
    """A node that turned Ready while still carrying the not-ready taint (the lifecycle
    controller removes it on its next pass) fits the gang."""
    fresh = k8s_node("n", taints=[{"key": NOT_READY, "effect": "NoSchedule"},
                                  {"key": GPU, "value": "present", "effect": "NoSchedule"}])
    snap = build_snapshot([fresh], levels=LEVELS)
    assert isinstance(plan(gang(), snap, Mode.CHECK), Plan)


def test_a_booting_node_is_not_never_fits() -> None:
    """A NotReady node with its not-ready taint does not fit now, but waiting can help."""
    booting = k8s_node("n", ready="False", taints=[{"key": NOT_READY, "effect": "NoSchedule"}])
    snap = build_snapshot([booting], levels=LEVELS)
    got = plan(gang(), snap, Mode.CHECK)
    assert isinstance(got, NoFit)
    assert not got.permanent


def test_cordoned_node_takes_only_pods_tolerating_the_cordon() -> None:
    snap = build_snapshot([k8s_node("n", unschedulable=True)], levels=LEVELS)
    assert snap.nodes[0].schedulable
    assert isinstance(plan(gang(), snap, Mode.CHECK), NoFit)
    tolerant = gang((Toleration(UNSCHEDULABLE, "Exists", effect="NoSchedule"),))
    assert isinstance(plan(tolerant, snap, Mode.CHECK), Plan)


def test_never_fits_ignores_condition_taints_of_nodes() -> None:
    tainted = node("a", taints=(Taint(UNREACHABLE, "", "NoSchedule"),))
    got = plan(gang(), Snapshot((tainted,), (), LEVELS), Mode.CHECK)
    assert isinstance(got, NoFit)
    assert not got.permanent
