"""Node (core/v1): the fields that decide whether and how much a node can run."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from controller.api.meta import ObjectMeta
from controller.api.pod import Quantity
from controller.common.topology_defaults import UNREGISTERED_TAINT


class _Open(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")


class Taint(_Open):
    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
    time_added: str | None = Field(default=None, alias="timeAdded")


class NodeSpec(_Open):
    unschedulable: bool = False
    taints: list[Taint] = Field(default_factory=list)
    provider_id: str | None = Field(default=None, alias="providerID")


class NodeCondition(_Open):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""


class NodeStatus(_Open):
    allocatable: dict[str, Quantity] = Field(default_factory=dict)
    capacity: dict[str, Quantity] = Field(default_factory=dict)
    conditions: list[NodeCondition] = Field(default_factory=list)


STARTUP_TAINTS = frozenset({
    # TaintNodesByCondition admission puts this on every new Node; the node lifecycle
    # controller lifts it as soon as it sees the node Ready.
    "node.kubernetes.io/not-ready",
    # The lifecycle controller's NoExecute twin for Ready=Unknown, lifted the same way.
    "node.kubernetes.io/unreachable",
    # The kubelet's --cloud-provider=external mark, lifted by the cloud-controller-manager
    # once it initialised the node (AWS and GCP nodes register with it).
    "node.cloudprovider.kubernetes.io/uninitialized",
})
"""Taints that say "this node is still starting" and go away without anyone acting."""


class Node(_Open):
    api_version: Literal["v1"] = Field(default="v1", alias="apiVersion")
    kind: Literal["Node"] = "Node"
    metadata: ObjectMeta
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus = Field(default_factory=NodeStatus)

    @property
    def ready(self) -> bool:
        """Ready=True. A node that has not reported a Ready condition is not ready."""
        return any(c.type == "Ready" and c.status == "True" for c in self.status.conditions)

    def condition_statuses(self) -> dict[str, str]:
        """Condition type -> status, as the node reports them."""
        return {c.type: c.status for c in self.status.conditions}

    @property
    def usable(self) -> bool:
        """Ready and not being deleted: what Muster plans on. A cordon is not in it: the
        scheduler still places pods that tolerate ``node.kubernetes.io/unschedulable``
        there (the fit engine sees the cordon as that taint)."""
        return self.ready and self.metadata.deletion_timestamp is None

    @property
    def settled(self) -> bool:
        """Ready and carrying no start-up taint (nor Muster's, which Muster lifts once it
        registered the node): the scheduler (and Kueue's topology assignment, which reads
        taints too) can place pods on it now."""
        return self.ready and not any(
            t.key in STARTUP_TAINTS or t.key == UNREGISTERED_TAINT for t in self.spec.taints
        )

    @property
    def schedulable(self) -> bool:
        """Ready, not cordoned and not being deleted."""
        return (
            self.ready
            and not self.spec.unschedulable
            and self.metadata.deletion_timestamp is None
        )

    def allocatable(self) -> dict[str, Quantity]:
        """status.allocatable, falling back to capacity when a node reports no allocatable."""
        return self.status.allocatable or self.status.capacity
