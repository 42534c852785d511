"""Provider name -> factory, so CapacityPools name their provider by string.

A factory gets a :class:`ProviderContext` (the Kubernetes client, the provider's settings
from Muster's config, the clock) and returns a ready :class:`providers.base.Provider`.
The kind provider is registered here; cloud providers register themselves with
:func:`register` from their own module (see the REGISTRATION POINT below), so this module
never imports a cloud SDK.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controller.kube import KubeClient
from providers.base import Provider, ProviderConfigError


@dataclass(frozen=True, slots=True)
class ProviderContext:
    kube: KubeClient
    settings: Mapping[str, Any] = field(default_factory=dict)
    """This provider's section of Muster's config (``providers.<name>``)."""
    now: Callable[[], datetime] | None = None


Factory = Callable[[ProviderContext], Provider]

_FACTORIES: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> None:
    """Make ``name`` usable in ``CapacityPool.spec.provider``. Re-registering replaces."""
    _FACTORIES[name] = factory


def names() -> list[str]:
    return sorted(_FACTORIES)


def create(name: str, context: ProviderContext) -> Provider:
    """Build provider ``name``; :class:`ProviderConfigError` names the known ones."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ProviderConfigError(
            f"unknown provider {name!r}; known providers: {', '.join(names())}"
        ) from None
    return factory(context)


def _kind(context: ProviderContext) -> Provider:
    from providers.kind import KindProvider

    allowed = {"acquire_latency_seconds", "heartbeat_seconds", "default_stock"}
    unknown = set(context.settings) - allowed
    if unknown:
        raise ProviderConfigError(f"unknown kind provider setting(s): {sorted(unknown)}")
    return KindProvider(context.kube, now=context.now, **dict(context.settings))


register("kind", _kind)
# "fake" is the name the CapacityPool docs use for the same provider.
register("fake", _kind)

# REGISTRATION POINT for cloud providers: add
#   register("aws", _aws)   # providers.aws.AwsProvider
#   register("gcp", _gcp)   # providers.gcp.GcpProvider
# with factories that import their SDK lazily, like _kind above.
