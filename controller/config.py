"""Muster's one typed configuration.

Read once at start-up from a YAML file (``muster run --config FILE``) and ``MUSTER_*``
environment variables (nested keys joined with ``__``, e.g. ``MUSTER_BOOKING__DURATION_SECONDS``);
the environment wins over the file. Unknown keys and bad values stop the controller at
start-up with a message naming the key, instead of being silently ignored at run time.
Everything else in the controller receives a :class:`MusterConfig` (or a part of it); nothing
reads the environment on its own.
"""

from __future__ import annotations

import contextvars
import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from controller.api.parameters import processor_instance
from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.fit.types import Mode

ENV_PREFIX = "MUSTER_"

CHECK_CAPACITY_CLASS = "check-capacity.muster.dev"
ATOMIC_CLASS = "atomic-provisioning.muster.dev"
QUEUED_CLASS = "queued-provisioning.muster.dev"
UPSTREAM_CHECK_CAPACITY_CLASS = "check-capacity.autoscaling.x-k8s.io"
UPSTREAM_ATOMIC_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"



class ConfigError(Exception):
    """The configuration is unusable; the message names each bad key and why."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClassesConfig(_Section):
    check_capacity: list[str] = Field(
        default_factory=lambda: [CHECK_CAPACITY_CLASS],
        description="Class names served as check-capacity: existing nodes only.",
    )
    atomic: list[str] = Field(
        default_factory=lambda: [ATOMIC_CLASS],
        description="Class names served as atomic provisioning: existing plus new nodes.",
    )
    queued: list[str] = Field(
        default_factory=lambda: [QUEUED_CLASS],
        description="Class names served as queued provisioning: atomic provisioning whose "
        "gang waits in the cloud's queue (or Muster's own) on a stock-out instead of "
        "retrying until its attempts run out.",
    )
    serve_upstream: bool = Field(
        default=False,
        description="Also serve check-capacity.autoscaling.x-k8s.io and "
        "best-effort-atomic-scale-up.autoscaling.x-k8s.io. Only for clusters whose "
        "cluster-autoscaler does not serve them, or both would act on the same requests.",
    )

    processor_instance: str = Field(
        default="",
        description="Like cluster-autoscaler's --check-capacity-processor-instance: serve only "
        "check-capacity requests whose processorInstance parameter equals this (empty: those "
        "without one); when set, atomic requests are left to another instance.",
    )

    @model_validator(mode="after")
    def _disjoint(self) -> ClassesConfig:
        for a, b, names in (("check-capacity", "atomic", (self.check_capacity, self.atomic)),
                            ("check-capacity", "queued", (self.check_capacity, self.queued)),
                            ("atomic", "queued", (self.atomic, self.queued))):
            both = set(names[0]) & set(names[1])
            if both:
                raise ValueError(f"class names served both as {a} and {b}: {sorted(both)}")
        return self

    def is_queued(self, class_name: str) -> bool:
        """Whether requests of ``class_name`` wait in a queue on a stock-out."""
        return class_name in self.queued

    def mode_for(
        self, class_name: str, parameters: Mapping[str, str] | None = None
    ) -> Mode | None:
        """The fit mode serving a request of ``class_name`` with ``parameters``, or None when
        Muster must ignore it (another class, or another processor instance's)."""
        if class_name in self.check_capacity or (
            self.serve_upstream and class_name == UPSTREAM_CHECK_CAPACITY_CLASS
        ):
            instance = processor_instance(parameters or {})
            return Mode.CHECK if instance == self.processor_instance else None
        if class_name in self.atomic or class_name in self.queued or (
            self.serve_upstream and class_name == UPSTREAM_ATOMIC_CLASS
        ):
            return Mode.PROVISION if not self.processor_instance else None
        return None


class TopologyConfig(_Section):
    levels: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LEVELS),
        min_length=1,
        description="Node label keys of the topology levels, widest first.",
    )
    relax_after_seconds: float | None = Field(
        default=None,
        ge=0,
        description="How long a request waits for the one domain its "
        "muster.dev/required-topology annotation asks for before Muster takes the most "
        "compact placement it can get (one domain of the next wider level before two, fewest "
        "domains), named in provisioningClassDetails (muster.dev/topology-relaxed) and the "
        "Provisioned message. null: never (placement stays strict). A request overrides it "
        "with the relaxTopologyAfter parameter or the muster.dev/relax-topology-after "
        "annotation (never: strict). Kueue's podset-required-topology is never relaxed.",
    )
    reserve_seconds: float | None = Field(
        default=None,
        gt=0,
        description="For this long after its topology wait is over (relax_after_seconds or "
        "its own), the oldest gang still waiting holds a reservation: requests created after "
        "it may not take a node as good as empty for its pods nor buy a node from a pool "
        "that could take them (they may still use what is left on busy nodes). null: off. "
        "Trades the younger requests' starts for the waiting gang's.",
    )

    @model_validator(mode="after")
    def _unique(self) -> TopologyConfig:
        if len(set(self.levels)) != len(self.levels):
            raise ValueError(f"topology levels repeat a label: {self.levels}")
        return self


