"""The ``podgroups`` section of Muster's config (native gangs, ``scheduling.k8s.io``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PodGroupsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

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
