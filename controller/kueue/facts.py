"""What Muster's admission check needs to know about CapacityPools and the nodes they made.

Inside the controller the facts come from its :class:`ClusterState` (already kept current by
its watches), so the check adds no second watch on nodes, whose status updates are the
busiest stream in a large cluster. Run standalone (tests), the integration watches pools
and nodes itself and fills a :class:`WatchedFacts`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from controller.common.topology_defaults import POOL_LABEL
from controller.kueue.drafts import PoolTaints
from controller.state.cache import ClusterState


class PoolFacts(Protocol):
    def pools(self) -> Sequence[PoolTaints]:
        """Every CapacityPool: new-node labels (with the pool label) and taints."""
        ...

    def pool_of(self, node: str) -> str | None:
        """The CapacityPool that created ``node``, if any."""
        ...

    def domains(self) -> Sequence[tuple[str, int, Mapping[str, str]]]:
        """(pool, domain index, labels a node there carries) for every declared domain."""
        ...


class StateFacts:
    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def pools(self) -> Sequence[PoolTaints]:
        out = []
        for name, pool in self._state.pool_registry.pools().items():
            tpl = pool.spec.node_template
            out.append(PoolTaints(
                name=name, labels={**tpl.labels, POOL_LABEL: name},
                taints=[t.model_dump() for t in tpl.taints],
            ))
        return out

    def pool_of(self, node: str) -> str | None:
        found = self._state.objects.node(node)
        return found.metadata.labels.get(POOL_LABEL) if found is not None else None

    def domains(self) -> Sequence[tuple[str, int, Mapping[str, str]]]:
        out: list[tuple[str, int, Mapping[str, str]]] = []
        for name, pool in sorted(self._state.pool_registry.pools().items()):
            base = pool.spec.node_template.labels
            topo = pool.spec.topology
            for i, d in enumerate(topo.domains if topo else []):
                out.append((name, i, {**base, **d.labels}))
        return out


class WatchedFacts:
    """Filled from raw watched objects by :class:`controller.kueue.integration.KueueIntegration`."""

    def __init__(self) -> None:
        self.pool_bodies: dict[str, dict[str, Any]] = {}
        self.node_pools: dict[str, str] = {}

    def pools(self) -> Sequence[PoolTaints]:
        out = []
        for name, body in self.pool_bodies.items():
            tpl = (body.get("spec") or {}).get("nodeTemplate") or {}
            out.append(PoolTaints(
                name=name, labels={**(tpl.get("labels") or {}), POOL_LABEL: name},
                taints=[dict(t) for t in tpl.get("taints") or []],
            ))
        return out

    def pool_of(self, node: str) -> str | None:
        return self.node_pools.get(node)

    def domains(self) -> Sequence[tuple[str, int, Mapping[str, str]]]:
        out: list[tuple[str, int, Mapping[str, str]]] = []
        for name, body in sorted(self.pool_bodies.items()):
            spec = body.get("spec") or {}
            base = (spec.get("nodeTemplate") or {}).get("labels") or {}
            for i, d in enumerate((spec.get("topology") or {}).get("domains") or []):
                out.append((name, i, {**base, **(d.get("labels") or {})}))
        return out
