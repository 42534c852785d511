"""Fixtures shared by the provider tests: pools, a moto EC2 with Fleet semantics, the local
Compute REST fake and an API sandbox for the fake provider. No network other than
127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import boto3
import pytest
from google.auth.credentials import AnonymousCredentials
from moto import mock_aws

from controller.acquire.collector import Collector
from controller.acquire.providers import ProviderSet
from controller.api.capacitypool import CapacityPool
from controller.common.clock import ManualClock
from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.kube import KubeClient
from controller.lifecycle import PHASE_ANNOTATION, PLAN_ANNOTATION, Phase
from controller.state.bookings import Booking, Group
from controller.state.cache import ClusterState
from providers.aws import AwsProvider, AwsProviderSettings
from providers.base import AcquireRequest, Provider
from providers.gcp import GcpClients, GcpProvider, GcpProviderSettings
from providers.registry import ProviderContext
from sandbox.server import SandboxServer
from tests.cluster_objects import plan_on
from tests.providers.aws_fake import FleetSemanticsEc2
from tests.providers.gcp_fake import FakeCompute, serve

CRDS = Path(__file__).resolve().parents[2] / "crds"
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
        # The launch template is used as it is; the nodeadm merge has its own tests.
        "bootstrap": "asIs",
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
            **{"launchTemplate": {"id": self.launch_template_id}, "subnets": self.subnets,
               **overrides},
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


@pytest.fixture
async def sandbox_kube(tmp_path: Path) -> AsyncIterator[KubeClient]:
    """A client of a fresh API sandbox (the fake provider's "cloud" is its Nodes)."""
    server = SandboxServer(crd_dir=CRDS)
    await server.start()
    client = await KubeClient.from_kubeconfig(server.write_kubeconfig(tmp_path / "kubeconfig"))
    try:
        yield client
    finally:
        await client.close()
        await server.stop()


GRACE = 60.0
"""The restarted controller's ``acquisition.orphan_grace_seconds`` in the crash tests."""


@dataclass
class Restarted:
    """A restarted controller's collector over one provider: what its cache shows so far is
    up to the test (:meth:`shows`), its clock is virtual."""

    collector: Collector
    state: ClusterState
    clock: ManualClock

    def shows(self, request: AcquireRequest, phase: Phase = Phase.ACQUIRING) -> None:
        """The request's plan, recording ``request.key``, has reached the cache."""
        group = Group(request.key, request.pool.metadata.name, dict(request.domain),
                      request.count)
        booking = Booking(plan_on([], new=request.count, pool=request.pool.metadata.name),
                          attempt=0, groups=(group,))
        namespace, name = request.owner.split("/")
        self.state.upsert_request({
            "metadata": {
                "name": name, "namespace": namespace, "uid": request.owner_uid,
                "resourceVersion": "1",
                "annotations": {PHASE_ANNOTATION: phase, PLAN_ANNOTATION:
                                booking.to_annotation()},
            },
            "spec": {"provisioningClassName": "atomic-provisioning.muster.dev", "podSets": []},
        })

    async def sweep(self) -> dict[str, int]:
        """One collector run: key -> nodes released."""
        return {r.key: r.nodes for r in await self.collector.run_once()}


def restarted(provider: Provider, pool: CapacityPool) -> Restarted:
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([pool.model_dump(by_alias=True, exclude_none=True)])
    clock = ManualClock()
    # The provider is handed in, so the context's client is never used to build one.
    providers = ProviderSet(ProviderContext(kube=cast(KubeClient, None)),
                            instances={pool.spec.provider: provider})
    collector = Collector(state=state, providers=providers, idle_ttl=300, grace=GRACE,
                          now=clock.now, in_flight=lambda key: False)
    return Restarted(collector, state, clock)