class BookingConfig(_Section):
    duration_seconds: float = Field(
        default=600.0,
        gt=0,
        description="How long capacity stays booked after Provisioned=True when the pods "
        "do not all arrive (cluster-autoscaler hard-codes 10 minutes).",
    )


class RetryConfig(_Section):
    initial_backoff_seconds: float = Field(
        default=10.0, gt=0, description="Delay before the first retry; doubles per attempt."
    )
    max_backoff_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Cap of the doubling retry delay. A waiting request sees capacity that "
        "frees only at its next retry, and each retry writes the request twice "
        "(annotations, condition).",
    )
    max_attempts: int = Field(
        default=720,
        ge=1,
        description="Planning or acquisition attempts before a request that keeps missing "
        "capacity is marked Failed (720: about 12 hours at the 60 s cap; the "
        "ValidUntilSeconds parameter ends a request's retries sooner).",
    )
    max_unready_acquisitions: int = Field(
        default=3,
        ge=1,
        description="Acquisitions whose nodes were not Ready within "
        "acquisition.node_ready_timeout_seconds before the request is marked Failed. Each "
        "such node was paid for and then released, so these have a budget of their own, far "
        "below max_attempts (which counts waits for capacity, which cost nothing).",
    )
    arrival_wait_seconds: float = Field(
        default=10.0,
        ge=0,
        description="How long after its creation a request waits for objects created with it "
        "before failing for good: a PodTemplate it names, or a ResourceClaimTemplate, "
        "ResourceClaim or DeviceClass its pods claim through (else FailedToCreatePods, naming "
        "what to create), and the CapacityPools or nodes that would let it fit (else "
        "CapacityNeverFits). Clients such as kubectl apply and Kueue create them a moment "
        "apart, in either order, and each kind reaches Muster through its own watch; its "
        "arrival plans the waiting request at once.",
    )
    replan_on_capacity_change: bool = Field(
        default=True,
        description="Plan waiting requests again, oldest first and in one planner pass, as "
        "soon as something that could let them fit changes in the cluster (nodes released, "
        "freed or added, a booking ended, a request deleted, a CapacityPool created or "
        "changed, a stock-out's avoidance window over), instead of only when their backoff "
        "timer fires. A woken request that still does not fit writes nothing; the backoff "
        "still covers what Muster cannot watch (a cloud's stock).",
    )
    replan_order: Literal["arrival", "backoff"] = Field(
        default="backoff",
        description="Who among the waiting requests a re-planning round (and every planner "
        "pass) serves first: backoff, the request whose backoff timer would have fired first "
        "(freed capacity goes where the timers alone would have sent it, without the wait); "
        "arrival, the oldest request (FIFO, as Kueue's BestEffortFIFO). Measured with "
        "muster simulate: under overload arrival order leaves more short jobs never started.",
    )
    replan_max_per_second: float = Field(
        default=4.0,
        gt=0,
        description="At most this many such re-planning rounds start per second, each only "
        "once the previous one was planned, however fast the cluster churns.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> RetryConfig:
        if self.initial_backoff_seconds > self.max_backoff_seconds:
            raise ValueError(
                f"initial_backoff_seconds ({self.initial_backoff_seconds}) exceeds "
                f"max_backoff_seconds ({self.max_backoff_seconds})"
            )
        return self

    def backoff(self, attempt: int) -> float:
        """Delay before attempt ``attempt + 1`` (attempt counts from 1), doubling up to the cap."""
        return float(
            min(self.max_backoff_seconds, self.initial_backoff_seconds * 2 ** max(0, attempt - 1))
        )


class KueueConfig(_Section):
    """Muster's own Kueue admission check (path B); see :mod:`controller.kueue`."""

    enabled: bool = Field(
        default=False,
        description="Run Muster's own Kueue admission check (path B). Path A (Kueue's "
        "built-in provisioning check with a Muster class) needs nothing here.",
    )
    controller_name: str = Field(
        default="muster.dev/provisioning",
        min_length=1,
        max_length=253,
        description="AdmissionChecks with this spec.controllerName are Muster's.",
    )
    provisioning_class: str = Field(
        default="atomic-provisioning.muster.dev",
        min_length=1,
        description="Class of the ProvisioningRequests Muster creates when the "
        "AdmissionCheck names no ProvisioningRequestConfig.",
    )
    check_capacity_class: str = Field(
        default="check-capacity.muster.dev",
        min_length=1,
        description="Class used to book the nodes of a Workload Kueue TAS already placed.",
    )
    tolerate_pool_taints: bool = Field(
        default=True,
        description="A pod set whose nodeSelector (own plus flavor nodeLabels) selects a "
        "CapacityPool may use the pool's tainted nodes: its ProvisioningRequest templates "
        "tolerate the pool's taints and the Ready check adds those tolerations to the pods.",
    )
    backoff_limit_count: int = Field(
        default=3, ge=0,
        description="Path B retries of a failed request when the AdmissionCheck names no "
        "ProvisioningRequestConfig (as Kueue's retryStrategy).",
    )
    backoff_base_seconds: int = Field(
        default=60, ge=0, description="First retry delay of path B; doubles per retry."
    )
    backoff_max_seconds: int = Field(
        default=1800, ge=0, description="Cap of path B's retry delay."
    )


class PodGroupsConfig(_Section):
    """Native gangs: gang PodGroups provisioned as one; see :mod:`controller.podgroups`."""

    enabled: bool = Field(
        default=True,
        description="Provision gang PodGroups (scheduling.k8s.io/v1beta1) the scheduler "
        "cannot place, each as one gang. Off by itself, with a log line, on a cluster that "
        "does not serve the API.",
    )
    provisioning_class: str = Field(
        default="atomic-provisioning.muster.dev",
        min_length=1,
        description="Class of the ProvisioningRequest Muster creates for such a PodGroup.",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        description="Requests made for one PodGroup whose booking ended before the scheduler "
        "placed the group (e.g. other pods took the nodes); then Muster gives up, saying so "
        "in an Event on the PodGroup.",
    )


class AcquisitionConfig(_Section):
    node_ready_timeout_seconds: float = Field(
        default=900.0, gt=0, description="How long acquired nodes may take to become Ready."
    )
    queue_poll_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How often a queued-provisioning request asks the cloud's queue where "
        "its gang stands.",
    )
    idle_ttl_seconds: float = Field(
        default=300.0,
        ge=0,
        description="How long a gang's nodes stay after its last pod is gone before they "
        "are released together.",
    )
    orphan_grace_seconds: float = Field(
        default=60.0,
        ge=0,
        description="How long the collector waits before releasing nodes no request holds "
        "(an interrupted attempt, a request that is gone): the window in which a plan just "
        "persisted, or persisted by a previous leader, may not have reached its cache yet.",
    )
    collect_interval_seconds: float = Field(
        default=15.0,
        gt=0,
        description="How often the collector looks for orphaned and idle nodes.",
    )
    max_concurrent_reconciles: int = Field(
        default=256, ge=1, description="Requests reconciled at the same time."
    )
    announce_after_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Set Provisioned=False (Provisioning) when an acquisition (provider calls "
        "and the wait for Ready) is still running after this long; a faster one goes straight "
        "to Provisioned=True, one status write fewer per request.",
    )


