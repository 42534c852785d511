"""What the cloud providers share besides retries: the base of their pool-parameter models,
turning a pool's invalid parameters into one readable :class:`ProviderConfigError`, and the
process-wide settings every blocking-SDK provider has (concurrency bound and retry budget).

Each provider keeps its own SDK-specific parts (error codes, request building); only logic
that is the same for every provider lives here, so a fix to it reaches all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import BaseSettings

from controller.api.capacitypool import CapacityPool
from providers.base import ProviderConfigError, ProviderError
from providers.retry import CloudCalls, RetryPolicy

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""The well-known label every cloud node carries (kubelet sets it from the machine type)."""


@dataclass(frozen=True)
class ReservationFigures:
    """One reservation (or block of one) as the cloud counts it: reserved = used + free;
    ``start``/``end`` bound when it can be used (a Capacity Block), None when unbounded."""

    id: str
    zone: str
    reserved: int
    free: int
    state: str
    start: datetime | None = None
    end: datetime | None = None

    @property
    def used(self) -> int:
        return self.reserved - self.free


class PoolParameters(BaseModel):
    """Base of a provider's ``spec.parameters`` models: camelCase aliases, unknown keys
    rejected (a typo must not silently fall back to a default), immutable."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


ParamsT = TypeVar("ParamsT", bound=PoolParameters)
K = TypeVar("K")


def parse_pool_parameters(model: type[ParamsT], pool: CapacityPool) -> ParamsT:
    """The pool's parameters as ``model``, or :class:`ProviderConfigError` naming every bad
    field as ``spec.parameters.<path>`` so the user can find it in the manifest."""
    try:
        return model.model_validate(pool.spec.parameters)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "parameters"
            problems.append(f"spec.parameters.{where}: {error['msg']}")
        raise ProviderConfigError(
            f"CapacityPool {pool.metadata.name}: " + "; ".join(problems)
        ) from exc


class CloudProviderSettings(BaseSettings):
    """Settings every blocking-SDK provider has; subclasses set ``env_prefix``."""

    max_concurrency: int = Field(default=8, ge=1)
    retry_attempts: int = Field(default=6, ge=1)
    retry_initial_backoff: float = Field(default=0.5, ge=0)
    retry_max_backoff: float = Field(default=20.0, ge=0)
    retry_deadline_seconds: float = Field(default=120.0, ge=0)

    def calls(
        self,
        *,
        is_transient: Callable[[BaseException], bool],
        map_error: Callable[[BaseException, str], ProviderError],
        expected: Callable[[BaseException, Collection[K]], object | None],
    ) -> CloudCalls[K]:
        """The provider's one way to call its SDK, bounded and retried per these settings
        with the SDK's own error rules."""
        return CloudCalls(max_concurrency=self.max_concurrency, policy=self.retry_policy(),
                          is_transient=is_transient, map_error=map_error, expected=expected)

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            attempts=self.retry_attempts,
            initial_backoff=self.retry_initial_backoff,
            max_backoff=self.retry_max_backoff,
            deadline_seconds=self.retry_deadline_seconds,
        )
