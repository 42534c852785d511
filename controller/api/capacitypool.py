"""CapacityPool (``muster.dev/v1alpha1``, cluster-scoped): where Muster may add nodes.

The CRD YAML in ``crds/`` is generated from this model (``python -m controller.api.crdgen``);
the model is the one source of truth.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.api.dra import ResourceSliceTemplate
from controller.api.meta import Condition, ObjectMeta
from controller.api.parameters import DURATION_PATTERN, RELAX_TOPOLOGY_AFTER, duration_seconds
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
    "PoolDomainStatus",
    "PoolReservationStatus",
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
        # The nodes are created with these: a label or taint the API server would refuse
        # makes every acquisition fail. Refused here, the pool is ignored and named in the
        # log. Amounts that are no quantity are checked beside the model (the cache's
        # _quantity_errors, which leaves such a pool out of planning), so that a pool's
        # other errors are listed with them, not hidden behind the first.
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
    registration_timeout_seconds: float | None = Field(
        default=None,
        alias="registrationTimeoutSeconds",
        gt=0,
        description="How long this pool's new machines may take to register their Nodes "
        "and become Ready before the acquisition is released and retried (NodesNotReady). "
        "Unset: the controller's acquisition.node_ready_timeout_seconds. At least "
        "expectedReadySeconds.",
    )
    relax_topology_after: str | None = Field(
        default=None,
        alias=RELAX_TOPOLOGY_AFTER,
        pattern=DURATION_PATTERN,
        description="Default, for gangs that may use this pool, of how long a gang waits for "
        "the one topology domain it requires before Muster takes the most compact placement "
        "it can get: a duration such as 30m, 1h30m, 90s or a number of seconds, or never. "
        "A request's relaxTopologyAfter parameter or muster.dev/relax-topology-after "
        "annotation overrides it; absent: topology.relax_after_seconds. When a gang may use "
        "several pools, the longest of their waits applies (never beats any).",
    )

    @property
    def relax_after_seconds(self) -> float | None:
        """The pool's relaxTopologyAfter in seconds (inf: never), None when unset."""
        if self.relax_topology_after is None:
            return None
        return duration_seconds(self.relax_topology_after)

    @model_validator(mode="after")
    def _min_le_max(self) -> CapacityPoolSpec:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"minNodes ({self.min_nodes}) exceeds maxNodes ({self.max_nodes})")
        budget = self.registration_timeout_seconds
        if budget is not None and budget < self.expected_ready_seconds:
            raise ValueError(
                f"registrationTimeoutSeconds ({budget:g}) is shorter than expectedReadySeconds "
                f"({self.expected_ready_seconds:g}): every machine would be released before "
                "it is expected to be Ready"
            )
        return self


class PoolDomainStatus(BaseModel):
    """One topology domain of the pool as Muster sees it (docs/reference/capacitypool-status.md)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    name: str = Field(description="The domain's level values, widest first, joined by '/' "
                      "(e.g. b1/b1-r2); '-' for a pool without topology, 'new' for the "
                      "fresh domains of a pool without declared domains.")
    labels: dict[str, str] = Field(default_factory=dict)
    nodes: int = Field(default=0, description="Nodes of the pool that exist here.")
    ready_nodes: int = Field(default=0, alias="readyNodes",
                             description="Of those, Ready (pods can be placed on them).")
    booked_nodes: int = Field(default=0, alias="bookedNodes",
                              description="Of those, counted on by a live booking.")
    in_flight_nodes: int = Field(default=0, alias="inFlightNodes",
                                 description="Booked or being acquired, not registered yet.")
    free: dict[str, str] = Field(
        default_factory=dict,
        description="Unbooked free allocatable on the Ready nodes, for each resource the "
        "node template offers (pods excluded), as quantities.")
    free_devices: dict[str, int] = Field(
        default_factory=dict, alias="freeDevices",
        description="DRA devices free on the Ready nodes, by DeviceClass (classes the "
        "template's ResourceSlices can satisfy).")
    free_nodes: int = Field(
        default=0, alias="freeNodes",
        description="Ready nodes with every resource of the template free: whole nodes a "
        "gang can still get here without buying any.")
    provisionable_nodes: int = Field(
        default=0, alias="provisionableNodes",
        description="New nodes Muster may still add here: the domain's and the pool's limits "
        "and known stock, minus nodes existing, booked or in flight.")
    provisionable: dict[str, str] = Field(
        default_factory=dict,
        description="What those new nodes would bring (template allocatable x "
        "provisionableNodes), as quantities.")
    available_nodes: int = Field(
        default=0, alias="availableNodes",
        description="freeNodes + provisionableNodes: nodes of the template's size a gang "
        "can still get in this domain.")
    max_nodes: int | None = Field(default=None, alias="maxNodes",
                                  description="The domain's limit (stock), if any.")
    stock_out_until: str | None = Field(
        default=None, alias="stockOutUntil",
        description="The provider ran out of stock here: Muster plans at most "
        "stockOutNodes new nodes here until this time (RFC 3339).")
    stock_out_nodes: int | None = Field(
        default=None, alias="stockOutNodes",
        description="The stock the provider reported in its stock-out (see stockOutUntil).")


class PoolReservationStatus(BaseModel):
    """Named capacity the pool draws from, as the cloud counts it (not Muster's view)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    id: str = Field(description="The reservation (or reservation/reservationBlocks/block).")
    zone: str = Field(default="", description="Zone the reservation's capacity is in.")
    reserved: int = Field(default=0, description="Instances the reservation holds.")
    used: int = Field(default=0, description="Of those, running (any owner's).")
    free: int = Field(default=0, description="reserved - used: what a gang can still get.")
    state: str = Field(default="", description="The cloud's state of the reservation.")
    start: str | None = Field(default=None, description="When it can first be used "
                              "(RFC 3339; a Capacity Block's start).")
    end: str | None = Field(default=None, description="When it ends (RFC 3339; a Capacity "
                            "Block's end): no plan is booked past it.")
    observed_at: str = Field(default="", alias="observedAt",
                             description="When these figures were read from the cloud.")


class CapacityPoolStatus(BaseModel):
    """Written by Muster at a bounded rate (``pool_status`` in its config), only when it
    changes; a proposal other components can read: docs/reference/capacitypool-status.md."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    nodes: int = 0
    ready_nodes: int = Field(default=0, alias="readyNodes")
    booked_nodes: int = Field(default=0, alias="bookedNodes",
                              description="Existing nodes counted on by a live booking.")
    in_flight_nodes: int = Field(
        default=0, alias="inFlightNodes",
        description="Nodes booked or being acquired but not registered yet; they count "
        "against maxNodes like registered ones.")
    provisionable_nodes: int = Field(default=0, alias="provisionableNodes")
    available_nodes: int = Field(default=0, alias="availableNodes")
    free_gpus: int = Field(
        default=0, alias="freeGPUs",
        description="Free (unbooked) GPUs on Ready nodes: every resource named */gpu.")
    free: dict[str, str] = Field(default_factory=dict)
    domains: list[PoolDomainStatus] = Field(default_factory=list)
    reservations: list[PoolReservationStatus] = Field(
        default_factory=list,
        description="The reservations the pool names (spec.parameters), with the cloud's "
        "own reserved/used/free, read at most every pool_status.reservation_refresh_seconds.")
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