class NamespaceLimits(_Section):
    """What the requests of one namespace may hold at once: new nodes Muster bought for
    them (planned, acquiring, booked, or still running after the booking ended)."""

    max_nodes: int | None = Field(
        default=None, ge=0, description="New nodes the namespace's requests may hold at once."
    )
    max_gpus: int | None = Field(
        default=None, ge=0,
        description="GPUs (allocatable `*/gpu` resources) of those nodes.",
    )
    max_cost_per_hour: float | None = Field(
        default=None, ge=0,
        description="Cost per hour of those nodes (the pools' pricePerNodeHour).",
    )

    @property
    def limited(self) -> bool:
        return (self.max_nodes is not None or self.max_gpus is not None
                or self.max_cost_per_hour is not None)


class PoolStatusConfig(_Section):
    interval_seconds: float = Field(
        default=10.0,
        gt=0,
        description="How often Muster recomputes every CapacityPool's status from its cache "
        "(never per node heartbeat); a pool's status is written only when it changed, at "
        "most once per interval.",
    )
    max_writes_per_second: float = Field(
        default=2.0,
        gt=0,
        description="Cap of CapacityPool status writes across all pools; changes beyond it "
        "wait for the next interval (oldest first). Worst case: min(pools / "
        "interval_seconds, this) writes per second.",
    )
    reservation_refresh_seconds: float = Field(
        default=60.0,
        ge=10,
        description="How often Muster reads the figures of the reservations a pool names "
        "(DescribeCapacityReservations, reservations.get) for the pool's status: at most "
        "one read per pool per this many seconds.",
    )


