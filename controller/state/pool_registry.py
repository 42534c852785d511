"""The pool registry: every CapacityPool as the API server last told it, and what the
planner may draw from each.

:class:`PoolRegistry` keeps the pools the model accepts, why it refuses the others, the
pools being deleted, those the provider refuses, each pool's last ``status``, and the caps
the cloud set on a pool's headroom (stock-outs, reservations); :meth:`PoolRegistry.states`
turns them, with the pools' nodes from the object store
(:class:`~controller.state.object_store.ObjectStore`), into the engine's pool states. Its
methods say what changed; :class:`controller.state.cache.ClusterState` turns that into
wake-ups. What it hands out is read-only (mapping views, frozensets, tuples).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from controller.api.capacitypool import CapacityPool
from controller.api.quantity import to_resources
from controller.common.topology_defaults import placeholder
from controller.fit.types import PoolState
from controller.inputs.node_labels import ZONE as ZONE_LABEL
from controller.inputs.snapshot import pool_state
from controller.state.object_store import Body, ObjectStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReservedCapacity:
    """One reservation (or block) a pool draws from, as the cloud last counted it."""

    zone: str
    """Its zone ("" when the cloud does not say): it caps only that zone's domains."""
    free: int
    reserved: int = 0
    """Its size (0: not known, taken as ``free``)."""
    start: datetime | None = None
    end: datetime | None = None


@dataclass(frozen=True, slots=True)
class PoolChange:
    """What storing one pool event changed."""

    spec: bool
    """Created, or its spec edited (a limit raised, a domain added): a waiting gang may
    fit. A status write changes nothing a plan sees."""
    model: bool
    """The pool the model accepts is new or different (requests waiting for it plan)."""
    deleting: bool
    """It started (or stopped) being deleted: its nodes stop (or start) being plannable."""


