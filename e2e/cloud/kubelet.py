"""A kubelet and cloud-controller-manager stand-in: the Node a cloud VM registers, built only
from what that VM has.

* its bootstrap: the EC2 instance's user data (MIME multi-part with nodeadm ``NodeConfig``
  parts, merged in order as nodeadm merges them, or an AL2 ``bootstrap.sh`` script with
  ``--kubelet-extra-args``), or the GCE instance's metadata (a ``kube-env``'s
  ``NODE_LABELS`` / ``NODE_TAINTS``, as the GCE configure-helper reads them, else the kubelet
  flags of its ``startup-script``, where ``$(curl .../attributes/KEY)`` is what the metadata
  server answers for KEY). Kubelet flags read: ``--node-labels``, ``--register-with-taints``;
  and ``registerWithTaints`` in a NodeConfig's kubelet config;
* the name and ``spec.providerID`` the cloud gives it (EKS: the private DNS name,
  ``aws:///<zone>/<instance-id>``; GCE: the instance name,
  ``gce://<project>/<zone>/<name>``);
* the well-known labels kubelet sets (hostname, os, arch) and those the cloud-controller-
  manager / EKS / GKE set from the cloud's description of the VM (instance type, zone, region,
  EC2 network node layers, GCE physical host topology);
* its shape (capacity) from the machine type, as kubelet and the GPU device plugin report it.

Nodes are annotated ``kwok.x-k8s.io/node: fake``, so kwok keeps them Ready. Nothing here
knows Muster: no Muster label is written unless the bootstrap says so.
"""

from __future__ import annotations

import base64
import binascii
import email
import email.policy
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

NODEADM_CONTENT_TYPE = "application/node.eks.aws"
AWS_TOPOLOGY_LABEL = "topology.k8s.aws/network-node-layer-{}"
GCE_TOPOLOGY_LABELS = {
    "block": "cloud.google.com/gce-topology-block",
    "subblock": "cloud.google.com/gce-topology-subblock",
    "host": "cloud.google.com/gce-topology-host",
}

MACHINE_SHAPES: dict[str, dict[str, str]] = {
    "p5.48xlarge": {"cpu": "192", "memory": "2048Gi", "nvidia.com/gpu": "8"},
    "p4d.24xlarge": {"cpu": "96", "memory": "1152Gi", "nvidia.com/gpu": "8"},
    "a3-highgpu-8g": {"cpu": "208", "memory": "1872Gi", "nvidia.com/gpu": "8"},
    "a3-megagpu-8g": {"cpu": "208", "memory": "1872Gi", "nvidia.com/gpu": "8"},
}
"""What kubelet (cpu, memory) and the NVIDIA device plugin (GPUs) report per machine type."""
DEFAULT_SHAPE = {"cpu": "4", "memory": "16Gi"}


class UserDataError(ValueError):
    """The bootstrap cannot be read as a node bootstrap (the VM would not join)."""


@dataclass(frozen=True)
class Bootstrap:
    """What a node's bootstrap passes its kubelet."""

    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    joins: bool = True
    """False: nothing in the bootstrap starts a kubelet for this cluster."""


# ---- kubelet flags ---------------------------------------------------------------------


def parse_labels(value: str) -> dict[str, str]:
    """``--node-labels`` syntax: ``k=v,k2=v2``."""
    labels = {}
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, val = item.partition("=")
        if not sep:
            raise UserDataError(f"--node-labels item {item!r} is not key=value")
        labels[key] = val
    return labels


def parse_taints(value: str) -> list[dict[str, str]]:
    """``--register-with-taints`` syntax: ``key[=value]:Effect,...``."""
    taints = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        head, sep, effect = item.rpartition(":")
        if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise UserDataError(f"--register-with-taints item {item!r} has no valid effect")
        key, _, val = head.partition("=")
        taint = {"key": key, "effect": effect}
        if val:
            taint["value"] = val
        taints.append(taint)
    return taints


def apply_flags(flags: Sequence[str], into: Bootstrap) -> None:
    """Kubelet flags, later ones adding to earlier ones (as nodeadm merges flag lists)."""
    for flag in flags:
        name, _, value = flag.partition("=")
        if name == "--node-labels":
            into.labels.update(parse_labels(value))
        elif name == "--register-with-taints":
            into.taints.extend(parse_taints(value))


# ---- EC2 user data ---------------------------------------------------------------------


def decode_user_data(value: str | None) -> str:
    """The instance attribute ``userData`` (base64) as text."""
    if not value:
        return ""
    try:
        return base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise UserDataError(f"user data is not base64 text: {exc}") from exc


def ec2_bootstrap(user_data: str) -> Bootstrap:
    """What an EKS AMI's boot makes of ``user_data``: nodeadm (AL2023) reads every
    ``application/node.eks.aws`` part of a MIME multi-part document (or a bare NodeConfig);
    an AL2 script is read for its ``bootstrap.sh --kubelet-extra-args``."""
    out = Bootstrap()
    text = user_data.lstrip()
    if text.startswith(("MIME-Version", "Content-Type")):
        message = email.message_from_string(user_data, policy=email.policy.default)
        parts = list(message.walk()) if message.is_multipart() else [message]
        configs = [p for p in parts if p.get_content_type() == NODEADM_CONTENT_TYPE]
        scripts = [p for p in parts if p.get_content_type() == "text/x-shellscript"]
        for part in configs:
            _apply_nodeconfig(_text(part), out)
        for part in scripts:
            _apply_bootstrap_sh(_text(part), out)
        if not configs and not any("bootstrap.sh" in _text(p) for p in scripts):
            return Bootstrap(joins=False)
        return out
    if text.startswith("apiVersion: node.eks.aws/"):
        _apply_nodeconfig(user_data, out)
        return out
    if text.startswith("#!") and "bootstrap.sh" in text:
        _apply_bootstrap_sh(user_data, out)
        return out
    return Bootstrap(joins=False)


