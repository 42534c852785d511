"""The sample pools validate with their provider, and the sample IAM policy/role grant
every call the providers make, scoped to Muster's tags."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml

from controller.api.capacitypool import CapacityPool
from providers import aws
from providers.aws import AwsProvider
from providers.gcp import GcpProvider

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"


class _StockTemplate:
    """An EC2 client that knows one launch template: a stock EKS AL2023 (nodeadm) one."""

    def describe_launch_template_versions(self, **_: object) -> dict[str, object]:
        user_data = (
            'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="B"\n\n--B\n'
            "Content-Type: application/node.eks.aws\n\napiVersion: node.eks.aws/v1alpha1\n"
            "kind: NodeConfig\nspec:\n  cluster:\n    name: c\n--B--\n"
        )
        return {"LaunchTemplateVersions": [{"LaunchTemplateData": {
            "UserData": base64.b64encode(user_data.encode()).decode()}}]}


def load_pool(name: str) -> CapacityPool:
    return CapacityPool.model_validate(yaml.safe_load((SAMPLES / name).read_text()))


async def test_sample_pools_are_valid_for_their_provider() -> None:
    aws_pool, gcp_pool = load_pool("aws-pool.yaml"), load_pool("gcp-pool.yaml")
    assert aws_pool.spec.provider == "aws" and gcp_pool.spec.provider == "gcp"
    assert aws_pool.spec.node_template.allocatable["nvidia.com/gpu"] == "8"
    assert gcp_pool.spec.node_template.allocatable["nvidia.com/gpu"] == "8"
    await AwsProvider(client_factory=lambda _r: _StockTemplate()).validate(aws_pool)
    await GcpProvider(clients_factory=lambda: None).validate(gcp_pool)


def test_aws_policy_grants_every_call_and_scopes_deletes_to_our_tag() -> None:
    policy = json.loads((SAMPLES / "aws-iam-policy.json").read_text())
    granted = set()
    for statement in policy["Statement"]:
        actions = statement["Action"]
        granted.update([actions] if isinstance(actions, str) else actions)
    assert not any("*" in action for action in granted)
    assert {
        "ec2:CreateFleet", "ec2:RunInstances", "ec2:CreateTags", "ec2:DescribeInstances",
        "ec2:DescribeInstanceTopology", "ec2:TerminateInstances", "ec2:CreatePlacementGroup",
        "ec2:DeletePlacementGroup", "iam:PassRole", "ec2:DescribeLaunchTemplateVersions",
        "ec2:CreateLaunchTemplate", "ec2:DescribeCapacityReservations",
        "ec2:GetGroupsForCapacityReservation",
        "ec2:DescribeLaunchTemplates", "ec2:DeleteLaunchTemplate",
    } <= granted
    # The instances' network interfaces are tagged after launch (no fleet can tag them).
    assert any(s["Action"] == "ec2:CreateTags" and "network-interface" in str(s["Resource"])
               and "ec2:CreateAction" not in str(s.get("Condition")) for s in policy["Statement"])
    deletes = [s for s in policy["Statement"]
               if {"ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"} & set(s["Action"])]
    assert deletes and all(
        f"aws:ResourceTag/{aws.TAG_CLUSTER}" in s["Condition"]["StringEquals"] for s in deletes)


def test_gcp_role_grants_every_call() -> None:
    role = yaml.safe_load((SAMPLES / "gcp-role.yaml").read_text())
    assert {
        "compute.instances.create", "compute.instances.list", "compute.instances.delete",
        "compute.zoneOperations.get", "compute.regionOperations.get",
        "compute.resourcePolicies.create", "compute.resourcePolicies.delete",
        "compute.resourcePolicies.use", "compute.reservations.get",
        "compute.reservationBlocks.get", "compute.instanceGroupManagers.get",
        "compute.instanceGroupManagers.update", "compute.instances.get",
    } <= set(role["includedPermissions"])
