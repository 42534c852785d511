"""Muster's in-process Kubernetes API sandbox: an aiohttp server on loopback with the
semantics controllers depend on (resourceVersions, conflicts, watches, finalizers, GC, CRDs),
plus a tiny scheduler. Used by the tests, the e2e suite and ``muster demo``."""

from sandbox.errors import ApiError
from sandbox.faults import Faults
from sandbox.resources import ResourceType
from sandbox.server import SandboxServer
from sandbox.store import Store

__all__ = ["ApiError", "Faults", "ResourceType", "SandboxServer", "Store"]
