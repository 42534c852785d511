"""Pydantic models of the Kueue ``kueue.x-k8s.io/v1beta2`` objects Muster reads or writes.

Only the fields Muster acts on are typed; everything else is kept (``extra="allow"``) so a
read-modify-write never drops what Kueue or another check controller wrote. Pod templates
stay plain dicts: Muster copies them into PodTemplates verbatim, as Kueue does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controller.api.meta import Condition, ObjectMeta

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"

CheckStateValue = Literal["Pending", "Ready", "Retry", "Rejected"]


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")


class _KueueObject(_Model):
    api_version: str = Field(default=API_VERSION, alias="apiVersion")
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)


# ---------------------------------------------------------------------------- Topology


class TopologyLevel(_Model):
    node_label: str = Field(alias="nodeLabel", min_length=1, max_length=316)


class TopologySpec(_Model):
    levels: list[TopologyLevel] = Field(min_length=1, max_length=16)


class Topology(_KueueObject):
    kind: str = "Topology"
    spec: TopologySpec

    @property
    def level_labels(self) -> list[str]:
        return [lv.node_label for lv in self.spec.levels]


# ---------------------------------------------------------------------------- ResourceFlavor


class FlavorToleration(_Model):
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")


class ResourceFlavorSpec(_Model):
    node_labels: dict[str, str] = Field(default_factory=dict, alias="nodeLabels")
    node_taints: list[dict[str, Any]] = Field(default_factory=list, alias="nodeTaints")
    tolerations: list[FlavorToleration] = Field(default_factory=list)
    topology_name: str | None = Field(default=None, alias="topologyName")


class ResourceFlavor(_KueueObject):
    kind: str = "ResourceFlavor"
    spec: ResourceFlavorSpec = Field(default_factory=ResourceFlavorSpec)


# ---------------------------------------------------------------------------- AdmissionCheck


class ParametersReference(_Model):
    api_group: str = Field(alias="apiGroup")
    kind: str
    name: str = Field(max_length=63)


class AdmissionCheckSpec(_Model):
    controller_name: str = Field(alias="controllerName", min_length=1, max_length=253)
    parameters: ParametersReference | None = None


class AdmissionCheckStatus(_Model):
    conditions: list[Condition] = Field(default_factory=list)


class AdmissionCheck(_KueueObject):
    kind: str = "AdmissionCheck"
    spec: AdmissionCheckSpec
    status: AdmissionCheckStatus = Field(default_factory=AdmissionCheckStatus)


# ------------------------------------------------------------ ProvisioningRequestConfig


class NodeSelectorUpdate(_Model):
    key: str = Field(min_length=1, max_length=317)
    value_from_provisioning_class_detail: str = Field(
        alias="valueFromProvisioningClassDetail", min_length=1, max_length=32768
    )


class PodSetUpdatesConfig(_Model):
    node_selector: list[NodeSelectorUpdate] = Field(
        default_factory=list, alias="nodeSelector", max_length=8
    )


class RetryStrategy(_Model):
    backoff_limit_count: int = Field(default=3, alias="backoffLimitCount", ge=0)
    backoff_base_seconds: int = Field(default=60, alias="backoffBaseSeconds", ge=0)
    backoff_max_seconds: int = Field(default=1800, alias="backoffMaxSeconds", ge=0)


class ProvisioningRequestConfigSpec(_Model):
    provisioning_class_name: str = Field(
        alias="provisioningClassName", min_length=1, max_length=253
    )
    parameters: dict[str, str] = Field(default_factory=dict, max_length=100)
    managed_resources: list[str] = Field(
        default_factory=list, alias="managedResources", max_length=100
    )
    retry_strategy: RetryStrategy = Field(default_factory=RetryStrategy, alias="retryStrategy")
    pod_set_updates: PodSetUpdatesConfig = Field(
        default_factory=PodSetUpdatesConfig, alias="podSetUpdates"
    )


class ProvisioningRequestConfig(_KueueObject):
    kind: str = "ProvisioningRequestConfig"
    spec: ProvisioningRequestConfigSpec


# ---------------------------------------------------------------------------- ClusterQueue


class AdmissionCheckStrategyRule(_Model):
    name: str
    on_flavors: list[str] = Field(default_factory=list, alias="onFlavors")


class AdmissionChecksStrategy(_Model):
    admission_checks: list[AdmissionCheckStrategyRule] = Field(
        default_factory=list, alias="admissionChecks"
    )


class ClusterQueueSpec(_Model):
    admission_checks_strategy: AdmissionChecksStrategy | None = Field(
        default=None, alias="admissionChecksStrategy"
    )


class ClusterQueue(_KueueObject):
    kind: str = "ClusterQueue"
    spec: ClusterQueueSpec = Field(default_factory=ClusterQueueSpec)


# ---------------------------------------------------------------------------- Workload


class TopologyRequest(_Model):
    required: str | None = None
    preferred: str | None = None
    unconstrained: bool | None = None


class PodSet(_Model):
    name: str = Field(default="main", max_length=63)
    count: int = Field(default=1, ge=0)
    min_count: int | None = Field(default=None, alias="minCount")
    template: dict[str, Any] = Field(default_factory=dict)
    topology_request: TopologyRequest | None = Field(default=None, alias="topologyRequest")


class WorkloadSpec(_Model):
    pod_sets: list[PodSet] = Field(default_factory=list, alias="podSets", max_length=18)
    queue_name: str | None = Field(default=None, alias="queueName")
    active: bool | None = None


class TopologyValues(_Model):
    universal: str | None = None
    individual: dict[str, Any] | None = None


class TopologyPodCounts(_Model):
    universal: int | None = None
    individual: list[int] | None = None


class TopologyAssignmentSlice(_Model):
    domain_count: int = Field(alias="domainCount", ge=1)
    values_per_level: list[TopologyValues] = Field(alias="valuesPerLevel")
    pod_counts: TopologyPodCounts = Field(alias="podCounts")


class TopologyAssignment(_Model):
    levels: list[str] = Field(default_factory=list)
    slices: list[TopologyAssignmentSlice] = Field(default_factory=list)


class PodSetAssignment(_Model):
    name: str
    flavors: dict[str, str] = Field(default_factory=dict)
    count: int | None = None
    topology_assignment: TopologyAssignment | None = Field(
        default=None, alias="topologyAssignment"
    )
    delayed_topology_request: str | None = Field(default=None, alias="delayedTopologyRequest")


class Admission(_Model):
    cluster_queue: str = Field(alias="clusterQueue")
    pod_set_assignments: list[PodSetAssignment] = Field(
        default_factory=list, alias="podSetAssignments"
    )


class PodSetUpdate(_Model):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, max_length=8)


class AdmissionCheckState(_Model):
    name: str
    state: CheckStateValue
    last_transition_time: str | None = Field(default=None, alias="lastTransitionTime")
    message: str = ""
    requeue_after_seconds: int | None = Field(default=None, alias="requeueAfterSeconds")
    retry_count: int | None = Field(default=None, alias="retryCount")
    pod_set_updates: list[PodSetUpdate] = Field(default_factory=list, alias="podSetUpdates")


class WorkloadStatus(_Model):
    conditions: list[Condition] = Field(default_factory=list)
    admission: Admission | None = None
    admission_checks: list[AdmissionCheckState] = Field(
        default_factory=list, alias="admissionChecks"
    )


class Workload(_KueueObject):
    kind: str = "Workload"
    spec: WorkloadSpec = Field(default_factory=WorkloadSpec)
    status: WorkloadStatus = Field(default_factory=WorkloadStatus)

    def condition_true(self, type_: str) -> bool:
        return any(c.type == type_ and c.status == "True" for c in self.status.conditions)

    def check(self, name: str) -> AdmissionCheckState | None:
        return next((c for c in self.status.admission_checks if c.name == name), None)

    @property
    def is_active(self) -> bool:
        return self.spec.active is not False
