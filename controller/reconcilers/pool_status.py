"""The CapacityPool status writer: thin, at a bounded rate, only what changed.

Every ``pool_status.interval_seconds`` it builds each pool's status from the cache
(:func:`controller.state.pool_figures.pool_status`, pure) and writes those that differ from
what the API server holds, through the ``status`` subresource. Nothing here runs per node
heartbeat or per watch event: a heartbeat that changes nothing the status shows costs no
write, and a busy cluster costs at most one write per pool per interval, capped at
``pool_status.max_writes_per_second`` overall (pools beyond the cap wait for the next
interval, the longest-waiting first). Worst case: ``min(pools / interval_seconds,
max_writes_per_second)`` writes per second.

The provider's parameters are validated (:meth:`Provider.validate`, local only) once per
pool generation, so ``Valid`` lists them with the model's errors, and a pool the provider
refuses is left out of planning (:meth:`ClusterState.set_pool_unusable`) from the next pass
on: every acquisition through it would fail.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Any

from controller.acquire.providers import ProviderSet
from controller.api.capacitypool import CapacityPool
from controller.api.dra import DeviceClaim
from controller.common.clock import Clock
from controller.common.conditions import rfc3339
from controller.common.metrics import ControllerMetrics
from controller.config import PoolStatusConfig
from controller.fit.dra_types import ClaimShape
from controller.inputs.dra_snapshot import DraCatalog, claim_shape
from controller.kube import ApiError, Body, KubeClient
from controller.kube.resources import CAPACITY_POOLS
from controller.runtime.problems import ProblemLog, describe, transient
from controller.state.cache import ClusterState
from controller.state.pool_figures import PoolFacts, Shortage, pool_status
from controller.state.pool_registry import ReservedCapacity
from providers.base import ProviderError

log = logging.getLogger(__name__)
_problems = ProblemLog(log)


class PoolStatusWriter:
    def __init__(
        self,
        *,
        kube: KubeClient,
        state: ClusterState,
        providers: ProviderSet,
        config: PoolStatusConfig,
        clock: Clock,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.kube = kube
        self.state = state
        self.providers = providers
        self.config = config
        self.clock = clock
        self.metrics = metrics
        self._validated: dict[str, tuple[int | None, tuple[str, ...]]] = {}
        """Pool -> (generation validated, the provider's errors for it)."""
        self._waiting_since: dict[str, float] = {}
        """Pools with a change not written yet -> monotonic pass number it was first seen."""
        self._passes = 0
        self.writes = 0
        self._reservations: dict[str, tuple[float, list[Body]]] = {}
        """Pool -> (clock time of the last read, its reservations' status rows)."""

    @property
    def budget(self) -> int:
        """Writes allowed per pass."""
        return max(1, math.floor(self.config.max_writes_per_second
                                 * self.config.interval_seconds))

    async def run(self) -> None:
        while True:
            await self.clock.sleep(self.config.interval_seconds)
            try:
                await self.write_changed()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not transient(exc):
                    log.exception("writing CapacityPool status failed; trying again next "
                                  "interval")
                    continue
                # An API server restarting: no traceback, said once per interval.
                _problems.warning("pool status", "writing CapacityPool status failed (%s); "
                                  "trying again next interval", describe(exc))
                continue
            _problems.resolved("pool status", "writing CapacityPool status works again")

    async def desired(self) -> dict[str, Body]:
        """Every pool's status as it should read now."""
        now = self.clock.now()
        # A copy: the watch may change it while we await.
        pools = dict(self.state.pool_registry.pools())
        for pool in pools.values():  # first: an unusable pool leaves the snapshot
            self.state.set_pool_unusable(pool.metadata.name, await self._provider_errors(pool))
        snap = self.state.snapshot(now=now)
        by_pool = {p.name: p for p in snap.pools}
        booked = self.state.booked_nodes()
        shortages = self.state.pool_registry.shortages(now)
        classes = one_device_claims(self.state.dra.catalog())
        out: dict[str, Body] = {}
        self.providers.forget(set(pools) | set(self.state.pool_registry.invalid_pools()))
        for name, pool in pools.items():
            errors = (*self.state.pool_registry.pool_errors(name),
                      *await self._provider_errors(pool))
            nodes = [n for n in snap.nodes if n.pool == name]
            facts = PoolFacts(
                name=name, pool=pool, errors=errors, state=by_pool.get(name), nodes=nodes,
                ready=frozenset(n.name for n in nodes if self.state.objects.node_ready(n.name)),
                booked=booked,
                shortages=[Shortage(d, a, u) for d, a, u in shortages.get(name, [])],
                provider=self.providers.health.get(name), levels=self.state.levels,
                device_classes=classes,
                previous=self.state.pool_registry.pool_status(name).get("conditions") or [],
                generation=pool.metadata.generation,
                reservations=await self._reservation_rows(pool, errors),
            )
            out[name] = pool_status(facts, now)
        for name, errors in self.state.pool_registry.invalid_pools().items():
            facts = PoolFacts(name=name, pool=None, errors=errors, levels=self.state.levels,
                              previous=self.state.pool_registry.pool_status(name).get(
                                  "conditions") or [])
            out[name] = pool_status(facts, now)
        return out

    async def _reservation_rows(self, pool: CapacityPool, errors: Any) -> list[Body]:
        """The cloud's figures of the reservations the pool names, read at most every
        ``reservation_refresh_seconds`` per pool; the last rows stay when a read fails (the
        figures are a view, and ``observedAt`` says how old they are)."""
        name = pool.metadata.name
        held = self._reservations.get(name)
        now = self.clock.now().timestamp()
        if errors or (held is not None
                      and now - held[0] < self.config.reservation_refresh_seconds):
            return held[1] if held is not None else []
        try:
            provider = self.providers.for_pool(pool)
        except ProviderError:
            return []
        read = getattr(provider, "reservations", None)
        if read is None:
            return []
        try:
            figures = await read(pool)
        except ProviderError as exc:
            _problems.warning(f"reservations {name}", "pool %s: reservation figures not "
                              "read (%s); showing the last ones", name, exc)
            self._reservations[name] = (now, held[1] if held is not None else [])
            return self._reservations[name][1]
        _problems.resolved(f"reservations {name}", f"pool {name}: reservation figures read")
        observed = rfc3339(self.clock.now())
        rows: list[Body] = []
        for f in figures:
            row: Body = {"id": f.id, "zone": f.zone, "reserved": f.reserved, "used": f.used,
                         "free": f.free, "state": f.state, "observedAt": observed}
            if f.start is not None:
                row["start"] = rfc3339(f.start)
            if f.end is not None:
                row["end"] = rfc3339(f.end)
            rows.append(row)
        self._reservations[name] = (now, rows)
        # The free instances bound what is planned into the pool, per zone.
        self.state.set_pool_reservation(name, [
            ReservedCapacity(zone=f.zone, free=f.free, reserved=f.reserved, start=f.start,
                             end=f.end)
            for f in figures] if figures else None)
        return rows

    async def _provider_errors(self, pool: CapacityPool) -> tuple[str, ...]:
        name, generation = pool.metadata.name, pool.metadata.generation
        held = self._validated.get(name)
        if held is not None and held[0] == generation:
            return held[1]
        errors: tuple[str, ...] = ()
        try:
            provider = self.providers.for_pool(pool)
        except ProviderError as exc:
            errors = (f"spec.provider: {exc}",)
        else:
            try:
                await provider.validate(pool)
            except ProviderError as exc:
                errors = (f"spec.parameters: {exc}",)
        self._validated[name] = (generation, errors)
        return errors

    async def write_changed(self) -> int:
        """Write the statuses that changed, within the budget; return how many."""
        self._passes += 1
        wanted = await self.desired()
        for name in [n for n in self._validated if n not in wanted]:
            del self._validated[name]
        for name in [n for n in self._reservations if n not in wanted]:
            del self._reservations[name]
            self.state.set_pool_reservation(name, None)
        changed = [n for n, status in wanted.items()
                   if _canonical(status) != _canonical(self.state.pool_registry.pool_status(n))]
        for name in [n for n in self._waiting_since if n not in changed]:
            del self._waiting_since[name]
        for name in changed:
            self._waiting_since.setdefault(name, self._passes)
        order = sorted(changed, key=lambda n: (self._waiting_since[n], n))
        written = 0
        for name in order[: self.budget]:
            current = self.state.pool_registry.pool_status(name)
            try:
                body = await self.kube.merge_patch(
                    CAPACITY_POOLS, name, {"status": merge_patch(current, wanted[name])},
                    subresource="status",
                )
            except ApiError as exc:
                self._count("conflict" if exc.conflict or exc.not_found else "error")
                if exc.not_found or exc.conflict:
                    continue  # gone or changing: the watch brings the news
                raise
            self._count("written")
            written += 1
            self._waiting_since.pop(name, None)
            if body.get("metadata"):
                self.state.upsert_pool(body)
        self.writes += written
        return written

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.pool_status_writes.labels(result).inc()


def one_device_claims(catalog: DraCatalog) -> dict[str, ClaimShape]:
    """Per DeviceClass of the cluster, a claim of exactly one device of it."""
    out = {}
    for name in sorted(catalog.classes):
        claim = DeviceClaim.model_validate(
            {"requests": [{"name": "one", "exactly": {"deviceClassName": name}}]})
        shape = claim_shape(f"one-{name}", "CapacityPool status", claim, catalog)
        if shape.error is None:
            out[name] = shape
    return out


def merge_patch(current: Any, desired: Any) -> Any:
    """A JSON merge patch turning ``current`` into ``desired``: keys gone become null (a
    merge patch keeps keys it does not name), lists are replaced whole."""
    if not isinstance(desired, dict) or not isinstance(current, dict):
        return desired
    out: dict[str, Any] = {k: None for k in current if k not in desired}
    for key, value in desired.items():
        if key in current and isinstance(value, dict) and isinstance(current[key], dict):
            out[key] = merge_patch(current[key], value)
        else:
            out[key] = value
    return out


def _canonical(status: Any) -> str:
    return json.dumps(status, sort_keys=True, separators=(",", ":"))
