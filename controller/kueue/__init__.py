"""Kueue integration: the Kueue v1beta2 types Muster reads and writes, pure admission-check
decisions, and the reconcilers of Muster's own admission check (path B).

Path A (Kueue's built-in ``kueue.x-k8s.io/provisioning-request`` check with a Muster
provisioning class) needs no code here: Kueue writes the ProvisioningRequests and Muster's
ProvisioningRequest reconciler serves them like any other.
"""
