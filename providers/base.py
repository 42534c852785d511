"""The provider interface: acquire N nodes all or nothing, release, list, start, stop.

Every provider (fake, AWS, GCP) implements :class:`Provider` through one skeleton,
:class:`providers.atomic.AtomicProvider`: a provider either returns exactly ``count`` nodes
or raises after deleting whatever it launched. The controller derives each acquisition's key
(:func:`controller.acquire.keys.acquisition_key`, deterministic per request uid, attempt and
group) and persists it before the call, so a controller that crashes after the cloud call
acquires again with the same key and gets the same nodes back, and its collector finds what
an abandoned key left with :meth:`Provider.list`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from controller.api.capacitypool import CapacityPool
from controller.common.topology_defaults import placeholder


@dataclass(frozen=True, slots=True)
class AcquireRequest:
    key: str
    """Idempotency key, <= 63 characters, deterministic per gang attempt, pool and domain."""
    pool: CapacityPool
    count: int
    domain: Mapping[str, str]
    """Topology labels every new node must carry (the domain the fit engine chose). A
    placeholder value (``muster-new-...``, a pool without declared domains) says only that
    the machines share one domain of the level: where is the cloud's choice (see
    :attr:`chosen`), and the value they register with is the one Muster publishes."""
    owner: str
    """``<namespace>/<name>`` of the ProvisioningRequest, recorded in tags for recovery."""
    owner_uid: str = ""

    @property
    def chosen(self) -> dict[str, str]:
        """The domain labels the plan fixed: :attr:`domain` without placeholders. A
        provider places by these (a zone here is a zone; a zone not here is any of the
        pool's)."""
        return {k: v for k, v in self.domain.items() if not placeholder(v)}


@dataclass(frozen=True, slots=True)
class ProvidedNode:
    name: str
    """The Kubernetes Node name the instance registers as."""
    provider_id: str
    """``spec.providerID``: ``aws:///<zone>/<id>``, ``gce://<project>/<zone>/<name>``, ``kind://...``."""
    pool: str
    key: str
    owner: str = ""
    owner_uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


QUEUED = "queued"
GRANTED = "granted"
ENDED = "ended"


@dataclass(frozen=True, slots=True)
class QueuedStatus:
    """A gang's place in a cloud's queue, as the cloud reports it."""

    name: str
    """The cloud's name of the queued request (a resize request, an offering)."""
    state: str
    """The cloud's own word for it (GCP: ACCEPTED, CREATING, SUCCEEDED, FAILED, CANCELLED)."""
    outcome: str = QUEUED
    """What it means to Muster: :data:`QUEUED` (waiting), :data:`GRANTED` (the nodes exist
    under the key; ``acquire`` adopts them) or :data:`ENDED` (failed or cancelled: nothing
    will come of it)."""
    since: str = ""
    """When it joined the queue (RFC 3339, the cloud's clock)."""
    estimate: str = ""
    """When the cloud expects to grant it, where it says (RFC 3339), else empty."""
    error: str = ""
    ends: str = ""
    """When the cloud takes granted machines back whatever Muster does (RFC 3339: an AWS
    Capacity Block's end less the 30 minutes EC2 takes to terminate its instances), where
    the cloud fixes it in advance, else empty. Muster ends the run by then itself, so the
    booking says why the nodes go."""


class ProviderError(Exception):
    """Base of every provider failure. ``retryable`` tells the controller whether to back off
    and try again (possibly elsewhere) or to give up on this pool."""

    retryable: bool = True
    reason: str = "ProviderError"


class CapacityUnavailable(ProviderError):
    """Not enough stock in the domain right now (InsufficientInstanceCapacity,
    ZONE_RESOURCE_POOL_EXHAUSTED). Another domain or pool, or later, may work."""

    reason = "CapacityUnavailable"

    def __init__(self, message: str, *, available: int | None = None) -> None:
        super().__init__(message)
        self.available = available


class QuotaExceeded(ProviderError):
    """Account limits (InstanceLimitExceeded, VcpuLimitExceeded, QUOTA_EXCEEDED)."""

    retryable = False
    reason = "QuotaExceeded"


class ProviderConfigError(ProviderError):
    """The pool's parameters are wrong; surfaced as a condition on the CapacityPool."""

    retryable = False
    reason = "InvalidPoolParameters"


class TransientProviderError(ProviderError):
    """Throttling or a 5xx that outlived the provider's own retries."""

    reason = "ProviderUnavailable"


@runtime_checkable
class Provider(Protocol):
    """One small async interface; implementations must be safe to call concurrently."""

    name: str

    async def validate(self, pool: CapacityPool) -> None:
        """Check the pool's ``spec.parameters``; raise :class:`ProviderConfigError` naming the
        field. No cloud calls that create anything."""

    async def acquire(self, request: AcquireRequest) -> list[ProvidedNode]:
        """Create exactly ``request.count`` nodes in ``request.domain`` or none.

        Idempotent: calling again with the same key returns the same nodes and creates
        nothing new. On a shortfall everything launched under the key is released before
        :class:`CapacityUnavailable` (or another :class:`ProviderError`) is raised.
        """

    async def release(self, pool: CapacityPool, key: str) -> int:
        """Delete every node acquired under ``key``; return how many were deleted.
        Idempotent: releasing an unknown or already released key returns 0."""

    async def list(self, pool: CapacityPool) -> list[ProvidedNode]:
        """Every node this provider holds for ``pool`` (found by tags/labels), so that a
        restarted controller can adopt or release what an interrupted attempt launched."""

    async def start(self) -> None:
        """Begin background work, once the controller's caches have synced and before its
        first acquire (the fake provider adopts its nodes and heartbeats them); a provider
        first needed later is started when first used. Cloud providers have none."""

    async def stop(self) -> None:
        """End what :meth:`start` began; called when the controller stops."""


@runtime_checkable
class CapacityQueue(Protocol):
    """A provider whose cloud can queue a gang instead of refusing it on a stock-out (GCP
    flex-start, the fake cloud's queue): the ``queued-provisioning.muster.dev`` class asks
    through it. The request is all or nothing; once :data:`GRANTED`, :meth:`Provider.acquire`
    with the same key adopts the nodes and :meth:`Provider.release` deletes them."""

    def queues(self, pool: CapacityPool) -> bool:
        """Whether ``pool``'s parameters name a queue (else Muster queues on its own)."""

    async def enqueue(self, request: AcquireRequest, run_seconds: int | None, *,
                      ready_within: float) -> QueuedStatus:
        """Queue ``request.count`` nodes under ``request.key`` to run ``run_seconds`` once
        Ready (None: the cloud's longest); idempotent per key. ``ready_within`` is how long
        the machines may take from their creation to Ready (the registration budget): Muster
        counts the run from Provisioned, so a cloud whose run clock starts when it creates
        the machines is asked for that much more, and Muster's own end of the run comes
        first."""

    async def queued(self, pool: CapacityPool, key: str) -> QueuedStatus | None:
        """The key's queued request, or None when there is none."""

    async def cancel_queued(self, pool: CapacityPool, key: str) -> str | None:
        """Take the key's request out of the queue; what the cloud did, in a sentence the
        request's condition quotes (a cloud that cannot cancel says what stays), or None
        when there was none."""