def _text(part: Any) -> str:
    payload = part.get_payload(decode=True)
    if isinstance(payload, bytes):
        return payload.decode(part.get_content_charset() or "utf-8", errors="replace")
    return str(part.get_payload())


def _apply_nodeconfig(text: str, into: Bootstrap) -> None:
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise UserDataError(f"a NodeConfig part is not YAML: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("kind") != "NodeConfig":
        raise UserDataError("an application/node.eks.aws part is not a NodeConfig")
    kubelet = (doc.get("spec") or {}).get("kubelet") or {}
    for taint in (kubelet.get("config") or {}).get("registerWithTaints") or []:
        into.taints.append({k: str(v) for k, v in taint.items() if k in ("key", "value", "effect")})
    apply_flags([str(f) for f in kubelet.get("flags") or []], into)


def _apply_bootstrap_sh(script: str, into: Bootstrap) -> None:
    for line in script.replace("\\\n", " ").splitlines():
        if "bootstrap.sh" not in line:
            continue
        words = shlex.split(line, comments=True)
        for i, word in enumerate(words):
            extra = None
            if word == "--kubelet-extra-args" and i + 1 < len(words):
                extra = words[i + 1]
            elif word.startswith("--kubelet-extra-args="):
                extra = word.partition("=")[2]
            if extra is not None:
                apply_flags(shlex.split(extra), into)


# ---- GCE metadata ----------------------------------------------------------------------

_ATTRIBUTE = re.compile(r"\$\((?:curl|wget)[^)]*?/attributes/([A-Za-z0-9_-]+)[^)]*\)")


def gce_bootstrap(metadata: Mapping[str, str]) -> Bootstrap:
    """What a GCE node's boot makes of its metadata: a ``kube-env`` (the configure-helper's
    ``NODE_LABELS`` / ``NODE_TAINTS``), else the kubelet flags its ``startup-script`` passes,
    each ``$(curl ... /attributes/KEY)`` being the metadata server's answer for KEY."""
    out = Bootstrap()
    env = metadata.get("kube-env")
    if env is not None:
        values = yaml.safe_load(env) or {}
        if not isinstance(values, dict):
            raise UserDataError("kube-env is not KEY: value lines")
        out.labels.update(parse_labels(str(values.get("NODE_LABELS") or "")))
        out.taints.extend(parse_taints(str(values.get("NODE_TAINTS") or "")))
        return out
    script = metadata.get("startup-script")
    if not script or "kubelet" not in script:
        return Bootstrap(joins=False)
    expanded = _ATTRIBUTE.sub(lambda m: metadata.get(m.group(1), ""), script)
    for line in expanded.replace("\\\n", " ").splitlines():
        if "kubelet" not in line:
            continue
        apply_flags([w for w in shlex.split(line, comments=True) if w.startswith("--")], out)
    return out


# ---- Node bodies -----------------------------------------------------------------------


def shape(machine_type: str) -> dict[str, str]:
    capacity = dict(MACHINE_SHAPES.get(machine_type, DEFAULT_SHAPE))
    capacity.setdefault("pods", "110")
    return capacity


def node_body(
    name: str, provider_id: str, labels: Mapping[str, str], boot: Bootstrap, machine_type: str
) -> dict[str, Any]:
    """The Node kubelet registers (kwok keeps it Ready)."""
    capacity = shape(machine_type)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                **boot.labels,
                **labels,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"providerID": provider_id, "taints": [dict(t) for t in boot.taints]},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "cloud-tier",
            },
        },
    }


def ec2_node(
    instance: Mapping[str, Any], user_data: str, network_nodes: Sequence[str]
) -> dict[str, Any] | None:
    """The Node an EKS node on ``instance`` registers (None: its bootstrap joins nothing)."""
    boot = ec2_bootstrap(user_data)
    if not boot.joins:
        return None
    zone = instance["Placement"]["AvailabilityZone"]
    labels = {
        "node.kubernetes.io/instance-type": instance["InstanceType"],
        "topology.kubernetes.io/zone": zone,
        "topology.kubernetes.io/region": zone[:-1],
        **{AWS_TOPOLOGY_LABEL.format(k): n for k, n in enumerate(network_nodes, start=1)},
    }
    name = instance.get("PrivateDnsName") or instance["InstanceId"]
    return node_body(
        name, f"aws:///{zone}/{instance['InstanceId']}", labels, boot, instance["InstanceType"]
    )


def gce_node(project: str, instance: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Node a GCE VM (Compute's instance JSON) registers (None: it joins nothing)."""
    metadata = {
        i["key"]: i.get("value", "") for i in (instance.get("metadata") or {}).get("items") or []
    }
    boot = gce_bootstrap(metadata)
    if not boot.joins:
        return None
    zone = str(instance["zone"]).rsplit("/", 1)[-1]
    machine_type = str(instance.get("machineType", "")).rsplit("/", 1)[-1]
    topology = (instance.get("resourceStatus") or {}).get("physicalHostTopology") or {}
    labels = {
        "node.kubernetes.io/instance-type": machine_type,
        "topology.kubernetes.io/zone": zone,
        "topology.kubernetes.io/region": zone.rsplit("-", 1)[0],
        **{label: str(topology[k]) for k, label in GCE_TOPOLOGY_LABELS.items() if topology.get(k)},
    }
    name = str(instance["name"])
    return node_body(name, f"gce://{project}/{zone}/{name}", labels, boot, machine_type)
