"""REST descriptors of the Kueue resources Muster reads and writes (``kueue.x-k8s.io/v1beta2``)."""

from __future__ import annotations

from controller.kube.resources import Resource
from controller.kueue.models import GROUP, VERSION

WORKLOADS = Resource(GROUP, VERSION, "workloads", namespaced=True, kind="Workload")
ADMISSION_CHECKS = Resource(GROUP, VERSION, "admissionchecks", namespaced=False,
                            kind="AdmissionCheck")
CLUSTER_QUEUES = Resource(GROUP, VERSION, "clusterqueues", namespaced=False, kind="ClusterQueue")
LOCAL_QUEUES = Resource(GROUP, VERSION, "localqueues", namespaced=True, kind="LocalQueue")
RESOURCE_FLAVORS = Resource(GROUP, VERSION, "resourceflavors", namespaced=False,
                            kind="ResourceFlavor")
PROVISIONING_REQUEST_CONFIGS = Resource(
    GROUP, VERSION, "provisioningrequestconfigs", namespaced=False,
    kind="ProvisioningRequestConfig",
)
TOPOLOGIES = Resource(GROUP, VERSION, "topologies", namespaced=False, kind="Topology")
