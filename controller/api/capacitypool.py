"""CapacityPool (``muster.dev/v1alpha1``, cluster-scoped): where Muster may add nodes.

The CRD YAML in ``crds/`` is generated from this model (``python -m controller.api.crdgen``);
the model is the one source of truth.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.api.dra import ResourceSliceTemplate
from controller.api.meta import Condition, ObjectMeta
from controller.api.quantity import parse_quantity
from controller.api.validation import label_value, qualified_name

__all__ = [
    "KIND",
    "CapacityPool",
    "CapacityPoolSpec",
    "CapacityPoolStatus",
    "Condition",
    "NodeTemplate",
    "ObjectMeta",
    "PoolDomainSpec",
    "PoolTopology",
    "TaintSpec",
]

GROUP = "muster.dev"
VERSION = "v1alpha1"
PLURAL = "capacitypools"
KIND = "CapacityPool"


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class TaintSpec(_Model):
    key: str = Field(min_length=1, max_length=317)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class NodeTemplate(_Model):
    """What every node the pool creates looks like once it registers."""

    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    allocatable: dict[str, str] = Field(
        description="Allocatable resources of one new node, as Kubernetes quantities.",
        min_length=1,
    )
    capacity: dict[str, str] | None = Field(
        default=None, description="Node capacity; defaults to allocatable."
    )
    resource_slices: list[ResourceSliceTemplate] = Field(
        default_factory=list,
        alias="resourceSlices",
        description="DRA devices every new node will publish: ResourceSlice specs "
        "(resource.k8s.io/v1) without node scope; pool.name defaults to the node name.",
    )

    @model_validator(mode="after")
    def _what_the_api_server_accepts(self) -> NodeTemplate:
        # The nodes are created with these: a value the API server or the node's own
        # parsing would refuse makes every acquisition fail (or worse, in the sandbox, buy
        # nodes nothing can read). Refused here, the pool is ignored and named in the log.
        for field, values in (("allocatable", self.allocatable),
                              ("capacity", self.capacity or {})):
            for name, value in values.items():
                try:
                    parse_quantity(value)
                except ValueError:
                    raise ValueError(
                        f"nodeTemplate.{field}.{name}: {value!r} is not a quantity") from None
        for key, value in self.labels.items():
            if not qualified_name(key) or not label_value(value):
                raise ValueError(f"nodeTemplate.labels: {key}={value!r} is not a valid label")
        for i, taint in enumerate(self.taints):
            if not qualified_name(taint.key) or not label_value(taint.value):
                raise ValueError(f"nodeTemplate.taints[{i}]: {taint.key}={taint.value!r} is "
                                 "not a valid taint key and value")
        return self


class PoolDomainSpec(_Model):
    labels: dict[str, str] = Field(
        min_length=1,
        description="Topology labels of nodes in this domain, e.g. block and rack values.",
    )
    max_nodes: int | None = Field(
        default=None,
        alias="maxNodes",
        ge=0,
        description="Stock: how many nodes this domain can hold at most (defaults to the "
        "pool's maxNodesPerDomain).",
    )


class PoolTopology(_Model):
    level: str = Field(
        min_length=1,
        description="Node label of the topology level one acquisition lands in as a unit "
        "(for example one placement group = one rack).",
    )
    max_nodes_per_domain: int = Field(alias="maxNodesPerDomain", ge=1)
    domains: list[PoolDomainSpec] = Field(
        default_factory=list,
        description="Known domains new nodes can join. Empty: every acquisition creates a "
        "fresh domain of `level` (for example a new placement group).",
    )


class CapacityPoolSpec(_Model):
    provider: str = Field(min_length=1, description="Provider name: fake, aws or gcp.")
    parameters: dict[str, Any] = Field(
        default_factory=dict,
        description="Provider-specific parameters, validated by the provider. Never credentials.",
    )
    node_template: NodeTemplate = Field(alias="nodeTemplate")
    topology: PoolTopology | None = None
    min_nodes: int = Field(default=0, alias="minNodes", ge=0)
    max_nodes: int = Field(alias="maxNodes", ge=0)
    price_per_node_hour: float = Field(default=0.0, alias="pricePerNodeHour", ge=0)
    expected_ready_seconds: float = Field(default=120.0, alias="expectedReadySeconds", ge=0)

    @model_validator(mode="after")
    def _min_le_max(self) -> CapacityPoolSpec:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"minNodes ({self.min_nodes}) exceeds maxNodes ({self.max_nodes})")
        return self


class CapacityPoolStatus(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    nodes: int = 0
    booked_nodes: int = Field(default=0, alias="bookedNodes")
    conditions: list[Condition] = Field(default_factory=list)


POOL_FINALIZER = "muster.dev/release-nodes"
"""Muster holds every pool it serves with this finalizer and plans on a pool only once it is
there, so a deleted pool stays (with its provider settings) until its nodes are released."""


class CapacityPool(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    api_version: Literal["muster.dev/v1alpha1"] = Field(
        default="muster.dev/v1alpha1", alias="apiVersion"
    )
    kind: Literal["CapacityPool"] = "CapacityPool"
    metadata: ObjectMeta
    spec: CapacityPoolSpec
    status: CapacityPoolStatus = Field(default_factory=CapacityPoolStatus)
