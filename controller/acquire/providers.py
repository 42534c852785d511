"""Which provider serves a CapacityPool: ``spec.provider`` resolved once per name.

Instances come from :mod:`providers.registry`, or are injected (the demo and the tests hand
in their own :class:`providers.kind.KindProvider` to inspect its calls).
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.api.capacitypool import CapacityPool
from providers.base import Provider
from providers.registry import ProviderContext, create


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

    def for_pool(self, pool: CapacityPool) -> Provider:
        return self.get(pool.spec.provider)

    def get(self, name: str) -> Provider:
        provider = self._instances.get(name)
        if provider is None:
            ctx = ProviderContext(
                kube=self._context.kube,
                settings=dict(self._settings.get(name, {})),
                now=self._context.now,
            )
            provider = create(name, ctx)
            self._instances[name] = provider
        return provider

    def instances(self) -> Mapping[str, Provider]:
        return self._instances
