"""The ProvisioningRequest reconcile, one module per phase (see :mod:`.service`)."""
