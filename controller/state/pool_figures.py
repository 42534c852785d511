"""What a CapacityPool's status says, computed from the planner's own view: a pure function.

:func:`pool_status` turns the pieces the controller already holds (the pool, its
:class:`PoolState` and nodes from the snapshot the planner plans against, with every booking
subtracted and stock-outs applied; which nodes are Ready and booked; the pool's validation
errors and its provider's last answer) into the ``status`` object written on the pool. No
I/O and no clock: ``now`` is given, so the writer
(:mod:`controller.reconcilers.pool_status`) stays thin and the figures are testable alone.
Whatever the status says is what the planner would use: ``provisionableNodes`` is the
domain's ``max_new_nodes`` in the planning snapshot, ``free`` its nodes' free capacity there.
The fields are described in docs/reference/capacitypool-status.md.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controller.api.capacitypool import CapacityPool
from controller.common.conditions import rfc3339
from controller.fit.devices import ClaimFitter
from controller.fit.dra_types import ClaimShape, NodeDevices
from controller.fit.types import NodeState, PoolDomain, PoolState

VALID = "Valid"
PROVIDER_READY = "ProviderReady"
STOCK_OUT = "StockOut"
CONDITION_TYPES = (VALID, PROVIDER_READY, STOCK_OUT)

_BASIC = frozenset({"cpu", "memory", "pods", "ephemeral-storage"})
MAX_ERRORS_SHOWN = 20
"""Validation errors listed in the Valid message (the count says how many more)."""


@dataclass(frozen=True, slots=True)
class ProviderHealth:
    """The provider's last answer for one pool: ``error`` None when it succeeded."""

    provider: str
    call: str
    """acquire, release, list or validate."""
    error: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Shortage:
    """The provider ran out of stock in ``domain``: at most ``available`` new nodes until
    ``until`` (what :meth:`ClusterState.mark_short` recorded)."""

    domain: Mapping[str, str]
    available: int
    until: datetime


@dataclass(frozen=True, slots=True)
class PoolFacts:
    """Everything :func:`pool_status` reads about one pool."""

    name: str
    pool: CapacityPool | None
    """None when the object is not a valid CapacityPool (``errors`` say why)."""
    errors: Sequence[str] = ()
    """Every validation problem: the model's, quantities', the provider's parameters'."""
    state: PoolState | None = None
    """The pool as the planner sees it (bookings subtracted, stock-outs applied); None when
    the pool is being deleted or unusable."""
    nodes: Sequence[NodeState] = ()
    """The pool's nodes from the same snapshot."""
    ready: Collection[str] = frozenset()
    """Names of nodes that are Ready (pods can be placed on them now)."""
    booked: Collection[str] = frozenset()
    """Names of nodes some live booking counts on."""
    shortages: Sequence[Shortage] = ()
    provider: ProviderHealth | None = None
    levels: Sequence[str] = ()
    device_classes: Mapping[str, ClaimShape] = field(default_factory=dict)
    """Per DeviceClass, a claim of one device of it (what "a free device of the class"
    means, selectors included): counted on nodes when the template's devices can satisfy
    it."""
    previous: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    """The conditions on the pool now (lastTransitionTime moves only on a status flip)."""
    generation: int | None = None
    reservations: Sequence[Mapping[str, Any]] = ()
    """The reservations the pool names, as the cloud last reported them (status JSON)."""


def pool_status(facts: PoolFacts, now: datetime) -> dict[str, Any]:
    """The pool's ``status`` (camelCase JSON, as written). Deterministic in its inputs."""
    conditions = _conditions(facts, now)
    if facts.pool is None:
        return {"conditions": conditions}
    pool = facts.pool
    template = _template(facts)
    nodes = [n for n in facts.nodes if n.pool == facts.name]
    rows = _domain_rows(facts, template, nodes)
    total_free: dict[str, int] = {}
    for row in rows:
        for res, amount in row["_free"].items():
            total_free[res] = total_free.get(res, 0) + amount
    status: dict[str, Any] = {
        "nodes": len(nodes),
        "readyNodes": sum(1 for n in nodes if n.name in facts.ready),
        "bookedNodes": sum(1 for n in nodes if n.name in facts.booked),
        "inFlightNodes": facts.state.booked_nodes if facts.state is not None else 0,
        "provisionableNodes": facts.state.max_new_nodes if facts.state is not None else 0,
        "availableNodes": sum(r["availableNodes"] for r in rows),
        "freeGPUs": sum(v for r, v in total_free.items() if r.endswith("/gpu")),
        "free": {r: format_quantity(r, v) for r, v in sorted(total_free.items())},
        "domains": [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows],
        "conditions": conditions,
    }
    if facts.reservations:
        status["reservations"] = [dict(r) for r in facts.reservations]
    topo = pool.spec.topology
    if topo is not None and topo.domains:
        # Stock-outs cap domains, not the pool: the pool adds at most what its domains can.
        status["provisionableNodes"] = min(
            status["provisionableNodes"], sum(r["provisionableNodes"] for r in rows))
    return status