class BudgetsConfig(_Section):
    max_new_nodes_per_request: int | None = Field(
        default=None, ge=1, description="Refuse plans adding more nodes than this."
    )
    max_cost_per_hour_per_request: float | None = Field(
        default=None, gt=0, description="Refuse plans whose new nodes cost more per hour."
    )
    namespace_default: NamespaceLimits = Field(
        default_factory=NamespaceLimits,
        description="Limits of every namespace not listed in budgets.namespaces.",
    )
    namespaces: dict[str, NamespaceLimits] = Field(
        default_factory=dict,
        description="Limits per namespace by name (replacing namespace_default for it): "
        "max_nodes, max_gpus, max_cost_per_hour; unset means unlimited. A request that "
        "alone exceeds its namespace's limit fails OverBudget; one that fits the limit but "
        "not beside what the namespace already holds waits, as for a full pool "
        "(NamespaceLimitReached, retried with backoff). See docs/concepts/tenancy.md.",
    )

    def for_namespace(self, namespace: str) -> NamespaceLimits:
        return self.namespaces.get(namespace, self.namespace_default)


class FakeProviderConfig(_Section):
    acquire_latency_seconds: float = Field(
        default=0.0, ge=0, description="Simulated time one acquisition of the fake provider takes."
    )
    heartbeat_seconds: float = Field(
        default=10.0,
        ge=0,
        description="Lease renewal and Ready heartbeat period, like kwok's (the node "
        "lifecycle controller marks nodes NotReady after 40 s without one). 0: the provider "
        "never heartbeats, because kwok manages its nodes (they carry "
        "`kwok.x-k8s.io/node: fake`), as on the real-cluster test tier.",
    )
    default_stock: int | None = Field(
        default=None,
        ge=0,
        description="Nodes each domain can deliver; None: as many as the pool allows.",
    )


class ProvidersConfig(_Section):
    kind: FakeProviderConfig = Field(default_factory=FakeProviderConfig)
    settings: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Settings of other providers by name (aws, gcp), validated by the "
        "provider factory at start-up.",
    )


