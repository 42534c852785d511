"""Factories the registry uses: settings from the environment, SDK retries disabled in
favour of ours, and every GCP client pointed at the configured endpoint."""

from __future__ import annotations

import pytest
from google.auth.credentials import AnonymousCredentials

from providers.aws import AwsProvider, make_aws_provider
from providers.gcp import GcpClients, GcpProvider, make_gcp_provider


def test_aws_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_AWS_REGION", "eu-west-1")
    monkeypatch.setenv("MUSTER_AWS_CLUSTER_NAME", "prod-a")
    monkeypatch.setenv("MUSTER_AWS_MAX_CONCURRENCY", "3")
    provider = make_aws_provider()
    assert isinstance(provider, AwsProvider) and provider.name == "aws"
    assert provider.settings.region == "eu-west-1"
    assert provider.settings.cluster_name == "prod-a"
    assert provider.settings.max_concurrency == 3


def test_default_boto3_client_leaves_retries_to_muster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    provider = make_aws_provider()
    client = provider._factory("us-west-2")  # building a client makes no request
    assert client.meta.region_name == "us-west-2"
    assert client.meta.config.retries["total_max_attempts"] == 1


def test_gcp_clients_share_endpoint_credentials_and_transport() -> None:
    clients = GcpClients.create(
        api_endpoint="http://127.0.0.1:9", credentials=AnonymousCredentials()
    )
    for client in (clients.instances, clients.zone_operations, clients.resource_policies,
                   clients.region_operations):
        assert client.api_endpoint == "http://127.0.0.1:9"
        assert client._transport.kind == "rest"


def test_gcp_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_GCP_API_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("MUSTER_GCP_OPERATION_TIMEOUT_SECONDS", "60")
    provider = make_gcp_provider()
    assert isinstance(provider, GcpProvider) and provider.name == "gcp"
    assert provider.settings.api_endpoint == "http://127.0.0.1:9"
    assert provider.settings.operation_timeout_seconds == 60
