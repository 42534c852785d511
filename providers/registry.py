"""Provider name -> factory, so CapacityPools name their provider by string.

A factory gets a :class:`ProviderContext` (the Kubernetes client, the provider's settings
from Muster's config, the clock) and returns a ready :class:`providers.base.Provider`.
Every provider is registered here; factories import their SDK lazily, so a cluster that
uses only the fake provider never loads boto3 or google-cloud-compute. The fake provider
(:mod:`providers.fake`) is registered as ``kind``, the name pools have always used, with
``fake`` as an alias: :func:`canonical` maps both to one name, so one instance serves both.
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
    cluster_name: str | None = None
    """Muster's ``cluster_name``: cloud providers tag what they create with it, and find
    only those resources again on recovery."""


Factory = Callable[[ProviderContext], Provider]

_FACTORIES: dict[str, Factory] = {}
_ALIASES: dict[str, str] = {}


def register(name: str, factory: Factory) -> None:
    """Make ``name`` usable in ``CapacityPool.spec.provider``. Re-registering replaces."""
    _FACTORIES[name] = factory


def alias(name: str, of: str) -> None:
    """Make ``name`` another name of the registered provider ``of``."""
    _ALIASES[name] = of


def canonical(name: str) -> str:
    """The registered name ``name`` stands for (itself unless it is an alias)."""
    return _ALIASES.get(name, name)


def names() -> list[str]:
    return sorted({*_FACTORIES, *_ALIASES})


def create(name: str, context: ProviderContext) -> Provider:
    """Build provider ``name``; :class:`ProviderConfigError` names the known ones."""
    try:
        factory = _FACTORIES[canonical(name)]
    except KeyError:
        raise ProviderConfigError(
            f"unknown provider {name!r}; known providers: {', '.join(names())}"
        ) from None
    return factory(context)


def _fake(context: ProviderContext) -> Provider:
    from providers.fake import FakeProvider

    allowed = {"acquire_latency_seconds", "heartbeat_seconds", "default_stock"}
    unknown = set(context.settings) - allowed
    if unknown:
        raise ProviderConfigError(f"unknown fake provider setting(s): {sorted(unknown)}")
    return FakeProvider(context.kube, now=context.now, **dict(context.settings))


register("kind", _fake)
alias("fake", "kind")


def _cloud_settings(name: str, model: Any, context: ProviderContext) -> Any:
    """``providers.settings.<name>`` from Muster's config, over ``MUSTER_<NAME>_*`` from the
    environment. Unknown keys and bad values are a configuration error naming the key."""
    from pydantic import ValidationError

    values = dict(context.settings)
    unknown = sorted(set(values) - set(model.model_fields))
    if unknown:
        raise ProviderConfigError(
            f"unknown {name} provider setting(s) {unknown}; known: {sorted(model.model_fields)}"
        )
    if context.cluster_name and "cluster_name" not in values:
        values["cluster_name"] = context.cluster_name
    try:
        return model(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProviderConfigError(f"providers.settings.{name}.{where}: {first['msg']}") from None


def _aws(context: ProviderContext) -> Provider:
    # boto3 is imported only when a pool names this provider.
    from providers.aws import AwsProviderSettings, make_aws_provider

    return make_aws_provider(_cloud_settings("aws", AwsProviderSettings, context))


def _gcp(context: ProviderContext) -> Provider:
    from providers.gcp import GcpProviderSettings, make_gcp_provider

    return make_gcp_provider(_cloud_settings("gcp", GcpProviderSettings, context))


register("aws", _aws)
register("gcp", _gcp)
