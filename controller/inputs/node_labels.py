"""The labels a node carries because a kubelet registered it and a cloud-controller-manager
initialised it, beyond what its CapacityPool's template says.

One definition for the two sides that must agree: the fit engine's picture of a node a pool
would add (:func:`controller.inputs.snapshot.pool_state`) and the Node the fake provider writes. A
pod whose nodeSelector asks for ``kubernetes.io/os: linux`` lands on every real new node, and
one whose node affinity says ``kubernetes.io/os DoesNotExist`` on none, so the plan must see
the same labels.

The hostname is the node's own name: unknown before the node exists, so the pool's picture
leaves it out and the fit engine gives every new node a hostname of its own
(:data:`controller.fit.topology.NEW_HOSTNAME`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.common.topology_defaults import HOSTNAME

OS = "kubernetes.io/os"
ARCH = "kubernetes.io/arch"
BETA_OS = "beta.kubernetes.io/os"
BETA_ARCH = "beta.kubernetes.io/arch"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
BETA_INSTANCE_TYPE = "beta.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"

DEFAULT_OS = "linux"
DEFAULT_ARCH = "amd64"
"""What a kubelet reports (Go's GOOS/GOARCH) when the pool's template does not say: the
templates Muster's providers boot are Linux on amd64 unless labelled otherwise."""

KUBELET_KEYS = (OS, ARCH, BETA_OS, BETA_ARCH, HOSTNAME)
"""Every kubelet sets these on its Node (the beta pair too, for old selectors)."""

# (GA key, deprecated alias) the kubelet sets both of. The zone's and region's beta aliases
# are left out: a pool's zone is usually a domain label, which both sides must carry as is.
_ALIASES = ((OS, BETA_OS), (ARCH, BETA_ARCH), (INSTANCE_TYPE, BETA_INSTANCE_TYPE))


def cloud_facts(parameters: Mapping[str, Any]) -> dict[str, str]:
    """What a pool's provider parameters say about the labels its nodes get from the cloud:
    the instance type (``instanceType`` on AWS, ``machineType`` on GCP) and, where the pool
    is pinned to one, the zone and region."""
    out: dict[str, str] = {}
    kind = parameters.get("instanceType") or parameters.get("machineType")
    if isinstance(kind, str) and kind:
        out[INSTANCE_TYPE] = kind.rsplit("/", 1)[-1]
    zone = parameters.get("zone")
    if isinstance(zone, str) and zone:
        out[ZONE] = zone
        out[REGION] = zone.rsplit("-", 1)[0]
    region = parameters.get("region")
    if isinstance(region, str) and region:
        out[REGION] = region
    return out


def node_labels(
    labels: Mapping[str, str],
    *,
    hostname: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """A new node's labels: ``labels`` (the template's, then the domain's) plus what the
    kubelet and the cloud-controller-manager add. The template may name the OS, the
    architecture, the instance type, zone or region (its machines are what it says); a
    deprecated alias follows its GA key. ``hostname``: the node's name, once it has one."""
    out = dict(cloud_facts(parameters or {}))
    out.update(labels)
    out.setdefault(OS, DEFAULT_OS)
    out.setdefault(ARCH, DEFAULT_ARCH)
    for key, alias in _ALIASES:
        if key in out:
            out.setdefault(alias, out[key])
    if hostname is not None:
        out[HOSTNAME] = hostname
    return out
