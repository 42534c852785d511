"""Native gangs: gang PodGroups of Kubernetes' workload-aware scheduling, provisioned as one
(:mod:`controller.podgroups.gang` pure, :mod:`controller.podgroups.integration` the watches)."""