# ---------------------------------------------------------------------------- domains


def _template(facts: PoolFacts) -> Mapping[str, int]:
    if facts.state is not None:
        return {r: v for r, v in facts.state.allocatable.items() if r != "pods"}
    return {}


def domain_name(labels: Mapping[str, str], levels: Sequence[str]) -> str:
    """A domain's level values, widest first (``b1/b1-r2``); ``-`` without any."""
    values = [labels[lv] for lv in levels if lv in labels]
    values += [v for k, v in sorted(labels.items()) if k not in levels]
    return "/".join(values) or "-"


def _in(labels: Mapping[str, str], domain: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in domain.items())


def _key_resources(template: Mapping[str, int]) -> list[str]:
    """What makes a node "free" for the template: its accelerators and other special
    resources when it has any (a daemonset's few millicores do not make a GPU node busy),
    else cpu and memory."""
    special = [r for r, v in template.items() if r not in _BASIC and v > 0]
    if special:
        return sorted(special)
    return [r for r in ("cpu", "memory") if template.get(r, 0) > 0]


def _domain_rows(
    facts: PoolFacts, template: Mapping[str, int], nodes: Sequence[NodeState]
) -> list[dict[str, Any]]:
    pool = facts.pool
    assert pool is not None
    topo = pool.spec.topology
    state = facts.state
    declared: list[tuple[dict[str, str], PoolDomain | None, int | None]] = []
    fresh = topo is not None and not topo.domains
    if topo is None:
        declared.append(({}, state.domains[0] if state and state.domains else None, None))
    elif topo.domains:
        by_labels = {tuple(sorted(d.labels.items())): d for d in (state.domains if state else ())}
        for spec in topo.domains:
            labels = dict(spec.labels)
            limit = spec.max_nodes if spec.max_nodes is not None else topo.max_nodes_per_domain
            declared.append((labels, by_labels.get(tuple(sorted(labels.items()))), limit))
    else:
        # Every acquisition makes a fresh domain: the ones that exist are where nodes are.
        upto = list(facts.levels[: facts.levels.index(topo.level) + 1]) \
            if topo.level in facts.levels else [topo.level]
        seen: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        for n in nodes:
            labels = {lv: n.labels[lv] for lv in upto if lv in n.labels}
            seen.setdefault(tuple(sorted(labels.items())), labels)
        for _, labels in sorted(seen.items()):
            declared.append((labels, None, topo.max_nodes_per_domain))
    keys = _key_resources(template)
    classes = _template_classes(facts)
    short = {tuple(sorted(s.domain.items())): s for s in facts.shortages}
    rows = []
    placed: set[str] = set()
    for labels, domain, cap in declared:
        mine = [n for n in nodes if n.name not in placed and _in(n.labels, labels)]
        placed.update(n.name for n in mine)
        row = _row(facts, labels, domain, cap, mine, template, keys,
                   short.get(tuple(sorted(labels.items()))))
        if classes:
            row["freeDevices"] = _free_devices(classes, mine, facts.ready)
        rows.append(row)
    if fresh and state is not None:
        row = _row(facts, {}, None, topo.max_nodes_per_domain if topo else None, [], template,
                   keys, None)
        row["name"] = "new"
        row["provisionableNodes"] = state.max_new_nodes
        row["inFlightNodes"] = state.booked_nodes
        row["provisionable"] = _times(template, state.max_new_nodes)
        row["availableNodes"] = state.max_new_nodes
        rows.append(row)
    return rows


def _row(
    facts: PoolFacts,
    labels: Mapping[str, str],
    domain: PoolDomain | None,
    limit: int | None,
    nodes: Sequence[NodeState],
    template: Mapping[str, int],
    keys: Sequence[str],
    shortage: Shortage | None,
) -> dict[str, Any]:
    ready = [n for n in nodes if n.name in facts.ready and n.schedulable]
    free: dict[str, int] = {}
    for n in ready:
        for res in template:
            free[res] = free.get(res, 0) + max(0, n.free.get(res, 0))
    whole = sum(1 for n in ready if keys and all(n.free.get(r, 0) >= template[r] for r in keys))
    provisionable = domain.max_new_nodes if domain is not None else 0
    row: dict[str, Any] = {
        "name": domain_name(labels, facts.levels),
        "labels": dict(labels),
        "nodes": len(nodes),
        "readyNodes": len(ready),
        "bookedNodes": sum(1 for n in nodes if n.name in facts.booked),
        "inFlightNodes": domain.booked_nodes if domain is not None else 0,
        "free": {r: format_quantity(r, v) for r, v in sorted(free.items())},
        "freeNodes": whole,
        "provisionableNodes": provisionable,
        "provisionable": _times(template, provisionable),
        "availableNodes": whole + provisionable,
        "_free": free,
    }
    if limit is not None:
        row["maxNodes"] = limit
    if shortage is not None:
        row["stockOutUntil"] = rfc3339(shortage.until)
        row["stockOutNodes"] = shortage.available
    return row


