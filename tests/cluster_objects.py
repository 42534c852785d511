"""Small builders for controller tests (API-shaped dicts and fit types)."""

from __future__ import annotations

from typing import Any

from controller.commands import objects
from controller.fit.types import (
    Assignment,
    GangRequest,
    Mode,
    NewNodes,
    NewNodeSlot,
    Plan,
    PodSetPlacement,
    PodSetRequest,
    PodShape,
    TopologyMode,
    TopologyRequest,
)
from providers.fake import FakeProvider

GPU8 = {"cpu": 90_000, "memory": 900 * 2**30, objects.GPU: 8, "pods": 1}


def gang(name: str, workers: int, *, level: str | None = objects.RACK) -> GangRequest:
    topo = TopologyRequest(TopologyMode.REQUIRED, level) if level else TopologyRequest()
    from controller.fit.types import Toleration

    shape = PodShape(requests=GPU8, tolerations=(Toleration(key=objects.GPU, operator="Exists"),))
    return GangRequest(f"default/{name}", (PodSetRequest("workers", workers, shape, topo),))


def gpu_node(name: str, rack: str = "b1-r1", **labels: str) -> dict[str, Any]:
    return objects.node(
        name, allocatable={"cpu": "96", "memory": "1024Gi", objects.GPU: "8"},
        labels={objects.BLOCK: rack.split("-")[0], objects.RACK: rack, **labels},
        taints=[objects.GPU_TAINT],
    )


def plan_on(nodes: list[str], *, new: int = 0, pool: str = "p", rack: str = "b1-r1") -> Plan:
    domain = {objects.BLOCK: rack.split("-")[0], objects.RACK: rack}
    assignments = [Assignment("workers", 1, node=n, domain=domain, requests=GPU8) for n in nodes]
    assignments += [
        Assignment("workers", 1, new_node=NewNodeSlot(pool, domain, i), domain=domain,
                   requests=GPU8)
        for i in range(new)
    ]
    return Plan(
        request="default/x", mode=Mode.PROVISION, assignments=tuple(assignments),
        new_nodes=(NewNodes(pool, domain, new, 1.5 * new),) if new else (),
        placements=(PodSetPlacement("workers", objects.RACK, rack, 1, domain),),
        cost_per_hour=1.5 * new,
    )


def starve(provider: FakeProvider) -> None:
    """No stock left in any rack of the "gpu" pool."""
    for b in (1, 2):
        for r in range(1, 5):
            provider.set_stock("gpu", {objects.BLOCK: f"b{b}", objects.RACK: f"b{b}-r{r}"}, 0)
