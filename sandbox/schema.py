"""Pruning of unknown fields by a CRD's structural schema, as the apiserver does on every write
to a custom resource: fields the openAPIV3Schema does not declare are dropped silently unless
``x-kubernetes-preserve-unknown-fields: true`` (or ``additionalProperties``) keeps them.

This reproduces a real pitfall: a field a controller writes into the status of a CRD it does
not own (``status.<anything>`` of a ProvisioningRequest) is silently dropped by its strict
schema. ``metadata`` is kept whole (the apiserver prunes it to ObjectMeta fields, which
clients cannot tell apart). No validation (types, enums, CEL) is done.
"""

from __future__ import annotations

from typing import Any

_ALWAYS_KEPT = ("apiVersion", "kind", "metadata")


def prune(value: Any, schema: dict[str, Any] | None, *, root: bool = False) -> Any:
    """``value`` with undeclared fields removed (``value`` itself is not modified)."""
    if schema is None:
        return value
    if isinstance(value, list):
        items = schema.get("items")
        if not isinstance(items, dict):
            return value
        return [prune(v, items) for v in value]
    if not isinstance(value, dict):
        return value
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    extra = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    embedded = root or schema.get("x-kubernetes-embedded-resource") is True
    out: dict[str, Any] = {}
    for key, child in value.items():
        if embedded and key in _ALWAYS_KEPT:
            out[key] = child
        elif key in props:
            out[key] = prune(child, props[key] if isinstance(props[key], dict) else None)
        elif isinstance(extra, dict):
            out[key] = prune(child, extra)
        elif extra is True or preserve:
            out[key] = child
    return out
