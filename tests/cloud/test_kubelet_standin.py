"""The cloud tier's kubelet stand-in reads a VM's bootstrap as its kubelet would: Muster's
startup taint arrives only through what Muster put in the user data or metadata."""

from __future__ import annotations

import base64

import pytest

from e2e.cloud.kubelet import (
    UserDataError,
    decode_user_data,
    ec2_bootstrap,
    ec2_node,
    gce_bootstrap,
    gce_node,
    parse_taints,
)
from providers.bootstrap import merge_nodeadm
from providers.gcp import with_startup_taint
from tests.providers.test_bootstrap import STOCK

STARTUP = {"key": "muster.dev/unregistered", "effect": "NoExecute"}
INSTANCE = {
    "InstanceId": "i-0abc",
    "InstanceType": "p5.48xlarge",
    "PrivateDnsName": "ip-10-0-1-4.ec2.internal",
    "Placement": {"AvailabilityZone": "us-east-1a"},
}


def test_a_stock_nodeadm_user_data_registers_without_a_taint() -> None:
    boot = ec2_bootstrap(STOCK)
    assert boot.joins and boot.taints == [] and boot.labels == {}


def test_muster_s_nodeconfig_part_gives_the_startup_taint() -> None:
    boot = ec2_bootstrap(merge_nodeadm(STOCK))
    assert boot.taints == [STARTUP]


def test_nodeconfig_flags_and_config_merge_in_order() -> None:
    user_data = STOCK.replace(
        "--BOUNDARY--",
        """--BOUNDARY
Content-Type: application/node.eks.aws

apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  kubelet:
    config:
      registerWithTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
    flags: ["--node-labels=team=ml,muster.dev/pool=p5", "--v=2"]
--BOUNDARY--""",
    )
    boot = ec2_bootstrap(merge_nodeadm(user_data))
    assert boot.labels == {"team": "ml", "muster.dev/pool": "p5"}
    assert boot.taints == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        STARTUP,
    ]


def test_al2_bootstrap_sh_kubelet_extra_args() -> None:
    script = (
        "#!/bin/bash\n/etc/eks/bootstrap.sh my-cluster \\\n  --kubelet-extra-args "
        "'--node-labels=a=b --register-with-taints=x=:NoSchedule'\n"
    )
    boot = ec2_bootstrap(script)
    assert boot.labels == {"a": "b"}
    assert boot.taints == [{"key": "x", "effect": "NoSchedule"}]


def test_user_data_that_starts_no_kubelet_joins_nothing() -> None:
    assert ec2_bootstrap("").joins is False
    assert ec2_bootstrap("#!/bin/sh\necho hello\n").joins is False
    assert ec2_node(INSTANCE, "#!/bin/sh\necho hi\n", []) is None


def test_bad_flags_are_refused() -> None:
    with pytest.raises(UserDataError):
        parse_taints("muster.dev/unregistered")
    with pytest.raises(UserDataError):
        decode_user_data("!!!")


def test_ec2_node_is_what_kubelet_and_the_ccm_register() -> None:
    node = ec2_node(INSTANCE, merge_nodeadm(STOCK), ["nn-1", "nn-2", "nn-3"])
    assert node is not None
    assert node["metadata"]["name"] == "ip-10-0-1-4.ec2.internal"
    assert node["spec"]["providerID"] == "aws:///us-east-1a/i-0abc"
    assert node["spec"]["taints"] == [STARTUP]
    labels = node["metadata"]["labels"]
    assert labels["topology.kubernetes.io/zone"] == "us-east-1a"
    assert labels["topology.kubernetes.io/region"] == "us-east-1"
    assert labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert labels["topology.k8s.aws/network-node-layer-3"] == "nn-3"
    assert not any(k.startswith("muster.dev/") for k in labels)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert decode_user_data(base64.b64encode(b"x").decode()) == "x"


def test_kube_env_gets_muster_s_taint_through_node_taints() -> None:
    metadata = with_startup_taint({"kube-env": "NODE_LABELS: team=ml\nNODE_TAINTS: ''\n"})
    boot = gce_bootstrap(metadata)
    assert boot.labels == {"team": "ml"}
    assert boot.taints == [STARTUP]


def test_startup_script_passes_the_metadata_it_reads() -> None:
    script = (
        '#!/bin/bash\nkubelet --node-labels=team=ml --register-with-taints="$(curl -s '
        "-H 'Metadata-Flavor: Google' http://metadata.google.internal/computeMetadata/v1"
        '/instance/attributes/muster-register-with-taints)"\n'
    )
    assert gce_bootstrap(with_startup_taint({"startup-script": script})).taints == [STARTUP]
    ignores = "#!/bin/bash\nkubelet --node-labels=team=ml\n"
    assert gce_bootstrap(with_startup_taint({"startup-script": ignores})).taints == []


def test_gce_node_is_what_kubelet_and_the_ccm_register() -> None:
    metadata = with_startup_taint({"kube-env": "NODE_LABELS: ''\n"})
    instance = {
        "name": "gpu-pool-abc-0001",
        "zone": "https://compute.googleapis.com/compute/v1/projects/p/zones/us-central1-a",
        "machineType": ".../zones/us-central1-a/machineTypes/a3-highgpu-8g",
        "metadata": {"items": [{"key": k, "value": v} for k, v in metadata.items()]},
        "resourceStatus": {"physicalHostTopology": {"block": "b1", "subblock": "s1", "host": "h1"}},
    }
    node = gce_node("p", instance)
    assert node is not None
    assert node["spec"]["providerID"] == "gce://p/us-central1-a/gpu-pool-abc-0001"
    assert node["spec"]["taints"] == [STARTUP]
    labels = node["metadata"]["labels"]
    assert labels["topology.kubernetes.io/region"] == "us-central1"
    assert labels["cloud.google.com/gce-topology-subblock"] == "s1"
    assert labels["node.kubernetes.io/instance-type"] == "a3-highgpu-8g"
