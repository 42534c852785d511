"""Label and annotation keys Muster agrees on, and the default topology levels.

One place, so the controller, the CLI, the simulator and the snapshot builder never disagree.
"""

from __future__ import annotations

HOSTNAME = "kubernetes.io/hostname"

DEFAULT_LEVELS: tuple[str, ...] = (
    "topology.muster.dev/block",
    "topology.muster.dev/rack",
    HOSTNAME,
)
"""Top (widest) to bottom; override with configuration or ``muster fit --levels``."""

POOL_LABEL = "muster.dev/pool"
"""Label on every node a CapacityPool created: the pool's name."""
KEY_LABEL = "muster.dev/acquisition-key"
"""The acquisition's idempotency key, written by Muster on the nodes it registers."""
OWNER_ANNOTATION = "muster.dev/owner"
"""``<namespace>/<request>`` a node was acquired for (written when Muster registers it)."""
OWNER_UID_LABEL = "muster.dev/owner-uid"
"""The uid of the request a node was acquired for (written when Muster registers it)."""
UNREGISTERED_TAINT = "muster.dev/unregistered"
"""The startup taint (``NoExecute``) a machine Muster launched registers its Node with:
nothing runs on the node until Muster has made it the node it planned (pool, acquisition
and domain labels, the pool's nodeTemplate labels and taints) and lifted the taint. The
providers put it into the machine's bootstrap (``--register-with-taints``)."""

FRESH_PREFIX = "muster-new"
"""Prefix of the placeholder domain values the planner invents for a pool without declared
domains (``muster-new-<pool>-<k>``): each acquisition is a domain of its own, and where it is
is the cloud's choice. No node carries such a value and none is ever published."""


def placeholder(value: str) -> bool:
    """A domain value the planner invented for a pool without declared domains: the cloud
    chooses where the machines go, and the node's own (observed) value stands in for it."""
    return value.startswith(f"{FRESH_PREFIX}-")


CLOUD_TOPOLOGY_PREFIXES: dict[str, tuple[str, ...]] = {
    "aws": ("topology.k8s.aws/",),
    "gcp": ("cloud.google.com/",),
}
"""Label namespaces a cloud's own node topology is reported in, by provider name."""


def foreign_level(label: str, provider: str) -> bool:
    """``label`` is another cloud's topology (an EC2 network node layer on a GCE node): a
    node of ``provider`` never carries it, and Muster never writes it there."""
    return any(label.startswith(prefix)
               for cloud, prefixes in CLOUD_TOPOLOGY_PREFIXES.items() if cloud != provider
               for prefix in prefixes)


# Pod-template annotations selecting a pod set's topology. Muster's own win over Kueue's.
MUSTER_REQUIRED = "muster.dev/required-topology"
MUSTER_PREFERRED = "muster.dev/preferred-topology"
KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"

DEFAULT_PODS_PER_NODE = 110
"""kubelet's default maxPods, for nodes that report no ``pods`` allocatable."""
