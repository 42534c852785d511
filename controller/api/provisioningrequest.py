"""ProvisioningRequest ``autoscaling.x-k8s.io/v1`` (kubernetes/autoscaler types.go).

Limits mirror the upstream CRD: 1..32 pod sets, count >= 1, ``parameters`` at most 100
entries of at most 255 characters, ``provisioningClassDetails`` at most 64 entries of at
most 32768 characters. Unknown fields on the object are kept so a status write-back never
drops what another controller added.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from controller.api.meta import Condition, ObjectMeta

GROUP = "autoscaling.x-k8s.io"
VERSION = "v1"
PLURAL = "provisioningrequests"
KIND = "ProvisioningRequest"

CLASS_CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
CLASS_BEST_EFFORT_ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

MAX_POD_SETS = 32
MAX_PARAMETERS = 100
MAX_PARAMETER_LENGTH = 255
MAX_DETAILS = 64
MAX_DETAIL_LENGTH = 32768


class _Closed(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class PodTemplateRef(_Closed):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)


class PodSet(_Closed):
    pod_template_ref: PodTemplateRef = Field(alias="podTemplateRef")
    count: int = Field(ge=1, le=2**31 - 1)


class ProvisioningRequestSpec(_Closed):
    pod_sets: list[PodSet] = Field(alias="podSets", min_length=1, max_length=MAX_POD_SETS)
    provisioning_class_name: str = Field(
        alias="provisioningClassName", min_length=1, max_length=253, pattern=DNS_SUBDOMAIN
    )
    parameters: dict[str, str] = Field(default_factory=dict, max_length=MAX_PARAMETERS)

    @field_validator("parameters")
    @classmethod
    def _parameter_lengths(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if len(text) > MAX_PARAMETER_LENGTH:
                raise ValueError(
                    f"parameter {key} is {len(text)} characters long "
                    f"(at most {MAX_PARAMETER_LENGTH})"
                )
        return value


class ProvisioningRequestStatus(_Closed):
    conditions: list[Condition] = Field(default_factory=list)
    provisioning_class_details: dict[str, str] = Field(
        default_factory=dict, alias="provisioningClassDetails", max_length=MAX_DETAILS
    )

    @field_validator("provisioning_class_details")
    @classmethod
    def _detail_lengths(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if len(text) > MAX_DETAIL_LENGTH:
                raise ValueError(f"provisioningClassDetails.{key} exceeds {MAX_DETAIL_LENGTH}")
        return value

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class ProvisioningRequest(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")

    api_version: Literal["autoscaling.x-k8s.io/v1"] = Field(
        default="autoscaling.x-k8s.io/v1", alias="apiVersion"
    )
    kind: Literal["ProvisioningRequest"] = "ProvisioningRequest"
    metadata: ObjectMeta
    spec: ProvisioningRequestSpec
    status: ProvisioningRequestStatus = Field(default_factory=ProvisioningRequestStatus)
