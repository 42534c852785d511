"""The ProvisioningRequest controller: the service that reconciles one request (``service``),
fed by the keys :class:`controller.state.cache.ClusterState` enqueues as the watches of
:mod:`controller.state.feeds` see requests change; wired up in :mod:`controller.operator`."""