class ServerConfig(_Section):
    metrics_port: int = Field(
        default=8443, ge=0, le=65535, description="Port of the Prometheus text at /metrics."
    )
    metrics_secure: bool = Field(
        default=True,
        description="/metrics over HTTPS, only for a bearer token the API server authenticates "
        "(TokenReview) whose user may get /metrics (SubjectAccessReview; ClusterRole "
        "muster-metrics-reader), as controller-runtime's secure metrics. false: plain HTTP "
        "to anyone who reaches the port.",
    )
    metrics_cert_dir: str | None = Field(
        default=None, min_length=1,
        description="Directory with tls.crt and tls.key for /metrics (e.g. a cert-manager "
        "Secret); null: a self-signed certificate made at start-up.",
    )
    probe_port: int = Field(
        default=8080, ge=0, le=65535,
        description="Port of /healthz (liveness, JSON counters) and /readyz (readiness).",
    )
    metrics_address: str = Field(
        default="0.0.0.0",
        description="IP address /metrics listens on (0.0.0.0: every IPv4 interface, :: every "
        "interface, 127.0.0.1 this host only).",
    )
    probe_address: str = Field(
        default="0.0.0.0",
        description="IP address /healthz and /readyz listen on (the kubelet probes the pod's "
        "IP, so keep a wildcard in a pod).",
    )

    @field_validator("metrics_address", "probe_address")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"not an IP address: {value!r}") from None
        return value

    @property
    def shared_port(self) -> bool:
        """/metrics and the probes on one plain-HTTP listener (same port, not secure)."""
        return not self.metrics_secure and self.metrics_port == self.probe_port

    @model_validator(mode="after")
    def _secure_metrics_apart(self) -> ServerConfig:
        if self.metrics_secure and self.metrics_port == self.probe_port and self.probe_port:
            raise ValueError(
                "metrics_port and probe_port must differ while metrics_secure is on: "
                "/metrics is HTTPS, the kubelet probes plain HTTP")
        if self.shared_port and self.metrics_address != self.probe_address:
            raise ValueError(
                "metrics_port equals probe_port (one listener): metrics_address and "
                "probe_address must then be equal")
        return self


class LeaderElectionConfig(_Section):
    enabled: bool = Field(
        default=True,
        description="`muster run` acts only while it holds a coordination.k8s.io Lease, so "
        "several replicas can run and exactly one reconciles. Off only for a single replica "
        "that must start without a Lease (`muster demo` and the tests never use it).",
    )
    lease_name: str = Field(
        default="muster", min_length=1, max_length=253,
        description="Name of the Lease (the RBAC in config/rbac names it too).",
    )
    namespace: str | None = Field(
        default=None, min_length=1, max_length=63,
        description="Namespace of the Lease; null: the pod's own namespace (its "
        "service-account namespace file), else muster-system.",
    )
    lease_duration_seconds: int = Field(
        default=8, ge=1,
        description="How long standbys wait, after the record last changed, before taking "
        "over a Lease whose holder stopped renewing.",
    )
    renew_deadline_seconds: float = Field(
        default=6.0, gt=0,
        description="The leader gives up (stops reconciling and exits) when no renewal "
        "succeeded for this long; must be below lease_duration_seconds.",
    )
    retry_period_seconds: float = Field(
        default=1.0, gt=0,
        description="Between renewals of the leader and attempts of standbys (standbys add "
        "up to 1.2x jitter).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionConfig:
        # client-go's own checks: the leader must give up before a standby may take over,
        # and have at least one jittered retry before giving up.
        if not self.lease_duration_seconds > self.renew_deadline_seconds:
            raise ValueError(
                f"lease_duration_seconds ({self.lease_duration_seconds}) must be greater "
                f"than renew_deadline_seconds ({self.renew_deadline_seconds})"
            )
        if not self.renew_deadline_seconds > 1.2 * self.retry_period_seconds:
            raise ValueError(
                f"renew_deadline_seconds ({self.renew_deadline_seconds}) must be greater "
                f"than 1.2 x retry_period_seconds ({self.retry_period_seconds})"
            )
        return self


class MusterConfig(BaseSettings):
    """Everything an operator may set. See ``config/muster.yaml`` for a commented example."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    cluster_name: str = Field(
        default="muster", min_length=1, max_length=63,
        description="Name of this cluster in Muster's logs.",
    )
    classes: ClassesConfig = Field(default_factory=ClassesConfig)
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    booking: BookingConfig = Field(default_factory=BookingConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    acquisition: AcquisitionConfig = Field(default_factory=AcquisitionConfig)
    budgets: BudgetsConfig = Field(default_factory=BudgetsConfig)
    pool_status: PoolStatusConfig = Field(default_factory=PoolStatusConfig)
    providers: ProvidersConfig = Field(default_factory=ProvidersConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    kueue: KueueConfig = Field(default_factory=KueueConfig)
    podgroups: PodGroupsConfig = Field(default_factory=PodGroupsConfig)
    log_format: Literal["text", "json"] = Field(
        default="text", description="json: one JSON object per line, for log collectors."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Threshold of the controller's logs."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = _YAML_FILE.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)


_YAML_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "muster_config_yaml", default=None
)


def load_config(path: Path | None = None, **overrides: Any) -> MusterConfig:
    """Read the YAML file (optional) and ``MUSTER_*`` variables; raise :class:`ConfigError`.

    ``overrides`` are field values that win over both (the CLI flags of ``muster run``).
    """
    problems = _unknown_env_keys(os.environ)
    if path is not None:
        problems += _check_yaml(path)
    if problems:
        sep = " " if len(problems) == 1 else "\n  "
        raise ConfigError("invalid configuration:" + sep + "\n  ".join(problems))
    token = _YAML_FILE.set(path)
    try:
        return MusterConfig(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    finally:
        _YAML_FILE.reset(token)


REMOVED_SETTINGS = {
    "event_source": "removed setting: Muster watches ProvisioningRequests with its own "
    "list-then-watch loop, there is no kopf any more (docs/dependencies.md); delete it",
}
"""Top-level settings an older Muster took: a config that still has one is refused with what
became of it, not as an unknown setting."""

OTHER_ENV_PREFIXES = ("AWS_", "GCP_")
"""``MUSTER_<prefix>*`` variables read by someone else: the AWS and GCP providers' own settings
(``providers/aws.py``, ``providers/gcp.py``)."""

OTHER_ENV_NAMES = frozenset({
    "CLUSTER_STATE", "CLUSTER_PORT_BASE", "CLUSTER_CACHE", "CLUSTER_KCM_API_QPS",
    "CLUSTER_INSTALL", "KEEP_CLUSTER", "CACHE", "BENCH_SANDBOX_PREFIX", "CRASH_AT",
})
"""``MUSTER_<name>`` variables of the project's tooling (the real-cluster test tier of
``e2e/cluster.py`` and ``hack/cluster/``, the benchmarks, the crash harness's
``MUSTER_CRASH_AT`` of :mod:`controller.common.crashpoints`), which a test process that also
loads Muster's config sees."""


