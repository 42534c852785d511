"""The fit engine: where does a whole gang fit, on existing nodes plus new capacity.

Pure: no I/O, no clock, no randomness, no Kubernetes client (checked by import-linter).
Entry point: :func:`plan`; booking helper: :func:`apply_plan`; many gangs against one
snapshot: :class:`PlanningPass`; the per-node rule: :func:`pods_that_fit`.
"""

# Re-exported so callers import the engine's public surface from one place.
from controller.fit.capacity import apply_plan
from controller.fit.gang import plan
from controller.fit.passes import PlanningPass
from controller.fit.shapes import pods_that_fit
from controller.fit.types import (
    Assignment,
    GangRequest,
    Mode,
    NewNodes,
    NewNodeSlot,
    NodeState,
    NoFit,
    Plan,
    PodSetPlacement,
    PodSetRequest,
    PodShape,
    PoolDomain,
    PoolState,
    Reason,
    ReasonCode,
    Resources,
    Result,
    SelectorRequirement,
    SelectorTerm,
    Snapshot,
    Spread,
    Taint,
    Toleration,
    TopologyMode,
    TopologyRequest,
)

__all__ = [
    "Assignment",
    "GangRequest",
    "Mode",
    "NewNodeSlot",
    "NewNodes",
    "NoFit",
    "NodeState",
    "Plan",
    "PlanningPass",
    "PodSetPlacement",
    "PodSetRequest",
    "PodShape",
    "PoolDomain",
    "PoolState",
    "Reason",
    "ReasonCode",
    "Resources",
    "Result",
    "SelectorRequirement",
    "SelectorTerm",
    "Snapshot",
    "Spread",
    "Taint",
    "Toleration",
    "TopologyMode",
    "TopologyRequest",
    "apply_plan",
    "plan",
    "pods_that_fit",
]
