"""The pod-spec subset that decides placement, PodTemplate and (bound) Pod.

Field names follow core/v1. Object-level models keep unknown fields (``extra="allow"``) so
a PodTemplate read and written back loses nothing; the scheduling-relevant fields are typed
and validated. :meth:`PodSpec.effective_requests` computes what the scheduler reserves for
one pod (containers, sidecars, init containers, overhead).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from controller.api.meta import ObjectMeta
from controller.api.quantity import parse_quantity, to_resources
from controller.fit.shapes import parse_int64


def _quantity(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"invalid quantity {value!r}")
    parse_quantity(value)
    return str(value)


Quantity = Annotated[str, BeforeValidator(_quantity)]
"""A Kubernetes quantity string, checked at parse time ("500m", "2Gi", 8)."""


class _Open(BaseModel):
    """Unknown fields are kept (round-tripped), e.g. container image, env, volumes."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")


class _Closed(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


POD_LEVEL_RESOURCES = frozenset({"cpu", "memory"})
"""Resources ``spec.resources`` may set (and hugepages-*)."""


class ResourceRequirements(_Open):
    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)

    def effective(self) -> dict[str, int]:
        """Requests, with limits standing in for missing requests (API-server defaulting)."""
        merged: dict[str, str] = {**self.limits, **self.requests}
        return to_resources(merged)


class ContainerPort(_Open):
    container_port: int = Field(alias="containerPort", ge=1, le=65535)
    host_port: int = Field(default=0, alias="hostPort", ge=0, le=65535)
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    host_ip: str = Field(default="", alias="hostIP")


class Container(_Open):
    name: str = ""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    restart_policy: str | None = Field(default=None, alias="restartPolicy")
    ports: list[ContainerPort] = Field(default_factory=list)
    restart_policy_rules: list[dict[str, Any]] = Field(
        default_factory=list, alias="restartPolicyRules"
    )

    @property
    def is_sidecar(self) -> bool:
        """An init container with restartPolicy Always runs for the pod's whole life."""
        return self.restart_policy == "Always"


class NodeSelectorRequirement(_Closed):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> NodeSelectorRequirement:
        op = self.operator
        if op in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {op} takes no values")
        if op in ("Gt", "Lt"):
            if len(self.values) != 1:
                raise ValueError(f"operator {op} needs exactly one value")
            if parse_int64(self.values[0]) is None:
                raise ValueError(f"operator {op} needs an integer value")
        return self


class NodeFieldSelectorRequirement(NodeSelectorRequirement):
    """A matchFields entry: only ``metadata.name``, only In or NotIn, exactly one value
    (the API server's ``ValidateNodeFieldSelectorRequirement``)."""

    @model_validator(mode="after")
    def _name_field_only(self) -> NodeFieldSelectorRequirement:
        if self.key != "metadata.name":
            raise ValueError(f"matchFields key {self.key!r} is not supported (only metadata.name)")
        if self.operator not in ("In", "NotIn"):
            raise ValueError(f"matchFields operator {self.operator} is not supported "
                             "(only In and NotIn)")
        if len(self.values) != 1:
            raise ValueError("matchFields with In or NotIn needs exactly one value")
        return self


class NodeSelectorTerm(_Closed):
    match_expressions: list[NodeSelectorRequirement] = Field(
        default_factory=list, alias="matchExpressions"
    )
    match_fields: list[NodeFieldSelectorRequirement] = Field(
        default_factory=list, alias="matchFields"
    )


class NodeSelector(_Closed):
    node_selector_terms: list[NodeSelectorTerm] = Field(alias="nodeSelectorTerms", min_length=1)


class NodeAffinity(_Open):
    required: NodeSelector | None = Field(
        default=None, alias="requiredDuringSchedulingIgnoredDuringExecution"
    )


