"""The watch-fed cache of DRA objects (resource.k8s.io/v1) the planner needs.

ResourceSlices, ResourceClaims, DeviceClasses and ResourceClaimTemplates are kept as parsed
models keyed like every other cached object; the :class:`DraCatalog` and the per-node device
inventory built from them are cached until one of them changes, so a planning pass costs a
dictionary lookup when nothing changed. No I/O (fed by :mod:`controller.state.feeds`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ValidationError

from controller.api.capacitypool import CapacityPool
from controller.api.dra import DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice
from controller.fit.dra_types import NodeDevices
from controller.fit.types import NodeState, PoolState
from controller.inputs.dra_snapshot import (
    DraCatalog,
    DraError,
    Interner,
    node_devices,
    template_devices,
)

log = logging.getLogger(__name__)

Body = dict[str, Any]
KINDS: dict[str, type[BaseModel]] = {
    "resourceslices": ResourceSlice,
    "resourceclaims": ResourceClaim,
    "deviceclasses": DeviceClass,
    "resourceclaimtemplates": ResourceClaimTemplate,
}

KIND_NAMES = {
    "resourceslices": "ResourceSlice",
    "resourceclaims": "ResourceClaim",
    "deviceclasses": "DeviceClass",
    "resourceclaimtemplates": "ResourceClaimTemplate",
}
"""Plural -> kind, as claims name what they miss (``ClaimShape.missing``)."""


def _key(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class DraState:
    def __init__(self, on_event: Callable[[str], None] | None = None) -> None:
        self._on_event = on_event or (lambda wanted: None)
        """Told ``Kind key`` of every object that arrives or changes (requests waiting for
        it are planned again)."""
        self._objects: dict[str, dict[str, BaseModel]] = {kind: {} for kind in KINDS}
        self._catalog: DraCatalog | None = None
        self._devices: dict[str, NodeDevices] | None = None
        self._nodes_in: tuple[NodeState, ...] | None = None
        self._nodes_out: tuple[NodeState, ...] | None = None
        self._interner = Interner()
        """Shares equal pool-template inventories between passes (one search per kind)."""
        self.version = 0
        self.synced: dict[str, asyncio.Event] = {kind: asyncio.Event() for kind in KINDS}
        """Set once a kind was listed (or found not served): until then a claim template
        may only seem missing."""

    def replace(self, kind: str, items: Iterable[Body]) -> None:
        self._objects[kind] = {}
        for item in items:
            self.upsert(kind, item)
        self._changed()
        self.synced[kind].set()

    def upsert(self, kind: str, body: Body) -> None:
        try:
            obj = KINDS[kind].model_validate(body)
        except ValidationError as exc:
            log.warning("ignoring %s %s: %s", kind, _key(body), exc.errors()[0]["msg"])
            self._objects[kind].pop(_key(body), None)
        else:
            self._objects[kind][_key(body)] = obj
        self._changed()
        # Even one that does not parse: the waiting request then fails naming it, at once.
        self._on_event(f"{KIND_NAMES[kind]} {_key(body)}")

    def delete(self, kind: str, key: str) -> None:
        if self._objects[kind].pop(key, None) is not None:
            self._changed()

    def _changed(self) -> None:
        self.version += 1
        self._catalog = None
        self._devices = None
        self._nodes_out = None

    def catalog(self) -> DraCatalog:
        if self._catalog is None:
            self._catalog = DraCatalog.of(
                [o for o in self._objects["resourceslices"].values()
                 if isinstance(o, ResourceSlice)],
                [o for o in self._objects["deviceclasses"].values()
                 if isinstance(o, DeviceClass)],
                [o for o in self._objects["resourceclaims"].values()
                 if isinstance(o, ResourceClaim)],
                [o for o in self._objects["resourceclaimtemplates"].values()
                 if isinstance(o, ResourceClaimTemplate)],
            )
        return self._catalog

    def attach(
        self,
        nodes: tuple[NodeState, ...],
        pool_states: tuple[PoolState, ...],
        pools: Sequence[CapacityPool],
    ) -> tuple[tuple[NodeState, ...], tuple[PoolState, ...]]:
        """Node and pool states with their devices. The per-node inventories are rebuilt
        only when a DRA object changed; attaching them is one pass over the nodes, itself
        memoised on the node tuple."""
        templates = {p.metadata.name: p.spec.node_template.resource_slices for p in pools}
        catalog = self.catalog()
        if not catalog.slices and not any(templates.values()):
            return nodes, pool_states
        try:
            if self._devices is None:
                self._devices = node_devices(catalog.slices, catalog.claims.values())
            if self._nodes_in is not nodes or self._nodes_out is None:
                by_node = self._devices
                self._nodes_out = tuple(
                    replace(n, devices=by_node[n.name]) if n.name in by_node else n
                    for n in nodes
                )
                self._nodes_in = nodes
            interner = self._interner
            out_pools = tuple(
                replace(p, devices=template_devices(p.name, templates[p.name], interner))
                if templates.get(p.name) else p
                for p in pool_states
            )
        except DraError as exc:
            log.warning("ignoring DRA devices: %s", exc)
            return nodes, pool_states
        return self._nodes_out, out_pools
