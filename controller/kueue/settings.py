"""The ``kueue`` section of Muster's configuration (see :mod:`controller.config`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_CONTROLLER_NAME = "muster.dev/provisioning"
KUEUE_PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"


class KueueConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        default=False,
        description="Run Muster's own Kueue admission check (path B). Path A (Kueue's "
        "built-in provisioning check with a Muster class) needs nothing here.",
    )
    controller_name: str = Field(
        default=DEFAULT_CONTROLLER_NAME,
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
