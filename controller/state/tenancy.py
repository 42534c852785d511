"""What the requests of one namespace hold, for the per-namespace limits (``budgets.namespaces``).

A namespace holds the new nodes Muster bought for its requests: every group of a live
booking (planned, acquiring or booked: the planned count, registered or not), and every node
Muster acquired for one of its requests that still exists while no live booking holds it (a
booking that ended, a failed attempt not yet released, a deleted request whose pods still
run). Those cost money until released, whoever uses them. Existing nodes a plan merely
places pods on cost nothing new and are not counted. Pure: the cache
(:meth:`controller.state.cache.ClusterState.namespace_usage`) feeds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller.api.capacitypool import CapacityPool
from controller.api.quantity import to_units
from controller.config import NamespaceLimits


@dataclass(frozen=True, slots=True)
class Usage:
    nodes: int = 0
    gpus: int = 0
    cost_per_hour: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.nodes + other.nodes, self.gpus + other.gpus,
                     self.cost_per_hour + other.cost_per_hour)

    def times(self, count: int) -> Usage:
        return Usage(self.nodes * count, self.gpus * count, self.cost_per_hour * count)

    def describe(self) -> str:
        return f"{self.nodes} node(s), {self.gpus} GPU(s), {self.cost_per_hour:.2f}/h"


def gpus_of(resources: Mapping[str, str]) -> int:
    """GPUs in a resource list: every extended resource named ``<vendor>/gpu``."""
    total = 0
    for name, value in resources.items():
        if name.endswith("/gpu"):
            try:
                total += to_units(name, str(value))
            except ValueError:
                continue  # an unreadable quantity is reported where the pool is validated
    return total


def pool_node(pool: CapacityPool | None) -> Usage:
    """One new node of ``pool`` (nothing known of a pool that is gone: one node)."""
    if pool is None:
        return Usage(nodes=1)
    spec = pool.spec
    return Usage(1, gpus_of(spec.node_template.allocatable), spec.price_per_node_hour)


def exceeded(limits: NamespaceLimits, usage: Usage) -> list[str]:
    """Each limit ``usage`` goes over, as ``what > limit`` texts (empty: within)."""
    over = []
    if limits.max_nodes is not None and usage.nodes > limits.max_nodes:
        over.append(f"{usage.nodes} nodes > max_nodes {limits.max_nodes}")
    if limits.max_gpus is not None and usage.gpus > limits.max_gpus:
        over.append(f"{usage.gpus} GPUs > max_gpus {limits.max_gpus}")
    cap = limits.max_cost_per_hour
    if cap is not None and usage.cost_per_hour > cap + 1e-9:
        over.append(f"{usage.cost_per_hour:.2f}/h > max_cost_per_hour "
                    f"{limits.max_cost_per_hour:.2f}")
    return over


def owner_uid_of_key(key: str) -> str:
    """The request uid an acquisition key was made from (``<uid>-<attempt>-<group>``,
    :func:`controller.acquire.keys.acquisition_key`)."""
    parts = key.rsplit("-", 2)
    return parts[0] if len(parts) == 3 else ""


REQUEST_GROUP = "autoscaling.x-k8s.io"


def foreign_request_owner(meta_extra: Mapping[str, object] | None, uid: str) -> str | None:
    """The ProvisioningRequest other than ``uid`` that owns an object (by its
    ``ownerReferences``), as ``name (uid ...)``; None when no other request owns it.

    Kueue (path A) moves the PodTemplates it makes to their request, and Muster's own check
    (path B) gives them to the Workload: a template owned by another request is that
    request's, and is deleted with it. Planning from it would let one request hold capacity
    through another's objects."""
    refs = (meta_extra or {}).get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if not isinstance(ref, Mapping):
            continue
        group = str(ref.get("apiVersion") or "").partition("/")[0]
        if ref.get("kind") == "ProvisioningRequest" and group == REQUEST_GROUP and (
            str(ref.get("uid") or "") != uid
        ):
            return f"{ref.get('name')} (uid {ref.get('uid')})"
    return None
