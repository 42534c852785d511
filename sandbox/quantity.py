"""Kubernetes resource quantities ("500m", "2", "1Gi", "1e3") as integers in canonical units:
cpu in millicores, everything else in base units rounded up. The sandbox keeps its own parser
because it must not depend on the controller package."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(
    r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: Any, resource: str = "") -> int:
    """Parse ``value``; cpu comes back in millicores, other resources in base units."""
    text = str(value).strip()
    m = _QUANTITY.match(text)
    if not m:
        raise QuantityError(f"invalid quantity {value!r} for {resource or 'resource'}")
    try:
        number = Decimal(m.group(1)) * _SUFFIXES[m.group(2) or ""]
    except InvalidOperation as exc:
        raise QuantityError(f"invalid quantity {value!r}") from exc
    if resource == "cpu":
        number *= 1000
    return math.ceil(number)


def resource_map(values: Mapping[str, Any] | None) -> dict[str, int]:
    """A resources mapping (requests, allocatable ...) parsed to canonical integers."""
    return {k: parse_quantity(v, k) for k, v in (values or {}).items()}


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """Effective requests of a pod: max(sum of containers, largest init container) plus
    overhead, where a container's request defaults to its limit; plus one ``pods`` slot."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for k, v in _container_requests(c).items():
            total[k] = total.get(k, 0) + v
    for c in spec.get("initContainers") or []:
        for k, v in _container_requests(c).items():
            total[k] = max(total.get(k, 0), v)
    for k, v in resource_map(spec.get("overhead")).items():
        total[k] = total.get(k, 0) + v
    total["pods"] = 1
    return total


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    res = container.get("resources") or {}
    merged = {**resource_map(res.get("limits")), **resource_map(res.get("requests"))}
    return merged
