"""The API resources Muster reads and writes, with their REST paths.

Pure descriptors; :mod:`controller.kube.client` does the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True, slots=True)
class Resource:
    group: str
    """Empty for the core group."""
    version: str
    plural: str
    namespaced: bool
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
            if subresource:
                base += f"/{subresource}"
        return base


NODES = Resource("", "v1", "nodes", namespaced=False, kind="Node")
PODS = Resource("", "v1", "pods", namespaced=True, kind="Pod")
POD_TEMPLATES = Resource("", "v1", "podtemplates", namespaced=True, kind="PodTemplate")
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False, kind="Namespace")
EVENTS = Resource("", "v1", "events", namespaced=True, kind="Event")
LEASES = Resource("coordination.k8s.io", "v1", "leases", namespaced=True, kind="Lease")
PROVISIONING_REQUESTS = Resource(
    "autoscaling.x-k8s.io",
    "v1",
    "provisioningrequests",
    namespaced=True,
    kind="ProvisioningRequest",
)
CAPACITY_POOLS = Resource(
    "muster.dev", "v1alpha1", "capacitypools", namespaced=False, kind="CapacityPool"
)
RESOURCE_SLICES = Resource(
    "resource.k8s.io", "v1", "resourceslices", namespaced=False, kind="ResourceSlice"
)
RESOURCE_CLAIMS = Resource(
    "resource.k8s.io", "v1", "resourceclaims", namespaced=True, kind="ResourceClaim"
)
RESOURCE_CLAIM_TEMPLATES = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", namespaced=True,
    kind="ResourceClaimTemplate",
)
DEVICE_CLASSES = Resource(
    "resource.k8s.io", "v1", "deviceclasses", namespaced=False, kind="DeviceClass"
)
CRDS = Resource(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    namespaced=False,
    kind="CustomResourceDefinition",
)
# Delegated authentication and authorization of `muster run`'s /metrics (create only).
TOKEN_REVIEWS = Resource(
    "authentication.k8s.io", "v1", "tokenreviews", namespaced=False, kind="TokenReview")
SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", namespaced=False,
    kind="SubjectAccessReview")