class PoolRegistry:
    """CapacityPools and the caps on their headroom. No I/O, no clock (``now`` is given)."""

    def __init__(self, objects: ObjectStore, levels: Sequence[str]) -> None:
        self._objects = objects
        self._levels = tuple(levels)
        self._pools: dict[str, CapacityPool] = {}
        self._specs: dict[str, Any] = {}
        """The spec of each pool last seen (status writes do not change what plans see)."""
        self._errors: dict[str, tuple[str, ...]] = {}
        """Every validation error of a pool the model refuses (by name)."""
        self._state_errors: dict[str, str] = {}
        """Pools the model accepts but the planner cannot use (a bad quantity)."""
        self._quantity_errors: dict[str, tuple[str, ...]] = {}
        """Every unreadable node-template amount of a pool the model accepts."""
        self._unusable: dict[str, tuple[str, ...]] = {}
        """Pools whose provider refuses their parameters: left out of planning (every
        acquisition through them would fail)."""
        self._status: dict[str, Body] = {}
        """Each pool's ``status`` as the API server holds it (for the status writer)."""
        self._deleting: set[str] = set()
        self._short: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, datetime]] = {}
        self._reservation: dict[str, tuple[tuple[ReservedCapacity, ...], int]] = {}
        """Pool -> (the reservations it draws from, its machines the cloud counted then)."""
        self._states: tuple[PoolState, ...] | None = None
        self.pools_changed = asyncio.Event()
        """Set on every pool event (the pool finalizer loop waits on it)."""

    # ------------------------------------------------------------------ pool events

    def clear(self) -> Mapping[str, tuple[str, ...]]:
        """Forget every pool (a relist follows); the validation errors known until now."""
        errors, self._errors = self._errors, {}
        self._pools.clear()
        self._status.clear()
        self._quantity_errors.clear()
        self._deleting.clear()
        self._states = None
        return errors

    def put(self, body: Body, *,
            known_errors: Mapping[str, tuple[str, ...]] | None = None) -> PoolChange:
        """Store the CapacityPool ``body`` (or why the model refuses it)."""
        name = str((body.get("metadata") or {}).get("name"))
        self._states = None
        self.pools_changed.set()
        self._status[name] = dict(body.get("status") or {})
        deleting = bool((body.get("metadata") or {}).get("deletionTimestamp"))
        deleting_changed = deleting != (name in self._deleting)
        if deleting_changed:
            self._deleting.symmetric_difference_update({name})
        spec = body.get("spec")
        spec_changed = self._specs.get(name) != spec or deleting
        if spec_changed:
            self._specs[name] = spec
        before = (known_errors or self._errors).get(name)
        quantities = _quantity_errors(body)
        old = self._pools.get(name)
        model_changed = False
        try:
            # A pool with unreadable amounts stays known (its nodes can still be released);
            # the planner leaves it out.
            self._pools[name] = pool = CapacityPool.model_validate(body)
            # Not on its status writes: only a new or changed pool can make a gang fit.
            model_changed = old is None or old.spec != pool.spec
            self._errors.pop(name, None)
            if quantities:
                self._quantity_errors[name] = quantities
            else:
                self._quantity_errors.pop(name, None)
        except ValidationError as exc:
            self._pools.pop(name, None)
            errors = (*_all_errors(exc), *quantities)
            self._errors[name] = errors
            # Once per change: every status write and finalizer patch brings the pool back.
            if errors != before:
                log.warning("ignoring invalid CapacityPool %s (%d problem(s)): %s", name,
                            len(errors), "; ".join(errors))
        return PoolChange(spec=spec_changed, model=model_changed, deleting=deleting_changed)

    def remove(self, name: str) -> bool:
        """Forget pool ``name``; whether it was being deleted (its nodes plannable again)."""
        self.pools_changed.set()
        self._specs.pop(name, None)
        self._pools.pop(name, None)
        self._errors.pop(name, None)
        self._state_errors.pop(name, None)
        self._quantity_errors.pop(name, None)
        self._unusable.pop(name, None)
        self._status.pop(name, None)
        self._states = None
        if name in self._deleting:
            self._deleting.discard(name)
            return True
        return False

    def nodes_changed(self) -> None:
        """A node came, went or changed its labels: pool headroom is counted again."""
        self._states = None

    # ------------------------------------------------------------------ queries

    def pools(self) -> Mapping[str, CapacityPool]:
        """Every pool the model accepts, by name (a read-only view)."""
        return MappingProxyType(self._pools)

    def pool(self, name: str) -> CapacityPool | None:
        return self._pools.get(name)

    def pool_errors(self, name: str) -> tuple[str, ...]:
        """Why Muster does not plan on pool ``name`` (empty: it does): every error."""
        if name in self._errors:
            return self._errors[name]
        if self._quantity_errors.get(name):
            return self._quantity_errors[name]
        found = self._state_errors.get(name)
        return (found,) if found else ()

    def set_unusable(self, name: str, problems: Sequence[str]) -> bool:
        """The provider refuses pool ``name``'s parameters (``problems``; empty: it accepts
        them): the planner leaves the pool out until they are fixed. Whether the pool just
        became usable again."""
        problems = tuple(problems)
        if self._unusable.get(name, ()) == problems:
            return False
        self._states = None
        if problems:
            self._unusable[name] = problems
            return False
        self._unusable.pop(name, None)
        return True

    def unusable_pools(self) -> Mapping[str, tuple[str, ...]]:
        """Pools the provider refuses (left out of planning), with its problems."""
        return MappingProxyType(self._unusable)

    def invalid_pools(self) -> Mapping[str, tuple[str, ...]]:
        """Pools the model refuses, with every error."""
        return MappingProxyType(self._errors)

    def pool_status(self, name: str) -> Body:
        """The pool's ``status`` as last seen from the API server (a copy)."""
        return dict(self._status.get(name, {}))

    def deleting(self, name: str) -> bool:
        """The pool has a deletionTimestamp: Muster adds no node to it, plans nothing new on
        its nodes, and releases them as their bookings and pods end (its finalizer keeps
        the object, and so the provider's settings, until then)."""
        return name in self._deleting

    def deleting_names(self) -> frozenset[str]:
        return frozenset(self._deleting)

    # ------------------------------------------------------------------ headroom

    def states(self, *, now: datetime | None, with_unusable: bool = False) -> tuple[
        PoolState, ...
    ]:
        """The engine's view of every plannable pool, its headroom capped by stock-outs and
        reservations as of ``now`` (None: uncapped). ``with_unusable``: also the pools the
        provider refuses, as they would be once fixed."""
        if self._states is None:
            states = []
            for name in sorted(self._pools):
                if (name in self._deleting or name in self._unusable
                        or self._quantity_errors.get(name)):
                    continue
                try:
                    # Only the pool's own nodes: pool_state counts them in one pass.
                    states.append(pool_state(self._pools[name], self._objects.pool_nodes(name),
                                             self._levels, in_flight=0))
                    self._state_errors.pop(name, None)
                except ValueError as exc:
                    # Rebuilt whenever a node comes or goes: say it once per change.
                    if self._state_errors.get(name) != str(exc):
                        log.warning("ignoring CapacityPool %s: %s", name, exc)
                    self._state_errors[name] = str(exc)
            self._states = tuple(states)
        pools = self._states
        if with_unusable:
            pools = tuple(sorted((*pools, *self._unusable_states()), key=lambda p: p.name))
        if now is not None:
            pools = self._capped(pools, now)
        return pools

    def _unusable_states(self) -> list[PoolState]:
        out = []
        for name in sorted(self._unusable):
            if (name not in self._pools or name in self._deleting
                    or self._quantity_errors.get(name)):
                continue
            with contextlib.suppress(ValueError):  # unreadable: no fix of parameters helps
                out.append(pool_state(self._pools[name], self._objects.pool_nodes(name),
                                      self._levels, in_flight=0))
        return out

    def mark_short(
        self, pool: str, domain: Mapping[str, str], *, available: int, until: datetime
    ) -> bool:
        """The provider ran out of stock in ``domain``: plan at most ``available`` new nodes
        there until ``until``, so retries look elsewhere instead of failing the same way.
        Whether it is remembered.

        A placeholder domain (a pool without declared domains) is no place: the cloud chose
        where it looked, and the next acquisition is a domain of its own again. Remembering
        it would leave such a pool nothing to plan, each retry failing without asking the
        cloud; the request's backoff is the only wait, as for any failed acquisition."""
        if any(placeholder(v) for v in domain.values()):
            return False
        self._short[(pool, tuple(sorted(domain.items())))] = (available, until)
        self._states = None
        return True

    def shortages(self, now: datetime) -> dict[str, list[tuple[dict[str, str], int, datetime]]]:
        """Pool -> (domain, nodes available, until) of each stock-out still in force."""
        out: dict[str, list[tuple[dict[str, str], int, datetime]]] = {}
        for (pool, domain), (available, until) in sorted(self._short.items()):
            if until > now:
                out.setdefault(pool, []).append((dict(domain), available, until))
        return out

    def set_reservation(
        self, pool: str, reserved: Sequence[ReservedCapacity] | None, *, held: int
    ) -> None:
        """Pool ``pool`` draws only from the reservations ``reserved`` (None: it names
        none), as the cloud counted them just now, when it ran ``held`` machines of the
        pool: plan at most their free instances there, per zone, and none outside a
        reservation's window, so a gang the reservation cannot hold whole is planned
        elsewhere instead of failing at the cloud.

        The cloud's ``free`` already counts the ``held`` instances; the ones registered
        since are subtracted (see :meth:`_apply_reservations`), so two gangs planned between
        reads cannot book the same reserved instances."""
        if reserved is None:
            if self._reservation.pop(pool, None) is not None:
                self._states = None
            return
        self._reservation[pool] = (tuple(reserved), held)
        self._states = None

    def _capped(self, states: tuple[PoolState, ...], now: datetime) -> tuple[PoolState, ...]:
        """Pools with their headroom capped by stock-outs and reservations (as of ``now``)."""
        if self._short:
            states = self._apply_shortages(states, now)
        if self._reservation:
            states = self._apply_reservations(states, now)
        return states

    def _apply_reservations(self, states: tuple[PoolState, ...], now: datetime) -> tuple[
        PoolState, ...
    ]:
        """Each reserved pool's new nodes capped at its reservations' free instances (those
        open at ``now``), a domain in a zone at what the zone's reservations hold; the pool
        marked ``reserved`` so the engine prefers it over on-demand capacity."""
        out = []
        for pool in states:
            held = self._reservation.get(pool.name)
            if held is None:
                out.append(pool)
                continue
            reserved, held_at_read = held
            # Nodes registered since the read were free in the cloud's figures: not any more.
            # (Nodes planned but not yet registered are the workspace's bookings.)
            since = held_at_read - self._objects.pool_node_count(pool.name)
            open_now = [r for r in reserved
                        if (r.start is None or r.start <= now) and (r.end is None or now < r.end)]
            cap = max(0, sum(r.free for r in open_now) + since)
            # What the pool could get were the reservations free and begun: the ones not
            # ended, whole, less the pool's own nodes in them.
            live = [r for r in reserved if r.end is None or now < r.end]
            ceiling = max(0, sum(max(r.reserved, r.free) for r in live)
                          - self._objects.pool_node_count(pool.name))
            busy = max(0, min(pool.max_new_nodes, ceiling) - min(pool.max_new_nodes, cap))
            by_zone: dict[str, int] = {}
            for r in open_now:
                if r.zone:
                    by_zone[r.zone] = by_zone.get(r.zone, 0) + r.free
            out.append(replace(
                pool, max_new_nodes=min(pool.max_new_nodes, cap), reserved=bool(open_now),
                reserved_busy=busy, open_seconds=_open_seconds(open_now, now),
                domains=tuple(replace(d, max_new_nodes=min(
                    d.max_new_nodes, _zone_cap(d.labels, cap, by_zone, since)))
                    for d in pool.domains),
            ))
        return tuple(out)

    def _apply_shortages(self, states: tuple[PoolState, ...], now: datetime) -> tuple[
        PoolState, ...
    ]:
        expired = [k for k, (_, until) in self._short.items() if until <= now]
        for k in expired:
            del self._short[k]
        if not self._short:
            return states
        out = []
        for pool in states:
            domains = tuple(
                replace(d, max_new_nodes=min(d.max_new_nodes, short[0]))
                if (short := self._short.get((pool.name, tuple(sorted(d.labels.items())))))
                else d
                for d in pool.domains
            )
            out.append(replace(pool, domains=domains))
        return tuple(out)


