"""Which provider serves a CapacityPool: ``spec.provider`` resolved once per name.

Instances come from :mod:`providers.registry`, or are injected (the demo and the tests hand
in their own :class:`providers.fake.FakeProvider` to inspect its calls; a pool may name it
``kind`` or ``fake``, one instance serves both).
:meth:`ProviderSet.for_pool` hands out the provider behind :class:`MeteredProvider`, which
counts acquire and release calls by pool and result (with metrics), the nodes they moved,
and remembers each pool's last answer (:attr:`ProviderSet.health`, the pool's
``ProviderReady`` condition).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from controller.api.capacitypool import CapacityPool
from controller.common.metrics import ControllerMetrics
from controller.runtime.problems import ProblemLog, retrying
from controller.state.pool_figures import ProviderHealth
from providers.base import (
    AcquireRequest,
    CapacityUnavailable,
    ProvidedNode,
    Provider,
    ProviderConfigError,
)
from providers.common import ReservationFigures
from providers.registry import ProviderContext, canonical, create

log = logging.getLogger(__name__)
_problems = ProblemLog(log)


class ProviderSet:
    def __init__(
        self,
        context: ProviderContext,
        *,
        settings: Mapping[str, Mapping[str, object]] | None = None,
        instances: Mapping[str, Provider] | None = None,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self._context = context
        self._metrics = metrics
        self._settings = dict(settings or {})
        self._instances: dict[str, Provider] = dict(instances or {})
        self.running = False
        """Set by the controller once it has started the providers that existed then."""
        self._starting: set[asyncio.Task[None]] = set()
        self.health: dict[str, ProviderHealth] = {}
        """Pool name -> its provider's last answer (kept until the pool is forgotten)."""

    def for_pool(self, pool: CapacityPool) -> Provider:
        try:
            provider = self.get(pool.spec.provider)
        except ProviderConfigError as exc:
            self.health[pool.metadata.name] = ProviderHealth(
                pool.spec.provider, "create", str(exc), exc.reason)
            raise
        return MeteredProvider(provider, self._metrics, self.health)

    def forget(self, pools: set[str]) -> None:
        """Drop the health of pools not in ``pools`` (deleted ones)."""
        for name in [n for n in self.health if n not in pools]:
            del self.health[name]

    def get(self, name: str) -> Provider:
        given, name = name, canonical(name)
        provider = self._instances.get(name)
        if provider is None:
            ctx = ProviderContext(
                kube=self._context.kube,
                settings=dict(self._settings.get(name) or self._settings.get(given) or {}),
                now=self._context.now,
                cluster_name=self._context.cluster_name,
            )
            provider = create(name, ctx)
            self._instances[name] = provider
            if self.running:
                self._start_later(name, provider)
        return provider

    def _start_later(self, name: str, provider: Provider) -> None:
        # A provider first needed while Muster runs (a pool created after start-up) must be
        # started too, or the fake provider's heartbeat never renews its nodes' Leases and the
        # node lifecycle controller marks them NotReady.
        async def run() -> None:
            try:
                await retrying(provider.start, f"starting provider {name}", _problems)
            except Exception:
                log.exception("provider %s failed to start", name)

        task = asyncio.get_running_loop().create_task(run(), name=f"start-provider-{name}")
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def instances(self) -> Mapping[str, Provider]:
        return self._instances


class MeteredProvider:
    """A provider whose acquire and release calls are counted by pool and result (the
    provider error's ``reason``, or the exception's type for anything else), and whose
    every answer is remembered per pool in ``health``."""

    def __init__(
        self, inner: Provider, metrics: ControllerMetrics | None,
        health: dict[str, ProviderHealth] | None = None,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self._metrics = metrics
        self._health = health if health is not None else {}

    def _answered(self, pool: str, call: str, exc: BaseException | None = None) -> None:
        # A stock-out is an answer: the provider is reachable, it only has no nodes there.
        if exc is None or isinstance(exc, CapacityUnavailable):
            self._health[pool] = ProviderHealth(self.name, call)
        elif isinstance(exc, Exception):
            self._health[pool] = ProviderHealth(self.name, call, str(exc) or type(exc).__name__,
                                                _result(exc))

    async def validate(self, pool: CapacityPool) -> None:
        await self.inner.validate(pool)

    async def acquire(self, request: AcquireRequest) -> list[ProvidedNode]:
        pool = request.pool.metadata.name
        try:
            nodes = await self.inner.acquire(request)
        except Exception as exc:
            self._answered(pool, "acquire", exc)
            if self._metrics is not None:
                self._metrics.provider_acquisitions.labels(pool, _result(exc)).inc()
            raise
        self._answered(pool, "acquire")
        if self._metrics is not None:
            self._metrics.provider_acquisitions.labels(pool, "success").inc()
            self._metrics.nodes_acquired.labels(pool).inc(len(nodes))
        return nodes

    async def release(self, pool: CapacityPool, key: str) -> int:
        name = pool.metadata.name
        try:
            released = await self.inner.release(pool, key)
        except Exception as exc:
            self._answered(name, "release", exc)
            if self._metrics is not None:
                self._metrics.provider_releases.labels(name, _result(exc)).inc()
            raise
        self._answered(name, "release")
        if self._metrics is not None:
            self._metrics.provider_releases.labels(name, "success").inc()
            self._metrics.nodes_released.labels(name).inc(released)
        return released

    async def list(self, pool: CapacityPool) -> list[ProvidedNode]:
        try:
            found = await self.inner.list(pool)
        except Exception as exc:
            self._answered(pool.metadata.name, "list", exc)
            raise
        self._answered(pool.metadata.name, "list")
        return found

    async def reservations(self, pool: CapacityPool) -> tuple[ReservationFigures, ...]:
        """The named reservations' figures, for providers that have them (else none)."""
        read = getattr(self.inner, "reservations", None)
        if read is None:
            return ()
        return tuple(await read(pool))

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()


def _result(exc: BaseException) -> str:
    # Provider errors carry a fixed reason; other exceptions are bugs or transport errors,
    # and their type names keep the label's cardinality small.
    return str(getattr(exc, "reason", None) or type(exc).__name__)
