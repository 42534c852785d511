"""The cloud tier: Muster's AWS and GCP providers against cloud APIs over HTTP on 127.0.0.1,
on the real control plane, with nodes registering as kubelet registers them.

A test joins the tier with the markers ``real`` and ``cloud`` (``-m cloud`` runs it alone,
``-m "real and not cloud"`` the real tier without it, ``-m "not real"`` the sandbox tier) and
the :func:`cloud` fixture: moto's EC2 behind :mod:`e2e.cloud.ec2`, the Compute fake of
:mod:`e2e.cloud.gce`, the node lifecycle of :mod:`e2e.cloud.registrar`, and a Muster process
of its own whose AWS and GCP providers are pointed at those endpoints by their ordinary
settings (``MUSTER_AWS_ENDPOINT_URL``, ``MUSTER_GCP_API_ENDPOINT``, Application Default
Credentials). The real tier's session Muster is stopped while the tier's runs (one leader per
cluster) and started again after it. Registered by the root ``conftest.py``.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from e2e import cluster as cp
from e2e.cloud.ec2 import AWS_TEST_ENV, Ec2Layer, aws_env, ec2_endpoint
from e2e.cloud.gce import TierCompute, compute_endpoint, credentials_file, gcp_env
from e2e.cloud.registrar import Registrar, running
from e2e.real import SESSION_MUSTERS, MusterProcess

CLOUD = "cloud"
CLOUD_CONFIG = Path(__file__).with_name("muster-cloud.yaml")
REGION = "us-east-1"
AWS_ZONE = "us-east-1a"
GCP_PROJECT = "muster-cloud"
GCP_ZONE = "us-central1-a"
LAUNCH_TEMPLATE = "eks-al2023-gpu-nodes"

STOCK_NODEADM_USER_DATA = """MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="//"

--//
Content-Type: application/node.eks.aws

apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  cluster:
    name: cloud-tier
    apiServerEndpoint: https://127.0.0.1:6443
    certificateAuthority: Y2E=
    cidr: 10.100.0.0/16

--//--
"""
"""A stock EKS AL2023 launch template's user data: nothing of Muster's in it."""

STOCK_KUBE_ENV = "CLUSTER_NAME: cloud-tier\nNODE_LABELS: ''\nNODE_TAINTS: ''\n"
"""A stock GCE node's kube-env (the configure-helper's settings): nothing of Muster's."""


@dataclass
class Cloud:
    cluster: cp.Cluster
    muster: MusterProcess
    ec2: Any
    """boto3 EC2 client of the tier's endpoint (what a user's AWS console shows)."""
    layer: Ec2Layer
    compute: TierCompute
    registrar: Registrar
    subnet: str

    def live_instances(self, pool: str) -> list[dict[str, Any]]:
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
                {"Name": "tag:muster.dev/pool", "Values": [pool]},
            ]
        )
        return [i for p in pages for r in p["Reservations"] for i in r["Instances"]]

    def live_vms(self, pool: str) -> list[dict[str, Any]]:
        with self.compute.lock:
            return [
                dict(i)
                for i in self.compute.all_instances()
                if i["labels"].get("muster-pool") == pool
            ]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{CLOUD}: the cloud tier (AWS and GCP providers over HTTP to local cloud "
        "APIs, nodes registered from their bootstrap; also marked real)",
    )


@pytest.fixture(scope="module")
def cloud(real_cluster: cp.Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    paused = [m for m in SESSION_MUSTERS if m.running]
    for m in paused:
        m.stop()
    try:
        with contextlib.ExitStack() as stack:
            yield stack.enter_context(_cloud(real_cluster, tmp_path_factory.mktemp("cloud")))
    finally:
        for m in paused:
            m.start()


@contextlib.contextmanager
def _cloud(cluster: cp.Cluster, tmp: Path) -> Iterator[Cloud]:
    with (
        ec2_endpoint(log=str(cluster.logs / "moto.log")) as (ec2_url, layer),
        compute_endpoint() as (gce_url, compute),
    ):
        keys = {
            "aws_access_key_id": AWS_TEST_ENV["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": AWS_TEST_ENV["AWS_SECRET_ACCESS_KEY"],
        }
        ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=ec2_url, **keys)
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone=AWS_ZONE)[
            "Subnet"
        ]["SubnetId"]
        ec2.create_launch_template(
            LaunchTemplateName=LAUNCH_TEMPLATE,
            LaunchTemplateData={
                "ImageId": "ami-12c6146b",
                "UserData": base64.b64encode(STOCK_NODEADM_USER_DATA.encode()).decode(),
            },
        )
        registrar = Registrar(
            cluster.admin_kubeconfig,
            ec2=boto3.client("ec2", region_name=REGION, endpoint_url=ec2_url, **keys),
            compute=compute,
            gce_project=GCP_PROJECT,
        )
        env = {
            **aws_env(ec2_url),
            "MUSTER_AWS_REGION": REGION,
            **gcp_env(gce_url, credentials_file(gce_url, tmp / "adc.json")),
        }
        muster = MusterProcess(cluster, config=CLOUD_CONFIG, extra_env=env)
        muster.log = cluster.logs / "muster-cloud.log"
        muster.new_lines()
        with running(registrar):
            muster.start()
            try:
                yield Cloud(cluster, muster, ec2, layer, compute, registrar, subnet)
            finally:
                code = muster.stop()
        assert code == 0, f"the cloud tier's muster run exited {code}:\n{muster.tail()}"
