"""A real API server taints every new Node ``node.kubernetes.io/not-ready:NoSchedule``
(TaintNodesByCondition) until the node lifecycle controller sees it Ready, seconds later.
Muster plans a Ready node as if that taint were already gone, waits for it to go before it
calls a gang Provisioned (the scheduler and Kueue's topology assignment both read taints),
and keeps every other taint, and a node that is not Ready, as they are."""

from __future__ import annotations

import asyncio
from typing import Any

from controller.api.node import Node
from controller.commands import objects
from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.fit import plan
from controller.fit.types import Mode, Plan, Snapshot
from controller.inputs.snapshot import node_state
from controller.state.cache import ClusterState
from tests.cluster_objects import gang

NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


def gpu_node(name: str, *, ready: bool = True, taints: list[dict[str, str]] | None = None
             ) -> dict[str, Any]:
    return objects.node(
        name, allocatable={"cpu": "96", "memory": "1024Gi", objects.GPU: "8"},
        labels={objects.BLOCK: "b1", objects.RACK: "b1-r1"}, taints=taints or [], ready=ready,
    )


def test_a_ready_node_is_planned_without_its_start_up_taint() -> None:
    nodes = [Node.model_validate(gpu_node(f"n{i}", taints=[NOT_READY])) for i in range(2)]
    snap_nodes = tuple(node_state(n) for n in nodes)
    assert all(s.taints == () for s in snap_nodes)
    assert [n.settled for n in nodes] == [False, False]


def test_other_taints_and_not_ready_nodes_keep_their_taints() -> None:
    tainted = Node.model_validate(gpu_node("gpu", taints=[NOT_READY, objects.GPU_TAINT]))
    assert [t.key for t in node_state(tainted).taints] == [objects.GPU]
    down = Node.model_validate(gpu_node("down", ready=False, taints=[NOT_READY]))
    assert [t.key for t in node_state(down).taints] == ["node.kubernetes.io/not-ready"]
    assert not node_state(down).schedulable


def test_a_gang_fits_on_fresh_ready_nodes_the_api_server_just_tainted() -> None:
    nodes = tuple(node_state(Node.model_validate(gpu_node(f"n{i}", taints=[NOT_READY])))
                  for i in range(4))
    result = plan(gang("g", 4), Snapshot(nodes, (), DEFAULT_LEVELS), Mode.CHECK)
    assert isinstance(result, Plan), result


async def test_waiting_for_ready_also_waits_for_the_taint_to_be_lifted() -> None:
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.upsert_node(Node.model_validate(gpu_node("n0", taints=[NOT_READY])))
    waiting = asyncio.ensure_future(state.objects.wait_ready(["n0"], within=5, sleep=asyncio.sleep))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "Ready but still tainted: the scheduler cannot place pods yet"
    state.upsert_node(Node.model_validate(gpu_node("n0")))
    assert await asyncio.wait_for(waiting, 1) == []