def _unknown_env_keys(env: Mapping[str, str]) -> list[str]:
    # pydantic-settings silently skips MUSTER_* variables that match no field; a typo there
    # would otherwise leave a default in force without anyone noticing.
    fields = {name.upper() for name in MusterConfig.model_fields}
    problems = []
    for key in env:
        if not key.startswith(ENV_PREFIX):
            continue
        rest = key[len(ENV_PREFIX) :]
        if rest in OTHER_ENV_NAMES or rest.startswith(OTHER_ENV_PREFIXES):
            continue
        top = rest.split("__", 1)[0]
        if top.lower() in REMOVED_SETTINGS:
            problems.append(f"{key}: {REMOVED_SETTINGS[top.lower()]}")
        elif top not in fields:
            problems.append(
                f"{key}: unknown setting (known: "
                + ", ".join(sorted(f"{ENV_PREFIX}{f}" for f in fields))
                + ")"
            )
    return problems


def _check_yaml(path: Path) -> list[str]:
    if not path.is_file():
        return [f"{path}: config file not found"]
    try:
        data = yaml.safe_load(path.read_text())
    except UnicodeDecodeError:
        return [f"{path}: not a text file (not UTF-8); expected YAML"]
    except OSError as exc:
        return [f"{path}: {exc.strerror or exc}"]
    except yaml.YAMLError as exc:
        return [f"{path}: not valid YAML: {' '.join(str(exc).split())}"]
    if data is not None and not isinstance(data, dict):
        return [f"{path}: must hold a mapping of settings, got {type(data).__name__}"]
    return []


def _describe(exc: ValidationError, path: Path | None) -> str:
    where = f" (file {path} and MUSTER_* variables)" if path else " (MUSTER_* variables)"
    lines = [f"invalid configuration{where}:"]
    errors = exc.errors()
    for err in errors:
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = REMOVED_SETTINGS.get(key, "unknown setting")
        lines.append(f"{key}: {msg} (got {err.get('input')!r})")
    return " ".join(lines) if len(errors) == 1 else "\n  ".join(lines)
