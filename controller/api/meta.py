"""Object metadata and conditions shared by every API model (metav1 subsets)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ObjectMeta(BaseModel):
    """The subset of metav1.ObjectMeta Muster reads; unknown fields are kept, not lost."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = Field(default=None, alias="resourceVersion")
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    deletion_timestamp: str | None = Field(default=None, alias="deletionTimestamp")
    finalizers: list[str] = Field(default_factory=list)
    creation_timestamp: str | None = Field(default=None, alias="creationTimestamp")


class Condition(BaseModel):
    """metav1.Condition."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = Field(default=None, alias="lastTransitionTime")
    observed_generation: int | None = Field(default=None, alias="observedGeneration")