class _Strict(BaseModel):
    """Scheduling constraints Muster plans from: a misspelt field is an error, as with the
    API server's strict field validation, never a constraint silently dropped."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class LabelSelectorRequirement(_Strict):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        return (value is not None) == (self.operator == "Exists")


class LabelSelector(_Strict):
    """metav1.LabelSelector; an empty selector matches every object."""

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, alias="matchExpressions"
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )


class PodAffinityTerm(_Strict):
    label_selector: LabelSelector | None = Field(default=None, alias="labelSelector")
    namespaces: list[str] = Field(default_factory=list)
    namespace_selector: LabelSelector | None = Field(default=None, alias="namespaceSelector")
    topology_key: str = Field(alias="topologyKey", min_length=1)
    match_label_keys: list[str] = Field(default_factory=list, alias="matchLabelKeys")
    mismatch_label_keys: list[str] = Field(default_factory=list, alias="mismatchLabelKeys")


class PodAffinity(_Open):
    required: list[PodAffinityTerm] = Field(
        default_factory=list, alias="requiredDuringSchedulingIgnoredDuringExecution"
    )


class TopologySpreadConstraint(_Strict):
    max_skew: int = Field(alias="maxSkew", ge=1)
    topology_key: str = Field(alias="topologyKey", min_length=1)
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        alias="whenUnsatisfiable"
    )
    label_selector: LabelSelector | None = Field(default=None, alias="labelSelector")
    min_domains: int | None = Field(default=None, alias="minDomains", ge=1)
    node_affinity_policy: Literal["Honor", "Ignore"] | None = Field(
        default=None, alias="nodeAffinityPolicy"
    )
    node_taints_policy: Literal["Honor", "Ignore"] | None = Field(
        default=None, alias="nodeTaintsPolicy"
    )
    match_label_keys: list[str] = Field(default_factory=list, alias="matchLabelKeys")

    @model_validator(mode="after")
    def _min_domains_hard_only(self) -> TopologySpreadConstraint:
        if self.min_domains is not None and self.when_unsatisfiable != "DoNotSchedule":
            raise ValueError("minDomains can only be set with whenUnsatisfiable DoNotSchedule")
        return self


class Affinity(_Open):
    node_affinity: NodeAffinity | None = Field(default=None, alias="nodeAffinity")
    pod_affinity: PodAffinity | None = Field(default=None, alias="podAffinity")
    pod_anti_affinity: PodAffinity | None = Field(default=None, alias="podAntiAffinity")


class Toleration(_Closed):
    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")

    @model_validator(mode="before")
    @classmethod
    def _none_is_empty(cls, data: Any) -> Any:
        # The API server serialises unset strings as null in some clients.
        if isinstance(data, dict):
            return {k: ("" if v is None and k in ("key", "value", "effect") else v)
                    for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _operator_rules(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        if not self.key and self.operator != "Exists":
            raise ValueError("an empty key needs operator Exists")
        return self


class PodResourceClaim(_Open):
    """Reference to a DRA ResourceClaim (kept for the DRA work; not used by fit yet)."""

    name: str
    resource_claim_name: str | None = Field(default=None, alias="resourceClaimName")
    resource_claim_template_name: str | None = Field(
        default=None, alias="resourceClaimTemplateName"
    )


class PodSpec(_Open):
    containers: list[Container] = Field(min_length=1)
    init_containers: list[Container] = Field(default_factory=list, alias="initContainers")
    overhead: dict[str, Quantity] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    affinity: Affinity | None = None
    tolerations: list[Toleration] = Field(default_factory=list)
    resource_claims: list[PodResourceClaim] = Field(default_factory=list, alias="resourceClaims")
    node_name: str | None = Field(default=None, alias="nodeName")
    restart_policy: str | None = Field(default=None, alias="restartPolicy")
    host_network: bool = Field(default=False, alias="hostNetwork")
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list, alias="topologySpreadConstraints"
    )
    volumes: list[dict[str, Any]] = Field(default_factory=list)
    runtime_class_name: str | None = Field(default=None, alias="runtimeClassName")
    scheduler_name: str | None = Field(default=None, alias="schedulerName")
    resources: ResourceRequirements | None = None
    """Pod-level resources (PodLevelResources): they replace the containers' cpu and memory."""

    def host_ports(self) -> list[tuple[str, str, int]]:
        """(protocol, host IP, host port) the pod claims on its node: ports with a hostPort
        of its sidecars (init containers with restartPolicy Always, which run for the pod's
        whole life) and regular containers, as the scheduler's NodePorts filter reads them
        (k8s ``schedutil.GetHostPorts``; with ``hostNetwork`` the API server defaults
        hostPort to containerPort in init and regular containers alike)."""
        out: list[tuple[str, str, int]] = []
        running = [c for c in self.init_containers if c.is_sidecar]
        for c in [*running, *self.containers]:
            for p in c.ports:
                port = p.host_port or (p.container_port if self.host_network else 0)
                if port > 0:
                    out.append((p.protocol, p.host_ip, port))
        return out

    def effective_requests(self) -> dict[str, int]:
        """What the scheduler reserves for one pod (k8s ``resourcehelper.PodRequests``):
        the containers' requests (:meth:`container_requests`), pod-level requests in their
        place where set, plus the overhead."""
        total = self.container_requests()
        if self.resources is not None:
            # k8s resourcehelper.PodRequests: pod-level requests (limits standing in for
            # unset requests) win for the resources that support them.
            for res, amount in self.resources.effective().items():
                if res in POD_LEVEL_RESOURCES or res.startswith("hugepages-"):
                    total[res] = amount
        _add(total, to_resources(self.overhead))
        return total

    def container_requests(self) -> dict[str, int]:
        """The containers' requests together (k8s ``AggregateContainerRequests``).

        Regular containers and sidecars (init containers with restartPolicy Always) run
        together; each ordinary init container runs alone next to the sidecars started
        before it; the pod needs the larger of the two.
        """
        total: dict[str, int] = {}
        for c in self.containers:
            _add(total, c.resources.effective())
        sidecars: dict[str, int] = {}
        init_peak: dict[str, int] = {}
        for c in self.init_containers:
            req = c.resources.effective()
            if c.is_sidecar:
                _add(sidecars, req)
                _max(init_peak, sidecars)
            else:
                step = dict(sidecars)
                _add(step, req)
                _max(init_peak, step)
        _add(total, sidecars)
        _max(total, init_peak)
        return total

    def required_terms(self) -> list[NodeSelectorTerm]:
        aff = self.affinity
        if aff is None or aff.node_affinity is None or aff.node_affinity.required is None:
            return []
        return aff.node_affinity.required.node_selector_terms


def _add(into: dict[str, int], other: dict[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _max(into: dict[str, int], other: dict[str, int]) -> None:
    for k, v in other.items():
        into[k] = max(into.get(k, 0), v)


class PodTemplateSpec(_Open):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec


class PodTemplate(_Open):
    api_version: Literal["v1"] = Field(default="v1", alias="apiVersion")
    kind: Literal["PodTemplate"] = "PodTemplate"
    metadata: ObjectMeta
    template: PodTemplateSpec


class PodStatus(_Open):
    phase: str | None = None


class Pod(_Open):
    """A pod as far as capacity accounting goes: where it is bound and what it requests."""

    api_version: Literal["v1"] = Field(default="v1", alias="apiVersion")
    kind: Literal["Pod"] = "Pod"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec
    status: PodStatus = Field(default_factory=PodStatus)

    @property
    def holds_capacity(self) -> bool:
        """Bound and not finished: Succeeded/Failed pods free their node's resources."""
        return bool(self.spec.node_name) and self.status.phase not in ("Succeeded", "Failed")