def _zone_cap(labels: Mapping[str, str], cap: int, by_zone: Mapping[str, int],
              since: int) -> int:
    """New nodes a domain may add from its pool's reservations: what those of its zone
    hold (none when they are all elsewhere), the whole ``cap`` when zones are not known."""
    zone = labels.get(ZONE_LABEL)
    if zone is None or not by_zone or placeholder(zone):
        # A placeholder zone is the cloud's to pick: the provider launches into the
        # reservation's own zone.
        return cap
    return min(cap, max(0, by_zone[zone] + since)) if zone in by_zone else 0


def _open_seconds(open_now: Sequence[ReservedCapacity], now: datetime) -> float | None:
    """How long the pool's open reservations still hold a run: until the last of them ends
    (a run fits one that outlives it); None when none is open or one has no end."""
    if not open_now or any(r.end is None for r in open_now):
        return None
    return max((r.end - now).total_seconds() for r in open_now if r.end is not None)


def _quantity_errors(body: Mapping[str, Any]) -> tuple[str, ...]:
    """Every node-template amount that is no Kubernetes quantity (the model keeps them as
    strings; the planner could not read them)."""
    template = ((body.get("spec") or {}).get("nodeTemplate") or {})
    out = []
    for part in ("allocatable", "capacity"):
        amounts = template.get(part)
        if not isinstance(amounts, Mapping):
            continue
        for res, value in amounts.items():
            try:
                to_resources({str(res): str(value)})
            except ValueError as exc:
                why = str(exc).removeprefix(f"{res}: ")
                out.append(f"spec.nodeTemplate.{part}.{res}: {why}")
    return tuple(out)


def _all_errors(exc: ValidationError) -> tuple[str, ...]:
    return tuple(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
        for err in exc.errors()
    )
