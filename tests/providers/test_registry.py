"""A CapacityPool that names ``aws`` or ``gcp`` gets that provider, configured from Muster's
config (``providers.settings.<name>``) and tagged with Muster's cluster name; bad settings
are a configuration error that names the key, never a crash."""

from __future__ import annotations

from typing import Any

import pytest

from providers.aws import AwsProvider
from providers.base import ProviderConfigError
from providers.gcp import GcpProvider
from providers.registry import ProviderContext, create, names


def _ctx(settings: dict[str, Any], cluster: str | None = "prod-eu") -> ProviderContext:
    # The cloud factories never touch the Kubernetes client.
    return ProviderContext(kube=None, settings=settings, cluster_name=cluster)  # type: ignore[arg-type]


def test_every_provider_is_registered() -> None:
    assert {"aws", "gcp", "kind", "fake"} <= set(names())


@pytest.mark.parametrize(
    ("name", "cls", "settings"),
    [
        pytest.param("aws", AwsProvider, {"region": "us-east-2", "max_concurrency": 3}, id="aws"),
        pytest.param("gcp", GcpProvider, {"request_timeout_seconds": 5, "max_concurrency": 2},
                     id="gcp"),
    ],
)
def test_cloud_provider_gets_config_settings_and_cluster_name(
    name: str, cls: type, settings: dict[str, Any],
) -> None:
    provider = create(name, _ctx(settings))
    assert isinstance(provider, cls)
    got = provider.settings  # type: ignore[attr-defined]
    assert got.cluster_name == "prod-eu"
    for key, value in settings.items():
        assert getattr(got, key) == value


def test_explicit_cluster_name_in_provider_settings_wins() -> None:
    provider = create("aws", _ctx({"cluster_name": "other"}))
    assert provider.settings.cluster_name == "other"  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["aws", "gcp"])
def test_unknown_setting_names_the_key(name: str) -> None:
    with pytest.raises(ProviderConfigError, match=r"unknown .* setting.*'regoin'"):
        create(name, _ctx({"regoin": "x"}))


def test_bad_value_names_the_key() -> None:
    with pytest.raises(ProviderConfigError, match=r"providers\.settings\.aws\.max_concurrency"):
        create("aws", _ctx({"max_concurrency": 0}))


def test_unknown_provider_lists_the_known_ones() -> None:
    with pytest.raises(ProviderConfigError, match="known providers: aws, fake, gcp, kind"):
        create("azure", _ctx({}))
