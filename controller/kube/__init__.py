"""The only layer that talks to the Kubernetes API server (kubernetes-asyncio underneath).

Everything above it (state, acquire, reconcilers, the fake provider) calls
:class:`KubeClient`; swapping the transport or faking the server touches only this package.
"""

from controller.kube.client import ApiError, Body, KubeClient, WatchEvent

# Re-exported so callers import the package, not its modules.
__all__ = ["ApiError", "Body", "KubeClient", "WatchEvent"]
