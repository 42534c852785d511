"""Host ports as resources, so the engine honours the scheduler's NodePorts filter with the
machinery it already has for capacity (classes, booking, explanations).

A container port with a ``hostPort`` claims (protocol, hostIP, port) on its node. Two claims
conflict (the scheduler's ``HostPortInfo.CheckConflict``) when protocol and port agree and
either host IP is the wildcard (empty or ``0.0.0.0``) or both IPs are equal. That is exactly
what two synthetic resources per (protocol, port) give:

* ``~hostport/<proto>/<port>``: every node has :data:`WILDCARD_SHARE` of it; a wildcard claim
  takes all of it, a claim on one IP takes 1;
* ``~hostport/<proto>/<ip>/<port>``: every node has 1 of it; a claim on that IP takes it.

So a wildcard claim conflicts with any other claim of the port, two claims on one IP
conflict, and claims on different IPs do not. A node lists none of these resources: an
unlisted one is free in full (:func:`unlisted`), and bound pods' claims are subtracted like
their requests. Names start with ``~``, which no Kubernetes resource name contains.
"""

from __future__ import annotations

from collections.abc import Iterable

PREFIX = "~hostport/"
WILDCARD_SHARE = 1 << 20
"""More claims on distinct IPs of one port than any node holds."""
WILDCARD_IPS = frozenset({"", "0.0.0.0"})

HostPort = tuple[str, str, int]
"""(protocol, host IP, host port) with the API server's defaults applied (TCP, "")."""


def port_resources(ports: Iterable[HostPort]) -> dict[str, int]:
    """The synthetic resources one pod claiming ``ports`` requests."""
    out: dict[str, int] = {}
    for protocol, ip, port in ports:
        shared = f"{PREFIX}{protocol}/{port}"
        if ip in WILDCARD_IPS:
            out[shared] = out.get(shared, 0) + WILDCARD_SHARE
        else:
            out[shared] = out.get(shared, 0) + 1
            own = f"{PREFIX}{protocol}/{ip}/{port}"
            out[own] = out.get(own, 0) + 1
    return out


def is_port(resource: str) -> bool:
    return resource.startswith(PREFIX)


def unlisted(resource: str) -> int:
    """What a node has of ``resource`` when it does not list it: 0 for a real resource, all
    of a host-port resource."""
    if not resource.startswith(PREFIX):
        return 0
    return WILDCARD_SHARE if resource.count("/") == 2 else 1


def describe(resource: str) -> str:
    """``~hostport/TCP/8080`` as ``host port TCP/8080``."""
    return "host port " + resource[len(PREFIX):]