def _template_classes(facts: PoolFacts) -> dict[str, ClaimFitter]:
    """The DeviceClasses one device of which the pool's node template offers."""
    devices = facts.state.devices if facts.state is not None else None
    if devices is None:
        return {}
    out = {}
    for name, shape in sorted(facts.device_classes.items()):
        fitter = ClaimFitter((shape,))
        if fitter.run(devices, 1).pods:
            out[name] = fitter
    return out


def _device_count(devices: NodeDevices) -> int:
    return len(devices.shape.inventory.devices)


def _free_devices(
    classes: Mapping[str, ClaimFitter], nodes: Sequence[NodeState], ready: Collection[str]
) -> dict[str, int]:
    """Devices of each class still allocatable on the Ready nodes (bookings subtracted:
    the snapshot's device state carries them)."""
    out = {}
    for name, fitter in classes.items():
        total = 0
        for n in nodes:
            if n.devices is None or n.name not in ready or not n.schedulable:
                continue
            limit = _device_count(n.devices)
            total += min(limit, len(fitter.run(n.devices, limit).pods))
        out[name] = total
    return out


def _times(template: Mapping[str, int], count: int) -> dict[str, str]:
    if count <= 0:
        return {}
    return {r: format_quantity(r, v * count) for r, v in sorted(template.items())}


def format_quantity(resource: str, amount: int) -> str:
    """A canonical amount (cpu in millicores, the rest in base units) as a quantity."""
    if resource == "cpu":
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if amount >= size and amount % size == 0:
                return f"{amount // size}{unit}"
    return str(amount)


# ---------------------------------------------------------------------------- conditions


def _conditions(facts: PoolFacts, now: datetime) -> list[dict[str, Any]]:
    wanted = [_valid(facts), _provider_ready(facts), _stock_out(facts)]
    before = {c.get("type"): c for c in facts.previous}
    out = []
    for type_, status, reason, text in wanted:
        old = before.get(type_)
        keep = old is not None and old.get("status") == status
        cond: dict[str, Any] = {
            "type": type_, "status": status, "reason": reason, "message": text[:32768],
            "lastTransitionTime": (old or {}).get("lastTransitionTime") if keep
            else rfc3339(now),
        }
        if facts.generation is not None:
            cond["observedGeneration"] = facts.generation
        out.append(cond)
    return out


def _valid(facts: PoolFacts) -> tuple[str, str, str, str]:
    if not facts.errors:
        return (VALID, "True", "Valid", "The pool is valid; Muster plans on it.")
    shown = "; ".join(facts.errors[:MAX_ERRORS_SHOWN])
    more = len(facts.errors) - MAX_ERRORS_SHOWN
    tail = f"; and {more} more" if more > 0 else ""
    return (VALID, "False", "Invalid",
            f"{len(facts.errors)} problem(s), Muster does not plan on this pool until they "
            f"are fixed: {shown}{tail}")


def _provider_ready(facts: PoolFacts) -> tuple[str, str, str, str]:
    if facts.pool is None:
        return (PROVIDER_READY, "Unknown", "PoolInvalid", "The pool is invalid; its provider "
                "is not called.")
    health = facts.provider
    if health is None:
        return (PROVIDER_READY, "Unknown", "NotCalledYet",
                f"Muster has not called the {facts.pool.spec.provider} provider for this "
                "pool yet.")
    if health.error is None:
        return (PROVIDER_READY, "True", "ProviderAnswered",
                f"The {health.provider} provider answered Muster's last call.")
    return (PROVIDER_READY, "False", health.reason or "ProviderError",
            f"The {health.provider} provider failed Muster's last call ({health.call}): "
            f"{health.error}")


def _stock_out(facts: PoolFacts) -> tuple[str, str, str, str]:
    if not facts.shortages:
        return (STOCK_OUT, "False", "InStock",
                "No domain of this pool is short of stock as far as Muster knows.")
    parts = [
        f"{domain_name(s.domain, facts.levels)} (at most {s.available} new node(s) until "
        f"{rfc3339(s.until)})"
        for s in sorted(facts.shortages, key=lambda s: (s.until, sorted(s.domain.items())))
    ]
    return (STOCK_OUT, "True", "StockOut",
            f"The provider ran out of stock in {len(parts)} domain(s); Muster plans around "
            f"them until then: {', '.join(parts)}.")
