"""The all-or-nothing skeleton every provider runs: adopt by key, launch, recount, compensate.

:class:`AtomicProvider` implements the :class:`~providers.base.Provider` Protocol once. A
provider (AWS, GCP, the fake one) subclasses it and supplies a narrow adapter to its cloud,
four methods over its own machine type ``M`` (an EC2 instance, a Compute VM, a Node):

* :meth:`~AtomicProvider.find`: the live machines of a pool, or of one acquisition key;
* :meth:`~AtomicProvider.launch`: ask the cloud for the machines a key still lacks, with an
  idempotency token derived from the key (so a repeated launch joins the first), and report
  every live machine under the key afterwards;
* :meth:`~AtomicProvider.delete`: delete every machine under a key plus whatever the key
  owns besides (a placement group or policy);
* :meth:`~AtomicProvider.to_nodes`: machines as :class:`~providers.base.ProvidedNode`.

``acquire`` is then, for every provider:

1. **adopt**: as many machines as asked already under the key (a retry after a crash or a
   timeout) are returned and nothing is launched (an adapter whose launch adopts by itself,
   :attr:`AtomicProvider.launch_adopts`, skips this look-up);
2. **launch** the rest;
3. **recount**: fewer (or more) live machines under the key than asked is a failure, with
   the cloud's own reason when it gave one, else :class:`CapacityUnavailable` saying how many
   it could give;
4. **compensate**: on any failure everything under the key is deleted before the error is
   raised, so a caller never holds part of a gang.

**Transient errors, one policy for every provider.** Throttling and 5xx are retried inside
the adapter's cloud calls with the same token, within a budget (:mod:`providers.retry`). An
error that outlives the budget (:class:`TransientProviderError`) ends the acquisition like
any other failure: compensate, then raise it, marked retryable. The controller never resumes
a failed key (it releases it and plans a new attempt under new keys), so keeping half a gang
for a retry would only hold capacity. A cloud operation still running when compensation ran
(a GCP bulkInsert that timed out) may create machines afterwards: they carry the abandoned
key, no request holds it, and the collector releases them after its grace period
(:mod:`controller.acquire.recovery`). A compensation that fails is logged and left to the
same collector.

One call per key runs at a time (acquire and release of one key never interleave); calls for
different keys run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from controller.api.capacitypool import CapacityPool
from controller.common.problem_log import ProblemLog
from providers.base import (
    AcquireRequest,
    CapacityUnavailable,
    ProvidedNode,
    ProviderConfigError,
    ProviderError,
)

log = logging.getLogger(__name__)
_problems = ProblemLog(log)

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Launch(Generic[M]):
    """What a launch left under its key."""

    machines: list[M]
    """Every live machine under the key after the launch (adopted ones included)."""
    error: ProviderError | None = None
    """The cloud's reason when it gave fewer machines than asked (a fleet's error codes)."""


class AtomicProvider(ABC, Generic[M]):
    """A :class:`~providers.base.Provider` built from a per-cloud adapter (the abstract
    methods). Safe to call concurrently."""

    name: str
    launch_adopts: bool = False
    """The adapter's launch itself finds what already exists under the key (the fake
    provider's node names are deterministic per key, and creating one again answers with the
    existing node), so the skeleton skips its own look-up: one listing fewer per
    acquisition."""

    def __init__(self) -> None:
        self._key_locks: dict[str, asyncio.Lock] = {}

    # ------------------------------------------------------------------ the adapter

    @abstractmethod
    async def validate(self, pool: CapacityPool) -> None:
        """Check ``spec.parameters``; :class:`ProviderConfigError` naming the field."""

    @abstractmethod
    async def find(self, pool: CapacityPool, key: str | None) -> list[M]:
        """The pool's live machines, only those under ``key`` unless it is None."""

    @abstractmethod
    async def launch(self, request: AcquireRequest, have: Sequence[M]) -> Launch[M]:
        """Ask for ``request.count`` machines under ``request.key``, ``have`` of them
        already there; raise a :class:`ProviderError` when the cloud refuses the call."""

    @abstractmethod
    async def delete(self, pool: CapacityPool, key: str, known: Sequence[M]) -> int:
        """Delete every machine under ``key`` (those found by key and ``known``, which a
        launch just reported and a listing may not show yet) and what else the key owns;
        return how many machines were deleted."""

    @abstractmethod
    async def to_nodes(
        self, pool: CapacityPool, machines: Sequence[M], request: AcquireRequest | None
    ) -> list[ProvidedNode]:
        """``machines`` as nodes; ``request`` is None when listing the pool."""

    def check(self, request: AcquireRequest) -> None:
        """Refuse, before any cloud call, a request the pool cannot serve (a domain in a
        zone the pool has no subnet in): :class:`ProviderConfigError`."""

    def guard(self, request: AcquireRequest) -> contextlib.AbstractAsyncContextManager[object]:
        """Held from the launch to the end of a compensation: the fake provider counts its
        stock per domain and must not count a shortfall's machines that are about to go."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ Provider

    async def acquire(self, request: AcquireRequest) -> list[ProvidedNode]:
        """Exactly ``request.count`` nodes under ``request.key``, or none and an error."""
        if request.count < 1:
            raise ProviderConfigError(f"acquire {request.key}: count must be >= 1")
        self.check(request)
        pool = request.pool
        async with self._locked(request.key):
            have = [] if self.launch_adopts else await self.find(pool, request.key)
            if have and len(have) == request.count:
                log.info("acquire %s: %d machines already exist, adopting", request.key,
                         len(have))
                try:
                    return await self.to_nodes(pool, have, request)
                except ProviderError:
                    await self._compensate(request, have)
                    raise
            async with self.guard(request):
                known: Sequence[M] = have
                try:
                    if len(have) > request.count:
                        raise ProviderError(
                            f"acquire {request.key}: {len(have)} machines under the key, more "
                            f"than the {request.count} asked; all were deleted"
                        )
                    launched = await self.launch(request, have)
                    known = launched.machines
                    got = len(launched.machines)
                    if launched.error is not None:
                        raise launched.error
                    if got != request.count:
                        raise CapacityUnavailable(
                            f"acquire {request.key}: only {got} of {request.count} machines "
                            "are live under the key after the launch; all were deleted",
                            available=min(got, request.count),
                        )
                    return await self.to_nodes(pool, launched.machines, request)
                except ProviderError:
                    await self._compensate(request, known)
                    raise

    async def release(self, pool: CapacityPool, key: str) -> int:
        async with self._locked(key):
            return await self.delete(pool, key, ())

    async def list(self, pool: CapacityPool) -> list[ProvidedNode]:
        return await self.to_nodes(pool, await self.find(pool, None), None)

    async def start(self) -> None:
        """Nothing runs in the background by default."""

    async def stop(self) -> None:
        """Nothing runs in the background by default."""

    # ------------------------------------------------------------------ internals

    async def _compensate(self, request: AcquireRequest, known: Sequence[M]) -> None:
        try:
            deleted = await self.delete(request.pool, request.key, known)
        except ProviderError as exc:
            # The original failure matters more; the collector releases the rest later.
            log.error("acquire %s failed and its compensation is incomplete (the collector "
                      "releases the rest): %s", request.key, exc)
            return
        if deleted:
            # Once per pool per interval: a pool failing every try (a provider storm) would
            # say it per try; each try's rollback is a release decision line anyway.
            _problems.warning(f"compensate {request.pool.metadata.name}",
                              "acquire %s failed: deleted the %d machine(s) launched under it",
                              request.key, deleted)

    @contextlib.asynccontextmanager
    async def _locked(self, key: str) -> AsyncIterator[None]:
        """One call per key at a time; the lock goes once nobody holds or waits for it (a
        lock kept per key ever used would grow with every request)."""
        lock = self._key_locks.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and self._key_locks.get(key) is lock:
                del self._key_locks[key]
