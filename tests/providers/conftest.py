"""Fixtures shared by the provider tests: pools, a moto EC2 with Fleet semantics, and the
local Compute REST fake. No network other than 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from google.auth.credentials import AnonymousCredentials
from moto import mock_aws

from controller.api.capacitypool import CapacityPool
from providers.aws import AwsProvider, AwsProviderSettings
from providers.gcp import GcpClients, GcpProvider, GcpProviderSettings
from tests.providers.aws_fake import FleetSemanticsEc2
from tests.providers.gcp_fake import FakeCompute, serve

AWS_ZONE = "us-east-1a"
GCP_ZONE = "us-central1-a"
ZONE_LABEL = "topology.kubernetes.io/zone"


def make_pool(provider: str, parameters: dict[str, Any], name: str = "gpu-pool") -> CapacityPool:
    return CapacityPool.model_validate({
        "metadata": {"name": name},
        "spec": {
            "provider": provider,
            "parameters": parameters,
            "maxNodes": 64,
            "nodeTemplate": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "190"}},
        },
    })


def aws_parameters(**overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "launchTemplate": {"id": "lt-0123456789abcdef0", "version": "3"},
        "instanceType": "p5.48xlarge",
        "subnets": {AWS_ZONE: "subnet-0aaa1111", "us-east-1b": "subnet-0bbb2222"},
        "tags": {"team": "ml"},
    }
    params.update(overrides)
    return params


def gcp_parameters(**overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "project": "muster-test",
        "zone": GCP_ZONE,
        "machineType": "a3-highgpu-8g",
        "image": "projects/cos-cloud/global/images/family/cos-stable",
        "metadata": {"startup-script": "#!/bin/sh\n/etc/eks/bootstrap.sh"},
        "labels": {"team": "ml"},
    }
    params.update(overrides)
    return params


def fast_aws_settings(**overrides: Any) -> AwsProviderSettings:
    values: dict[str, Any] = {
        "region": "us-east-1",
        "cluster_name": "test-cluster",
        "retry_attempts": 4,
        "retry_initial_backoff": 0.0,
        "retry_max_backoff": 0.0,
        "describe_attempts": 3,
        "describe_interval_seconds": 0.0,
        "placement_group_delete_timeout_seconds": 1.0,
        "placement_group_poll_seconds": 0.0,
    }
    values.update(overrides)
    return AwsProviderSettings(**values)


def fast_gcp_settings(**overrides: Any) -> GcpProviderSettings:
    values: dict[str, Any] = {
        "cluster_name": "test-cluster",
        "retry_attempts": 4,
        "retry_initial_backoff": 0.0,
        "retry_max_backoff": 0.0,
        "operation_timeout_seconds": 30.0,
        "policy_delete_interval_seconds": 0.0,
    }
    values.update(overrides)
    return GcpProviderSettings(**values)


@dataclass
class MotoEc2:
    client: FleetSemanticsEc2
    subnets: dict[str, str]
    launch_template_id: str

    def provider(self, **settings: Any) -> AwsProvider:
        return AwsProvider(fast_aws_settings(**settings), client_factory=lambda _r: self.client)

    def pool(self, name: str = "gpu-pool", **overrides: Any) -> CapacityPool:
        params = aws_parameters(
            launchTemplate={"id": self.launch_template_id},
            subnets=self.subnets,
            **overrides,
        )
        return make_pool("aws", params, name)

    def live_instances(self) -> list[dict[str, Any]]:
        pages = self.client.get_paginator("describe_instances").paginate(Filters=[
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ])
        return [i for p in pages for r in p["Reservations"] for i in r["Instances"]]


@pytest.fixture
def moto_ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoEc2]:
    for var, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(var, value)
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnets = {
            zone: ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)[
                "Subnet"]["SubnetId"]
            for zone, cidr in ((AWS_ZONE, "10.0.1.0/24"), ("us-east-1b", "10.0.2.0/24"))
        }
        template = ec2.create_launch_template(
            LaunchTemplateName="muster-gpu", LaunchTemplateData={"ImageId": "ami-12c6146b"}
        )["LaunchTemplate"]["LaunchTemplateId"]
        yield MotoEc2(FleetSemanticsEc2(ec2), subnets, template)


@dataclass
class GcpFake:
    fake: FakeCompute
    url: str

    def provider(self, **settings: Any) -> GcpProvider:
        return GcpProvider(
            fast_gcp_settings(**settings),
            clients_factory=lambda: GcpClients.create(
                api_endpoint=self.url, credentials=AnonymousCredentials(), transport="rest"
            ),
        )

    def pool(self, name: str = "gpu-pool", **overrides: Any) -> CapacityPool:
        return make_pool("gcp", gcp_parameters(**overrides), name)


@pytest.fixture
def gcp_fake() -> Iterator[GcpFake]:
    fake = FakeCompute()
    with serve(fake) as url:
        yield GcpFake(fake, url)
