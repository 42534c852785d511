"""Which provider serves a CapacityPool: ``spec.provider`` resolved once per name.

Instances come from :mod:`providers.registry`, or are injected (the demo and the tests hand
in their own :class:`providers.kind.KindProvider` to inspect its calls).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from controller.api.capacitypool import CapacityPool
from providers.base import Provider
from providers.registry import ProviderContext, create

log = logging.getLogger(__name__)


class ProviderSet:
    def __init__(
        self,
        context: ProviderContext,
        *,
        settings: Mapping[str, Mapping[str, object]] | None = None,
        instances: Mapping[str, Provider] | None = None,
    ) -> None:
        self._context = context
        self._settings = dict(settings or {})
        self._instances: dict[str, Provider] = dict(instances or {})
        self.running = False
        """Set by the controller once it has started the providers that existed then."""
        self._starting: set[asyncio.Task[None]] = set()

    def for_pool(self, pool: CapacityPool) -> Provider:
        return self.get(pool.spec.provider)

    def get(self, name: str) -> Provider:
        provider = self._instances.get(name)
        if provider is None:
            ctx = ProviderContext(
                kube=self._context.kube,
                settings=dict(self._settings.get(name, {})),
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
        # started too, or the kind provider's heartbeat never renews its nodes' Leases and the
        # node lifecycle controller marks them NotReady.
        start = getattr(provider, "start", None)
        if start is None:
            return

        async def run() -> None:
            try:
                await start()
            except Exception:
                log.exception("provider %s failed to start", name)

        task = asyncio.get_running_loop().create_task(run(), name=f"start-provider-{name}")
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def instances(self) -> Mapping[str, Provider]:
        return self._instances
