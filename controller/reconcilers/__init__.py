"""The ProvisioningRequest controller: thin kopf handlers (``handlers``), the service that
reconciles one request (``service``), the keyed work queue, and the wiring (``operator``)."""
